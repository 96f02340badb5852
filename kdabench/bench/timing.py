"""Timing backends: a :data:`Timer` times a rotation of callables and returns raw samples.

    samples_ms = timer(calls, warmup, reps)

``calls`` are interchangeable runs of one kernel, one per input set (eager calls, or
``graph.replay`` of one graph per input set); sample ``i`` times ``calls[i % len(calls)]``,
so consecutive samples read different memory and the L2 cache does not flatter them. The
CUDA timer records a pair of events around each call (no host sync between calls) and
synchronises once at the end; tests inject a deterministic fake instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol


class Timer(Protocol):
    def __call__(self, calls: Sequence[Callable[[], Any]], warmup: int,
                 reps: int) -> list[float]:
        """Warm up, then return ``reps`` samples in milliseconds."""
        ...


def cuda_event_timer(calls: Sequence[Callable[[], Any]], warmup: int, reps: int) -> list[float]:
    """CUDA-event samples (ms) of ``calls`` in rotation, after ``warmup`` calls of each."""
    import torch

    if not calls:
        raise ValueError("nothing to time")
    for _ in range(max(warmup, 1)):
        for call in calls:
            call()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for index in range(reps):
        starts[index].record()
        calls[index % len(calls)]()
        ends[index].record()
    torch.cuda.synchronize()
    return [round(start.elapsed_time(end), 5) for start, end in zip(starts, ends, strict=True)]


def capture_graph(call: Callable[[], Any], warmups: int = 3) -> tuple[Any, Any]:
    """A CUDA graph of ``call`` and what the captured call returned (its static outputs):
    warmed up on a side stream first, then captured once."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = call()
    torch.cuda.synchronize()
    return graph, output
