"""Bench cases as compare sees them: one backend's kernel samples in one timing mode.

A bench case (``kdabench bench``) holds raw samples per timing mode and per kernel
(``modes[mode][kernel]["samples_ms"]``): fla, kdabench at capacity 4 on the first backend
(``kdabench``), capacity 1, and kdabench on each further backend (``kdabench-cute``). What a
regression check needs is kdabench's time on the backend being compared, so the compared
view of a pair of bench cases carries that backend's kernel's samples (each side's kernel:
the receipt's ``backend_kernels``) in one mode both sides ran: BASE's primary mode (``graph``
unless only eager ran), else one they share. Each side's fla ratio (fla's median over the
kernel's, same mode) goes into the note: fla runs on the same inputs in each receipt, so its
ratio says whether a change of kdabench's time is the machine's or the kernel's.

Bench case ids carry the case's gate regime ("8192x8x1/fast-decay"); a case that records none
(``gates``) was timed on the long-memory inputs under its shape's label alone, so compare
pairs it as "<label>/long-memory" (:func:`bench_case_key`; the comparison keeps each case's own
id).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

BENCH_KIND = "bench"
TIMED_KERNEL = "kdabench"
FLA_KERNEL = "fla"
MODE_PREFERENCE = ("graph", "eager")
UNRECORDED_GATES = "long-memory"  # the inputs of a bench case that records no gate regime


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _modes(case: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(case.get("modes"))


def bench_case_key(case: Mapping[str, Any]) -> str:
    """What a bench case is paired by: its id, "<id>/long-memory" for a case that records no
    gate regime (module docstring)."""
    case_id = str(case.get("id"))
    return case_id if "gates" in case else f"{case_id}/{UNRECORDED_GATES}"


def bench_mode(base: Mapping[str, Any] | None, head: Mapping[str, Any] | None,
               kernels: tuple[str, str] = (TIMED_KERNEL, TIMED_KERNEL)) -> str | None:
    """The timing mode to compare in: BASE's primary mode when both sides' kernels
    (``kernels``: BASE's, HEAD's) ran in it, else the first of graph/eager both ran; for a
    one-sided case, that side's primary mode."""
    sides = [(side, kernel) for side, kernel in zip((base, head), kernels, strict=True)
             if side is not None]
    ran = [{mode for mode, timed in _modes(side).items() if kernel in _mapping(timed)}
           for side, kernel in sides]
    shared = set.intersection(*ran) if ran else set()
    primary = sides[0][0].get("primary_mode") if sides else None
    if primary in shared:
        return str(primary)
    return next((mode for mode in MODE_PREFERENCE if mode in shared), None)


def timed_view(case: Mapping[str, Any] | None, mode: str | None,
               kernel: str = TIMED_KERNEL) -> dict[str, Any] | None:
    """The case with `kernel`'s samples and median of `mode` at its top level (none when
    that mode or kernel is absent), as compare_case reads timed cases."""
    if case is None:
        return None
    timing = _mapping(_mapping(_modes(case).get(mode)).get(kernel))
    return {**case, "samples_ms": timing.get("samples_ms") or [],
            "median_ms": timing.get("median_ms")}


def fla_ratio(case: Mapping[str, Any] | None, mode: str, kernel: str) -> float | None:
    """fla's median over `kernel`'s in `mode` (above 1: the kernel is faster), or None."""
    kernels = _mapping(_modes(case or {}).get(mode))
    fla = _mapping(kernels.get(FLA_KERNEL)).get("median_ms")
    timed = _mapping(kernels.get(kernel)).get("median_ms")
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in (fla, timed)):
        return None
    return fla / timed


def fla_ratio_note(base: Mapping[str, Any] | None, head: Mapping[str, Any] | None,
                   mode: str | None,
                   kernels: tuple[str, str] = (TIMED_KERNEL, TIMED_KERNEL)) -> str:
    """'graph: kdabench; fla/kdabench 0.93x -> 1.02x' (the sides present), or without ratios
    'graph: kdabench'; across backends each ratio names its kernel
    ('graph: kdabench -> kdabench-cute; fla/kdabench 1.02x -> fla/kdabench-cute 0.05x')."""
    if mode is None:
        return "no timing mode in common"
    base_kernel, head_kernel = kernels
    same = base_kernel == head_kernel
    label = base_kernel if same else f"{base_kernel} -> {head_kernel}"
    ratios = [(kernel, fla_ratio(side, mode, kernel))
              for side, kernel in ((base, base_kernel), (head, head_kernel)) if side is not None]
    shown = [f"{value:.2f}x" if same else f"fla/{kernel} {value:.2f}x"
             for kernel, value in ratios if value is not None]
    if not shown:
        return f"{mode}: {label}"
    return f"{mode}: {label}; {f'fla/{base_kernel} ' if same else ''}{' -> '.join(shown)}"
