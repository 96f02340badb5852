"""Time the process spends in Python's garbage collector, read as a running total.

A collection that runs while a prefill is being queued stalls the host, and the device runs
dry behind it; the server reports the collector's time within each request's TTFT.
"""

from __future__ import annotations

import gc
import time
from typing import Any


class GcClock:
    """Running total of collector time (ms) and collections, from `gc.callbacks`.

    No lock: a collection can start inside any allocation, also one made while a lock is
    held, so a callback that takes a lock could wait on its own thread; collections never
    overlap (the collector holds the GIL), and a reading torn between the two totals is
    off by one collection at most."""

    def __init__(self) -> None:
        self._began: float | None = None
        self.total_ms = 0.0
        self.collections = 0

    def install(self) -> None:
        gc.callbacks.append(self._callback)

    def remove(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._began = now
        elif self._began is not None:
            self.total_ms += (now - self._began) * 1e3
            self.collections += 1
            self._began = None

    def reading(self) -> tuple[float, int]:
        """(total ms, collections) so far."""
        return self.total_ms, self.collections
