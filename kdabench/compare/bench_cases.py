"""Bench cases as compare sees them: kdabench's own samples in one timing mode.

A bench case (``kdabench bench``) holds raw samples per timing mode and per kernel
(``modes[mode][kernel]["samples_ms"]``): fla, kdabench at capacity 4 (``kdabench``),
capacity 1, further backends. What a regression check needs is kdabench's time, so the
compared view of a pair of bench cases carries the ``kdabench`` kernel's samples in one mode
both sides ran: BASE's primary mode (``graph`` unless only eager ran), else one they share.
The fla ratio of each side goes into the note: fla runs on the same inputs in each receipt,
so its ratio says whether a change of kdabench's time is the machine's or the kernel's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BENCH_KIND = "bench"
TIMED_KERNEL = "kdabench"
MODE_PREFERENCE = ("graph", "eager")


def bench_mode(base: Mapping[str, Any] | None, head: Mapping[str, Any] | None) -> str | None:
    """The timing mode to compare in: BASE's primary mode when HEAD ran it too, else the
    first of graph/eager both ran; for a one-sided case, that side's primary mode."""
    sides = [side for side in (base, head) if side is not None]
    ran = [set((side.get("modes") or {}).keys()) for side in sides]
    shared = set.intersection(*ran) if ran else set()
    primary = sides[0].get("primary_mode") if sides else None
    if primary in shared:
        return str(primary)
    return next((mode for mode in MODE_PREFERENCE if mode in shared), None)


def timed_view(case: Mapping[str, Any] | None, mode: str | None) -> dict[str, Any] | None:
    """The case with kdabench's samples and median of `mode` at its top level (none when
    that mode or kernel is absent), as compare_case reads timed cases."""
    if case is None:
        return None
    kernel = ((case.get("modes") or {}).get(mode) or {}).get(TIMED_KERNEL) or {}
    return {**case, "samples_ms": kernel.get("samples_ms") or [],
            "median_ms": kernel.get("median_ms")}


def fla_ratio_note(base: Mapping[str, Any] | None, head: Mapping[str, Any] | None,
                   mode: str | None) -> str:
    """'graph: fla/kdabench 0.93x -> 1.02x' (the sides present), or '' without ratios."""
    def ratio(case):
        value = ((case or {}).get("ratio_fla_over_kdabench") or {}).get(mode)
        return f"{value:.2f}x" if isinstance(value, (int, float)) else None

    ratios = [r for r in (ratio(base), ratio(head)) if r is not None]
    if mode is None or not ratios:
        return f"{mode}: kdabench" if mode else "no timing mode in common"
    return f"{mode}: kdabench; fla/kdabench {' -> '.join(ratios)}"
