"""Ranged launches: a call's chunk slots cut into ranges, each range's serial pass on a side
stream of its CUDA device while the caller's stream prepares the next range (kernels/NOTES.md,
v11 and cute v7); how many ranges, and the fork and join of their launches."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream of CUDA device `device`, made on first use."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]


def range_count(slots: int, meta_capacity: int, chunks_per_range: int | None, most: int) -> int:
    """One range per `chunks_per_range` chunks of a sequence slot (the pass already runs the
    slots side by side), at least one, at most `most`; one when `chunks_per_range` is None."""
    if chunks_per_range is None:
        return 1
    per_slot = slots // max(meta_capacity, 1)
    return max(1, min(most, per_slot // chunks_per_range))


def run_in_ranges(slots: int, ranges: int, edges: int, prepare: Callable[[int, int], None],
                  run_pass: Callable[[int, int, int], None], side: torch.cuda.Stream | None,
                  enter: Callable[[torch.cuda.Stream], AbstractContextManager] = torch.cuda.stream,
                  ) -> None:
    """Chunk slots 0 .. slots - 1 in `ranges` ranges of equal length (held within 1 .. edges,
    the carried edge states, and the slot count): per range, prepare(lo, hi) on the current
    stream, then run_pass(edge, lo, hi). With more than one range and a `side` stream, each
    pass runs on it inside `enter(side)`, behind an event recorded after its preparation, and
    the current stream joins it at the end: nothing waits on memory, so no scheduling order
    can deadlock, and a CUDA graph captures the fork and the join. Otherwise the ranges run
    one after the other on the current stream."""
    ranges = max(1, min(ranges, edges, slots))
    size = max(1, -(-slots // ranges))
    side = side if size < slots else None
    main = torch.cuda.current_stream(side.device) if side is not None else None
    for edge, lo in enumerate(range(0, slots, size)):
        hi = min(lo + size, slots)
        prepare(lo, hi)
        if side is None:
            run_pass(edge, lo, hi)
            continue
        ready = torch.cuda.Event()
        ready.record(main)
        side.wait_event(ready)
        with enter(side):
            run_pass(edge, lo, hi)
    if side is not None:
        main.wait_stream(side)
