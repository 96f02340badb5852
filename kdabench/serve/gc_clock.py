"""Time the process spends in Python's garbage collector, read as a running total.

A collection that runs while a prefill is being queued stalls the host, and the device runs
dry behind it; the server reports the collector's time within each request's TTFT.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any


class GcClock:
    """Running total of collector time (ms) and collections, from `gc.callbacks`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
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
        with self._lock:
            if phase == "start":
                self._began = now
            elif self._began is not None:
                self.total_ms += (now - self._began) * 1e3
                self.collections += 1
                self._began = None

    def reading(self) -> tuple[float, int]:
        """(total ms, collections) so far."""
        with self._lock:
            return self.total_ms, self.collections
