"""What an arm buys or costs against the sweep's baseline arm, from a serve-sweep's cases.

Per prompt size, median cold TTFT of the arm over the baseline's; per shared-prefix case,
median P2 TTFT of the arm over the baseline's. Each ratio comes with a seeded percentile
bootstrap 95% interval (kdabench.stats.bootstrap_ratio_ci, each side resampled on its own).
A ratio under 1 means the arm is faster. Derived from the receipt's raw samples, so a
receipt's contrasts can be shown again by `kdabench report`.

    rows = contrasts(receipt["cases"], baseline="final-only")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kdabench import stats


@dataclass(frozen=True)
class Contrast:
    """One arm against the baseline on one prompt size or shared-prefix case."""

    arm: str
    baseline: str
    kind: str  # "cold-ttft" or "shared-prefix"
    tokens: int  # the prompt size, or P1's tokens
    shared_tokens: int | None  # shared-prefix: the tokens P2 shares with P1
    arm_median_ms: float | None
    baseline_median_ms: float | None
    ratio: float | None  # arm median / baseline median
    ci95: tuple[float, float] | None

    @property
    def label(self) -> str:
        """"8192 tokens" or "P2 of 65536 sharing 57344"."""
        if self.kind == "shared-prefix":
            return f"P2 of {self.tokens} sharing {self.shared_tokens}"
        return f"{self.tokens} tokens"

    def to_dict(self) -> dict[str, Any]:
        return {"arm": self.arm, "baseline": self.baseline, "kind": self.kind,
                "tokens": self.tokens, "shared_tokens": self.shared_tokens,
                "arm_median_ms": self.arm_median_ms,
                "baseline_median_ms": self.baseline_median_ms, "ratio": self.ratio,
                "ci95": None if self.ci95 is None else list(self.ci95)}


def _samples(case: Mapping[str, Any]) -> list[float]:
    key = "p2_ttft_ms" if case["kind"] == "shared-prefix" else "samples_ms"
    return [float(v) for v in case.get(key) or [] if v is not None]


def _key(case: Mapping[str, Any]) -> tuple[str, int] | None:
    if case.get("kind") == "cold-ttft":
        return "cold-ttft", int(case["prompt_tokens_requested"])
    if case.get("kind") == "shared-prefix":
        return "shared-prefix", int(case["total_tokens"])
    return None


def contrasts(cases: Sequence[Mapping[str, Any]], baseline: str, *,
              seed: int = 0) -> list[Contrast]:
    """Every other arm against `baseline`, per prompt size and shared-prefix case that both
    measured (cases marked invalid are left out: their samples are not cold)."""
    measured: dict[tuple[str, int], dict[str, Mapping[str, Any]]] = {}
    for case in cases:
        key = _key(case)
        if key is not None and case.get("valid", True):
            measured.setdefault(key, {})[case["arm"]] = case
    rows = []
    for (kind, tokens), by_arm in sorted(measured.items()):
        base = by_arm.get(baseline)
        if base is None:
            continue
        base_samples = _samples(base)
        for arm, case in by_arm.items():
            if arm == baseline:
                continue
            head = _samples(case)
            base_median, head_median = stats.median(base_samples), stats.median(head)
            ratio = (head_median / base_median
                     if head_median is not None and base_median else None)
            interval = stats.bootstrap_ratio_ci(base_samples, head, seed=seed + tokens)
            rows.append(Contrast(arm, baseline, kind, tokens, case.get("shared_tokens"),
                                 head_median, base_median, ratio, interval))
    return rows
