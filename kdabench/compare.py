"""Compare two sets of receipts case by case: is HEAD slower, faster, or broken?

BASE and HEAD are receipt files or folders of them (every ``*.json`` in a folder, not
recursive). Cases are matched by receipt kind, device name and case id. When a kind
was run on exactly one device on each side and the names differ, the two are paired
anyway and a warning says so; otherwise a device present on one side only makes its
cases ``new`` or ``missing``.

Per matched case:

* medians of the raw ``samples_ms`` of each side (``median_ms`` when a side has no
  samples), the ratio HEAD/BASE;
* a two-sided Mann-Whitney U test on the raw samples (``scipy.stats.mannwhitneyu``);
* a percentile bootstrap confidence interval of the ratio of medians (numpy, seeded
  per case id, so a case's interval does not depend on which other cases ran);
* a verdict, in order of precedence:

  ``failed``     the case passed in BASE and does not pass in HEAD (whatever the timing);
  ``regressed``  ratio > 1 + threshold and p < alpha;
  ``improved``   ratio < 1 - threshold and p < alpha, or it did not pass in BASE and
                 passes in HEAD;
  ``unchanged``  anything else (a case without samples compares correctness only);
  ``new`` / ``missing``  the case is in HEAD only / in BASE only.

``failed`` and ``regressed`` are regressions. Warnings (shown before the table) say
when paired receipts differ in device, toolchain or kernel/oracle source hashes, when a
receipt is partial, or when a case id appears in more than one receipt of a side (the
newest receipt wins). A receipt that does not verify is refused (:class:`CompareError`)
unless ``verify=False``, which turns the refusal into a warning.

    comparison = compare_paths("main-results/", "results/", threshold=0.05, alpha=0.01)
    print(render_markdown(comparison))
    if comparison.has_regression: ...
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy.stats import mannwhitneyu

from kdabench.receipts import DEVICE_UNIT_KEYS, ReceiptError, read_receipt, verify_receipt
from kdabench.receipts.files import receipt_files
from kdabench.sources import compare_source_hashes

#: Case verdicts, most severe first (the order tables are sorted in).
VERDICTS = ("failed", "regressed", "improved", "new", "missing", "unchanged")
REGRESSIONS = frozenset({"failed", "regressed"})

#: Toolchain entries that do not touch kernel timings; a difference in them is not warned.
HARNESS_ONLY_TOOLCHAIN_KEYS = frozenset({"kdabench", "click", "rich"})


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
        return float(np.median(samples))
    median = case.get("median_ms") if case else None
    if isinstance(median, (int, float)) and not isinstance(median, bool) and math.isfinite(median):
        return float(median)
    return None


def mann_whitney_p(base: Sequence[float], head: Sequence[float]) -> float | None:
    """Two-sided Mann-Whitney U p-value; None without samples on both sides. Samples
    that are all one value on both sides give 1.0."""
    if not base or not head:
        return None
    p_value = float(mannwhitneyu(head, base, alternative="two-sided").pvalue)
    return 1.0 if math.isnan(p_value) else p_value


def bootstrap_ratio_ci(
    base: Sequence[float], head: Sequence[float], *, resamples: int = 2000,
    confidence: float = 0.95, seed: int | Sequence[int] = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of median(head) / median(base), resampling each side
    independently with replacement. None without samples on both sides or when a base
    resample has a non-positive median."""
    if not base or not head:
        return None
    rng = np.random.default_rng(seed)
    base_array, head_array = np.asarray(base, float), np.asarray(head, float)
    base_medians = np.median(
        base_array[rng.integers(0, base_array.size, (resamples, base_array.size))], axis=1)
    head_medians = np.median(
        head_array[rng.integers(0, head_array.size, (resamples, head_array.size))], axis=1)
    if np.any(base_medians <= 0):
        return None
    ratios = head_medians / base_medians
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


# --------------------------------------------------------------------------- one case


@dataclass
class CaseComparison:
    """One case of BASE against the same case of HEAD (either may be absent)."""

    kind: str
    device: str                    # "NVIDIA H200", or "A -> B" when paired across names
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

    @property
    def is_regression(self) -> bool:
        return self.verdict in REGRESSIONS

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "is_regression": self.is_regression}


def compare_case(
    base: Mapping[str, Any] | None, head: Mapping[str, Any] | None,
    options: CompareOptions = CompareOptions(), *, kind: str = "", device: str = "",
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
        note=note,
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


# --------------------------------------------------------------------------- receipts


@dataclass
class LoadedReceipt:
    """A receipt read from disk, and whether it verified (None: not checked)."""

    path: str
    doc: dict[str, Any]
    verified: bool | None
    problems: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return str(self.doc.get("kind"))

    @property
    def device_name(self) -> str:
        device = self.doc.get("device")
        name = device.get("name") if isinstance(device, Mapping) else None
        return str(name or "unknown device")


def load_receipts(
    path: str | os.PathLike, *, verify: bool = True, warnings: list[str] | None = None
) -> list[LoadedReceipt]:
    """Read (and verify, byte for byte) every receipt named by ``path``.

    A receipt that does not verify raises :class:`CompareError` when ``verify`` is True;
    otherwise it is kept and a warning is appended to ``warnings``. Partial receipts are
    kept with a warning.
    """
    warnings = [] if warnings is None else warnings
    loaded: list[LoadedReceipt] = []
    for file in receipt_files([path], CompareError):
        try:
            doc, raw = read_receipt(file)
        except ReceiptError as error:
            raise CompareError(str(error)) from error
        sources = doc.get("sources") if isinstance(doc.get("sources"), dict) else {}
        check = verify_receipt(doc, sources, raw=raw, path=file)
        if not check.ok:
            problems = "; ".join(check.problems)
            if verify:
                raise CompareError(
                    f"{file} does not verify ({problems}); pass --no-verify to compare it anyway"
                )
            warnings.append(f"{file} does not verify ({problems}); compared anyway (--no-verify)")
        if doc.get("status") != "complete":
            warnings.append(f"{file} is a partial receipt (interrupted run)")
        loaded.append(LoadedReceipt(str(file), doc, check.ok, list(check.problems)))
    return loaded


# --------------------------------------------------------------------------- comparing


@dataclass
class Comparison:
    """Every case compared, the warnings to show first, and the options used."""

    base: list[str]
    head: list[str]
    options: CompareOptions
    warnings: list[str]
    cases: list[CaseComparison]

    @property
    def counts(self) -> dict[str, int]:
        counts = {verdict: 0 for verdict in VERDICTS}
        for case in self.cases:
            counts[case.verdict] += 1
        return counts

    @property
    def regressions(self) -> list[CaseComparison]:
        return [case for case in self.cases if case.is_regression]

    @property
    def has_regression(self) -> bool:
        return bool(self.regressions)

    def summary_line(self) -> str:
        counts = self.counts
        parts = ", ".join(f"{counts[v]} {v}" for v in VERDICTS)
        head = (f"{len(self.regressions)} regression(s)" if self.has_regression
                else "no regression")
        return (f"{head}: {len(self.cases)} cases ({parts}); threshold "
                f"{self.options.threshold * 100:g}%, alpha {self.options.alpha:g}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base, "head": self.head, "options": asdict(self.options),
            "warnings": list(self.warnings), "counts": self.counts,
            "has_regression": self.has_regression, "summary": self.summary_line(),
            "cases": [case.to_dict() for case in self.cases],
        }


def _by_kind_and_device(receipts, side: str, warnings: list[str]):
    """{kind: {device: {case id: (case, receipt)}}}; the newest receipt wins a duplicate."""
    table: dict[str, dict[str, dict[str, tuple[dict, LoadedReceipt]]]] = {}
    superseded: dict[tuple[str, str], int] = {}
    for receipt in sorted(receipts, key=lambda r: str(r.doc.get("created_at"))):
        cases = table.setdefault(receipt.kind, {}).setdefault(receipt.device_name, {})
        for case in receipt.doc["cases"]:
            if case.get("id") in cases:
                superseded[(receipt.kind, receipt.device_name)] = (
                    superseded.get((receipt.kind, receipt.device_name), 0) + 1)
            cases[str(case.get("id"))] = (case, receipt)
    for (kind, device), count in sorted(superseded.items()):
        warnings.append(f"{side}: {count} {kind} case(s) on {device} appear in more than one "
                        "receipt; the newest receipt's result is used")
    return table


def _pair_devices(kind, base_devices, head_devices, warnings):
    pairs = [(name, name) for name in base_devices if name in head_devices]
    base_only = [name for name in base_devices if name not in head_devices]
    head_only = [name for name in head_devices if name not in base_devices]
    if len(base_only) == 1 and len(head_only) == 1:
        pairs.append((base_only[0], head_only[0]))
        base_only, head_only = [], []
    pairs += [(name, None) for name in base_only] + [(None, name) for name in head_only]
    for name in base_only:
        warnings.append(f"{kind} receipts on {name} are only in BASE: their cases are missing")
    for name in head_only:
        warnings.append(f"{kind} receipts on {name} are only in HEAD: their cases are new")
    return pairs


def _environment_warnings(kind, base_receipts, head_receipts) -> list[str]:
    found: list[str] = []
    for base in base_receipts:
        for head in head_receipts:
            where = f"{kind}: {base.path} vs {head.path}"
            base_device = {k: v for k, v in base.doc.get("device", {}).items()
                           if k not in DEVICE_UNIT_KEYS}
            head_device = {k: v for k, v in head.doc.get("device", {}).items()
                           if k not in DEVICE_UNIT_KEYS}
            if base.device_name != head.device_name:
                found.append(f"device differs ({where}): BASE ran on {base.device_name}, "
                             f"HEAD on {head.device_name}")
            elif base_device != head_device:
                found.append(f"device differs ({where}): "
                             f"{_describe_differences(base_device, head_device)}")
            base_tools = {k: v for k, v in base.doc.get("toolchain", {}).items()
                          if k not in HARNESS_ONLY_TOOLCHAIN_KEYS}
            head_tools = {k: v for k, v in head.doc.get("toolchain", {}).items()
                          if k not in HARNESS_ONLY_TOOLCHAIN_KEYS}
            if base_tools != head_tools:
                found.append(f"toolchain differs ({where}): "
                             f"{_describe_differences(base_tools, head_tools)}")
            diff = compare_source_hashes(base.doc.get("sources", {}), head.doc.get("sources", {}))
            if not diff.match:
                found.append(f"kernel/oracle sources differ ({where}): {diff.describe()}")
    return found


def _describe_differences(base: Mapping[str, Any], head: Mapping[str, Any]) -> str:
    keys = sorted(key for key in set(base) | set(head) if base.get(key) != head.get(key))
    return ", ".join(f"{key} {base.get(key)} -> {head.get(key)}" for key in keys)


def compare_receipts(
    base: Sequence[LoadedReceipt], head: Sequence[LoadedReceipt],
    options: CompareOptions = CompareOptions(), *, warnings: Sequence[str] = (),
) -> Comparison:
    """Match the cases of BASE and HEAD receipts and compare each (see the module doc).

    Raises :class:`CompareError` when the two sides share no receipt kind or no case.
    """
    warnings = list(warnings)
    base_kinds = sorted({r.kind for r in base})
    head_kinds = sorted({r.kind for r in head})
    common = [kind for kind in base_kinds if kind in head_kinds]
    if not common:
        raise CompareError(
            f"nothing to compare: BASE holds {'/'.join(base_kinds) or 'no'} receipts, HEAD "
            f"{'/'.join(head_kinds) or 'no'} receipts; compare receipts of one kind"
        )
    for kind in base_kinds + head_kinds:
        if kind not in common:
            side = "BASE" if kind in base_kinds else "HEAD"
            warnings.append(f"{kind} receipts are only in {side}; they are not compared")
    base_table = _by_kind_and_device(base, "BASE", warnings)
    head_table = _by_kind_and_device(head, "HEAD", warnings)

    cases: list[CaseComparison] = []
    environment: list[str] = []
    for kind in common:
        for base_device, head_device in _pair_devices(
                kind, list(base_table[kind]), list(head_table[kind]), warnings):
            base_cases = base_table[kind].get(base_device, {}) if base_device else {}
            head_cases = head_table[kind].get(head_device, {}) if head_device else {}
            label = (base_device or head_device if base_device == head_device
                     or None in (base_device, head_device)
                     else f"{base_device} -> {head_device}")
            for case_id in list(base_cases) + [i for i in head_cases if i not in base_cases]:
                base_case = base_cases.get(case_id, (None, None))[0]
                head_case = head_cases.get(case_id, (None, None))[0]
                cases.append(compare_case(base_case, head_case, options,
                                          kind=kind, device=str(label)))
            if base_device and head_device:
                environment += _environment_warnings(
                    kind, _contributors(base_cases), _contributors(head_cases))
    if not any(c.verdict not in ("new", "missing") for c in cases):
        raise CompareError("nothing to compare: no case appears in both BASE and HEAD")
    for message in environment:
        if message not in warnings:
            warnings.append(message)
    order = {verdict: rank for rank, verdict in enumerate(VERDICTS)}
    cases.sort(key=lambda case: order[case.verdict])  # stable: receipt order within a verdict
    return Comparison([], [], options, warnings, cases)


def _contributors(cases: Mapping[str, tuple[dict, LoadedReceipt]]) -> list[LoadedReceipt]:
    seen: dict[str, LoadedReceipt] = {}
    for _, receipt in cases.values():
        seen.setdefault(receipt.path, receipt)
    return list(seen.values())


def compare_paths(
    base: str | os.PathLike, head: str | os.PathLike, *, threshold: float | str = 0.05,
    alpha: float = 0.01, verify: bool = True, resamples: int = 2000,
    confidence: float = 0.95, seed: int = 0,
) -> Comparison:
    """Load BASE and HEAD (receipt files or folders of them) and compare them.

    ``threshold`` is a fraction or a string such as "5%". With ``verify`` False, a
    receipt that fails verification is compared with a warning instead of refused.
    Raises :class:`CompareError` for input that cannot be compared.
    """
    options = CompareOptions(threshold=parse_threshold(threshold), alpha=alpha,
                             resamples=resamples, confidence=confidence, seed=seed)
    warnings: list[str] = []
    base_receipts = load_receipts(base, verify=verify, warnings=warnings)
    head_receipts = load_receipts(head, verify=verify, warnings=warnings)
    comparison = compare_receipts(base_receipts, head_receipts, options, warnings=warnings)
    comparison.base = [r.path for r in base_receipts]
    comparison.head = [r.path for r in head_receipts]
    return comparison


# --------------------------------------------------------------------------- rendering


def format_ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def format_ratio(case: CaseComparison) -> str:
    return "—" if case.ratio is None else f"{case.ratio:.3f}"


def format_interval(case: CaseComparison) -> str:
    if case.ci_low is None or case.ci_high is None:
        return "—"
    return f"{case.ci_low:.3f}–{case.ci_high:.3f}"


def format_p(case: CaseComparison) -> str:
    return "—" if case.p_value is None else f"{case.p_value:.2g}"


def _markdown_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(comparison: Comparison) -> str:
    """A Markdown comment for a pull request: summary line, warnings as a blockquote,
    one table row per case (regressions first)."""
    mark = "❌" if comparison.has_regression else "✅"
    lines = [f"**kdabench compare** {mark} {comparison.summary_line()}", ""]
    if comparison.warnings:
        lines += [f"> ⚠️ {_markdown_cell(message)}" for message in comparison.warnings]
        lines.append("")
    multi = len({(c.kind, c.device) for c in comparison.cases}) > 1
    header = (["kind", "device"] if multi else []) + [
        "case", "verdict", "base ms", "head ms", "ratio",
        f"{comparison.options.confidence * 100:g}% CI", "p", "correctness", "note"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(" --- " for _ in header) + "|")
    for case in comparison.cases:
        verdict = f"**{case.verdict}**" if case.is_regression else case.verdict
        correctness = f"{case.base_verdict or '—'} → {case.head_verdict or '—'}"
        row = ([case.kind, case.device] if multi else []) + [
            f"`{case.id}`", verdict, format_ms(case.base_median_ms),
            format_ms(case.head_median_ms), format_ratio(case), format_interval(case),
            format_p(case), correctness, case.note]
        lines.append("| " + " | ".join(_markdown_cell(cell) for cell in row) + " |")
    return "\n".join(lines) + "\n"
