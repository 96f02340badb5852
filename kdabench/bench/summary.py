"""The bench's numbers from its medians: per-shape metrics and the summary over the shapes.

Per shape and mode: tokens/s, distance to the floor, fla/kdabench (and cudnn/kdabench where
cuDNN's kernel ran), the export overhead and, when a baseline policy ran, the policy gain (kdabench-baseline median / kdabench median:
above 1, the configs of --policy-mode are faster than those of --baseline-policy) and, per
further kernel backend's column (``kdabench-<backend>``), fla / it and kdabench (the first
backend) / it. The summary holds their medians (and extremes) over the cases, per mode (the
``*_by_shape`` maps are keyed by case id, "8192x8x1/fast-decay"), and the same per gate
regime (``per_gates``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from kdabench.bench.backend import CUDNN, FLA, KDABENCH, KDABENCH_BASELINE, KDABENCH_C1
from kdabench.stats import median


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def shape_metrics(modes: Mapping[str, Mapping[str, Mapping[str, Any]]], tokens: int,
                  floor_ms: float | None) -> dict[str, Any]:
    """Per mode: each kernel's tokens/s and distance to the floor, fla/kdabench (cudnn/
    kdabench where cudnn ran) and the export overhead, from ``modes`` = {mode: {kernel:
    {"median_ms": ...}}} (filled in)."""
    ratios, cudnn_ratios, overheads = {}, {}, {}
    for mode, kernels in modes.items():
        for entry in kernels.values():
            median = entry.get("median_ms")
            entry["tokens_per_s"] = tokens / (median / 1e3) if median else None
            entry["to_floor"] = _ratio(median, floor_ms)
        ours = kernels.get(KDABENCH, {}).get("median_ms")
        ratios[mode] = _ratio(kernels.get(FLA, {}).get("median_ms"), ours)
        cudnn_ratios[mode] = _ratio(kernels.get(CUDNN, {}).get("median_ms"), ours)
        single = _ratio(ours, kernels.get(KDABENCH_C1, {}).get("median_ms"))
        overheads[mode] = None if single is None else single - 1.0
    metrics = {"ratio_fla_over_kdabench": ratios, "export_overhead": overheads}
    if any(CUDNN in kernels for kernels in modes.values()):
        metrics["ratio_cudnn_over_kdabench"] = cudnn_ratios
    return metrics


def policy_metrics(modes: Mapping[str, Mapping[str, Mapping[str, Any]]],
                   kernel_configs: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    """``policy_gain`` = {mode: kdabench-baseline median / kdabench median} and
    ``same_config`` (both plans resolved one kernel config; None when either is unknown)."""
    gains = {mode: _ratio(kernels.get(KDABENCH_BASELINE, {}).get("median_ms"),
                          kernels.get(KDABENCH, {}).get("median_ms"))
             for mode, kernels in modes.items()}
    configs = kernel_configs or {}
    ours = (configs.get(KDABENCH) or {}).get("kernel_config")
    baseline = (configs.get(KDABENCH_BASELINE) or {}).get("kernel_config")
    same = None if ours is None or baseline is None else ours == baseline
    return {"policy_gain": gains, "same_config": same}


def backend_metrics(modes: Mapping[str, Mapping[str, Mapping[str, Any]]],
                    kernels: Sequence[str]) -> dict[str, Any]:
    """``backend_ratios`` = {kernel: {"ratio_fla_over": {mode: fla median / its median},
    "ratio_kdabench_over": {mode: kdabench median / its median}}} for the further backends'
    ``kernels`` (above 1: that kernel is the faster)."""
    ratios = {kernel: {name: {mode: _ratio(found.get(reference, {}).get("median_ms"),
                                           found.get(kernel, {}).get("median_ms"))
                              for mode, found in modes.items()}
                       for name, reference in (("ratio_fla_over", FLA),
                                               ("ratio_kdabench_over", KDABENCH))}
              for kernel in kernels}
    return {"backend_ratios": ratios}


def summarize(cases: Sequence[Mapping[str, Any]], modes: Sequence[str], *,
              baseline: bool = False, backend_kernels: Sequence[str] = ()) -> dict[str, Any]:
    """Medians over the cases, per mode: fla/kdabench (and cudnn/kdabench where it ran),
    export overhead, kdabench / floor;
    with ``baseline``, also the policy gain and how many shapes shared a config; per kernel of
    ``backend_kernels``, its ratios and distance to the floor (``backends``)."""
    summary: dict[str, Any] = {"cases": len(cases),
                               "shapes": len({str(case["shape"]) for case in cases}),
                               "per_mode": {}}
    for mode in modes:
        ratio = _by_case(cases, ("ratio_fla_over_kdabench", mode))
        overhead = _by_case(cases, ("export_overhead", mode))
        to_floor = _by_case(cases, ("modes", mode, KDABENCH, "to_floor"))
        row = summary["per_mode"][mode] = {
            "median_ratio_fla_over_kdabench": median(list(ratio.values())),
            "min_ratio_fla_over_kdabench": min(ratio.values()) if ratio else None,
            "median_export_overhead": median(list(overhead.values())),
            "max_export_overhead": max(overhead.values()) if overhead else None,
            "median_kdabench_to_floor": median(list(to_floor.values())),
            "ratio_by_shape": ratio, "export_overhead_by_shape": overhead,
        }
        cudnn = _by_case(cases, ("ratio_cudnn_over_kdabench", mode))
        if cudnn:
            row.update(median_ratio_cudnn_over_kdabench=median(list(cudnn.values())),
                       min_ratio_cudnn_over_kdabench=min(cudnn.values()),
                       cudnn_ratio_by_shape=cudnn)
        if baseline:
            gain = _by_case(cases, ("policy_gain", mode))
            row.update(median_policy_gain=median(list(gain.values())),
                       min_policy_gain=min(gain.values()) if gain else None,
                       policy_gain_by_shape=gain)
        if backend_kernels:
            row["backends"] = {kernel: _backend_row(cases, mode, kernel)
                               for kernel in backend_kernels}
    if baseline:
        known = {str(c["id"]): c["same_config"] for c in cases
                 if isinstance(c.get("same_config"), bool)}
        summary["same_config_shapes"] = sum(known.values())
        summary["config_compared_shapes"] = len(known)
    return summary


def summarize_by_gates(cases: Sequence[Mapping[str, Any]], modes: Sequence[str],
                       gates: Sequence[str], **options: Any) -> dict[str, Any]:
    """:func:`summarize` over every case, with ``per_gates`` = {regime name: the summary of
    that regime's cases} for each of ``gates``."""
    summary = summarize(cases, modes, **options)
    summary["per_gates"] = {
        name: summarize([c for c in cases if (c.get("gates") or {}).get("name") == name], modes,
                        **options)
        for name in gates}
    return summary


def _backend_row(cases: Sequence[Mapping[str, Any]], mode: str, kernel: str
                 ) -> dict[str, Any]:
    """One further backend's kernel over the shapes in ``mode``: its ratios and floor distance."""
    row: dict[str, Any] = {}
    for name in ("ratio_fla_over", "ratio_kdabench_over"):
        values = _by_case(cases, ("backend_ratios", kernel, name, mode))
        row.update({f"median_{name}": median(list(values.values())),
                    f"min_{name}": min(values.values()) if values else None,
                    f"{name}_by_shape": values})
    to_floor = _by_case(cases, ("modes", mode, kernel, "to_floor"))
    row["median_to_floor"] = median(list(to_floor.values()))
    return row


def _by_case(cases: Sequence[Mapping[str, Any]], path: Sequence[str]) -> dict[str, float]:
    """{case id: the finite number at ``path`` in the case} (absent ones left out)."""
    found = {}
    for case in cases:
        value: Any = case
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            found[str(case["id"])] = float(value)
    return found
