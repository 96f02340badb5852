"""Where a bench kernel's time goes: the GPU kernels one call launches, each with its mean
time per call.

    per_kernel_us = profiler(calls, runs)

``calls`` are a bench kernel's eager calls (one per input set); ``runs`` of them, in
rotation, run under torch.profiler (CUDA activity) after a warm call of each, separately from
the timed samples, so the profiler's overhead never reaches a median. The CUDA profiler sums
each GPU kernel's device time over the runs and divides by ``runs``; tests inject a fake.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol


class Profiler(Protocol):
    def __call__(self, calls: Sequence[Callable[[], Any]], runs: int) -> dict[str, float]:
        """Mean microseconds per call of each GPU kernel the calls launch."""
        ...


def cuda_kernel_profiler(calls: Sequence[Callable[[], Any]], runs: int) -> dict[str, float]:
    """torch.profiler over ``runs`` calls in rotation: {GPU kernel name: mean us per call}."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not calls or runs < 1:
        raise ValueError("nothing to profile")
    for call in calls:
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiled:
        for index in range(runs):
            calls[index % len(calls)]()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in profiled.events():
        if event.device_type.name == "CUDA":
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time / runs
    return totals


def breakdown_record(per_kernel_us: dict[str, float], runs: int) -> dict[str, Any]:
    """The receipt's form: the calls profiled, the GPU time per call, and each GPU kernel's
    share of it (microseconds, largest first)."""
    ordered = sorted(per_kernel_us.items(), key=lambda item: -item[1])
    return {"calls": runs, "gpu_us": round(sum(per_kernel_us.values()), 3),
            "kernels_us": {name: round(us, 3) for name, us in ordered}}
