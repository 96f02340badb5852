"""One matched case: the options, the statistics on raw samples, and the verdict."""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kdabench.stats import bootstrap_ratio_ci, mann_whitney_p, median

#: Case verdicts, most severe first (the order tables are sorted in).
VERDICTS = ("failed", "regressed", "improved", "new", "missing", "unchanged")
REGRESSIONS = frozenset({"failed", "regressed"})


class CompareError(ValueError):
    """The inputs cannot be compared (unreadable, not receipts, refused, nothing in
    common); the message is one line for the user."""


# --------------------------------------------------------------------------- options


def parse_threshold(text: str | float) -> float:
    """A relative threshold from "5%" or "0.05" (both 0.05). Raises :class:`CompareError`
    for anything else, including a bare number of 1 or more ("5" is ambiguous)."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        stripped = text.strip()
        percent = stripped.endswith("%")
        try:
            value = float(stripped[:-1] if percent else stripped)
        except ValueError:
            raise CompareError(f"threshold {text!r} is not a number; write 5% or 0.05") from None
        if percent:
            value /= 100.0
        elif value >= 1:
            raise CompareError(f"threshold {text!r} is ambiguous; write {stripped}% or a fraction")
    if not (0 <= value < 1) or math.isnan(value):
        raise CompareError(f"threshold {text!r} must be at least 0% and below 100%")
    return value


@dataclass(frozen=True)
class CompareOptions:
    """How cases are judged: relative ``threshold`` on the ratio of medians, significance
    level ``alpha`` of the Mann-Whitney test, and the bootstrap (``resamples`` draws,
    ``confidence`` level, ``seed`` mixed with each case id)."""

    threshold: float = 0.05
    alpha: float = 0.01
    resamples: int = 2000
    confidence: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if not (0 <= self.threshold < 1):
            raise CompareError(f"threshold {self.threshold} must be in [0, 1)")
        if not (0 < self.alpha < 1):
            raise CompareError(f"alpha {self.alpha} must be between 0 and 1")
        if self.resamples < 1:
            raise CompareError("the bootstrap needs at least one resample")
        if not (0 < self.confidence < 1):
            raise CompareError(f"confidence {self.confidence} must be between 0 and 1")


# --------------------------------------------------------------------------- statistics


def finite_samples(case: Mapping[str, Any] | None) -> list[float]:
    """The case's ``samples_ms`` that are finite numbers (receipts store NaN as "nan")."""
    samples = case.get("samples_ms") if case else None
    if not isinstance(samples, list):
        return []
    return [float(s) for s in samples
            if isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s)]


def case_median(case: Mapping[str, Any] | None) -> float | None:
    """Median of the case's samples, else its ``median_ms``, else None."""
    samples = finite_samples(case)
    if samples:
        return median(samples)
    recorded = case.get("median_ms") if case else None
    if (isinstance(recorded, (int, float)) and not isinstance(recorded, bool)
            and math.isfinite(recorded)):
        return float(recorded)
    return None


# --------------------------------------------------------------------------- one case


@dataclass
class CaseComparison:
    """One case of BASE against the same case of HEAD (either may be absent)."""

    kind: str
    device: str                    # "NVIDIA H200", or "A -> B" when paired across devices
    id: str
    verdict: str                   # one of VERDICTS
    base_verdict: str | None       # correctness verdict in each receipt
    head_verdict: str | None
    base_median_ms: float | None
    head_median_ms: float | None
    ratio: float | None            # head / base median
    ci_low: float | None           # bootstrap interval of the ratio
    ci_high: float | None
    p_value: float | None          # Mann-Whitney, two-sided
    base_samples: int
    head_samples: int
    note: str = ""
    backend: str | None = None     # "triton", "triton -> cute" across backends, None: no backend

    @property
    def is_regression(self) -> bool:
        return self.verdict in REGRESSIONS

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "is_regression": self.is_regression}


def compare_case(
    base: Mapping[str, Any] | None, head: Mapping[str, Any] | None,
    options: CompareOptions = CompareOptions(), *, kind: str = "", device: str = "",
    backend: str | None = None,
) -> CaseComparison:
    """Compare one case dict of BASE with one of HEAD (None: absent on that side)."""
    case_id = str((base or head or {}).get("id"))
    base_samples, head_samples = finite_samples(base), finite_samples(head)
    base_median, head_median = case_median(base), case_median(head)
    ratio = head_median / base_median if (
        base_median is not None and head_median is not None and base_median > 0) else None
    p_value = mann_whitney_p(base_samples, head_samples)
    interval = bootstrap_ratio_ci(
        base_samples, head_samples, resamples=options.resamples,
        confidence=options.confidence, seed=[options.seed, zlib.crc32(case_id.encode())],
    )
    base_verdict = base.get("verdict") if base else None
    head_verdict = head.get("verdict") if head else None
    verdict, note = _judge(base, head, base_samples, head_samples, ratio, p_value, options)
    return CaseComparison(
        kind=kind, device=device, id=case_id, verdict=verdict,
        base_verdict=base_verdict, head_verdict=head_verdict,
        base_median_ms=base_median, head_median_ms=head_median, ratio=ratio,
        ci_low=interval[0] if interval else None, ci_high=interval[1] if interval else None,
        p_value=p_value, base_samples=len(base_samples), head_samples=len(head_samples),
        note=note, backend=backend,
    )


def _judge(base, head, base_samples, head_samples, ratio, p_value, options) -> tuple[str, str]:
    if base is None:
        return "new", "only in HEAD"
    if head is None:
        return "missing", "only in BASE"
    base_pass, head_pass = base.get("verdict") == "pass", head.get("verdict") == "pass"
    if base_pass and not head_pass:
        return "failed", f"correctness: pass -> {head.get('verdict')}"
    fixed = head_pass and not base_pass
    if ratio is None:
        if fixed:
            return "improved", f"correctness: {base.get('verdict')} -> pass"
        base_timed, head_timed = case_median(base) is not None, case_median(head) is not None
        if not (base_timed or head_timed):
            note = "correctness only (no timing)"
        elif base_timed and head_timed:
            note = "no ratio: BASE median is not positive"
        else:
            note = f"timing only in {'BASE' if base_timed else 'HEAD'}"
        if base.get("verdict") != head.get("verdict"):
            note = f"correctness: {base.get('verdict')} -> {head.get('verdict')}; {note}"
        return "unchanged", note
    slower, faster = ratio > 1 + options.threshold, ratio < 1 - options.threshold
    significant = p_value is not None and p_value < options.alpha
    if fixed:
        return "improved", f"correctness: {base.get('verdict')} -> pass"
    if slower and significant:
        return "regressed", f"{(ratio - 1) * 100:.1f}% slower"
    if faster and significant:
        return "improved", f"{(1 - ratio) * 100:.1f}% faster"
    if p_value is None:
        note = "medians only (no samples): not tested"
    elif sorted(base_samples) == sorted(head_samples):
        note = "identical samples"
    elif slower or faster:
        note = f"{abs(ratio - 1) * 100:.1f}% {'slower' if slower else 'faster'}, not significant"
    else:
        note = "within threshold"
    if base.get("verdict") != head.get("verdict"):
        note = f"correctness: {base.get('verdict')} -> {head.get('verdict')}; {note}"
    return "unchanged", note


