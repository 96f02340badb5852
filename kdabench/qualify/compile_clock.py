"""The seconds a process spends compiling kernels, so that a case's wall time splits into
compile time and run time.

Triton: the compilation listener (``triton.knobs.compilation.listener``, triton >= 3.4) is
told of every call of ``triton.compile`` with its duration; the clock sums them. Under the
interpreter (CPU tier) nothing is compiled and the clock stays at 0. CuTe: loading its kernel
library (an ahead-of-time build, once per process) is timed by
:meth:`CompileClock.load_backend`, and each call of the library's ``function`` that compiled a
kernel just in time (a new entry in ``KernelLibrary.compiled``) counts as compile time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

#: What a receipt's compile_s measures, recorded beside the totals.
MEASURES = (
    "compile_s: seconds inside triton.compile as triton's compilation listener reports them "
    "(IR build, lowering stages, cache store; on an on-disk cache hit, the lookup) plus the "
    "cute backend's just-in-time compiles; 0 under the Triton interpreter. run_s: wall_s "
    "minus compile_s (inputs, kernel calls, float64 oracle, checks, timing samples). "
    "backend_load_s: loading the cute backend's kernel library, once per process."
)


@dataclass(frozen=True)
class Reading:
    """Totals since the clock started: seconds compiling, kernels compiled, cache hits."""

    seconds: float = 0.0
    compiled: int = 0
    cached: int = 0

    def __sub__(self, other: Reading) -> Reading:
        return Reading(self.seconds - other.seconds, self.compiled - other.compiled,
                       self.cached - other.cached)


class CompileClock:
    """One process's compile clock; `install()` hooks Triton, `load_backend()` the cute
    library."""

    def __init__(self) -> None:
        self._triton = Reading()
        self._cute = Reading()
        self._previous: Any = None
        self._installed = False
        self._timed: list[Any] = []  # cute libraries whose function() is timed

    def install(self) -> bool:
        """Listen to Triton's compiles (once per process); False when this triton has no
        compilation listener (then its compiles count as run time)."""
        if self._installed:
            return True
        try:
            from triton import knobs
        except ImportError:
            return False
        compilation = getattr(knobs, "compilation", None)
        if compilation is None or not hasattr(compilation, "listener"):
            return False
        self._previous = compilation.listener
        compilation.listener = self._listen
        self._installed = True
        return True

    def _listen(self, *, src: Any, metadata: Any, metadata_group: Any, times: Any,
                cache_hit: bool) -> None:
        seconds = self._triton.seconds + times.total / 1e6  # CompileTimes are microseconds
        self._triton = Reading(seconds, self._triton.compiled + (not cache_hit),
                               self._triton.cached + cache_hit)
        if self._previous is not None:
            self._previous(src=src, metadata=metadata, metadata_group=metadata_group,
                           times=times, cache_hit=cache_hit)

    def load_backend(self, backend: str, device: Any) -> float | None:
        """Load the cute backend's kernel library for `device` now and return the seconds it
        took (None for the Triton backend, which loads nothing up front)."""
        if backend != "cute":
            return None
        from kdabench.kernels.cute.runtime import library_for

        started = time.perf_counter()
        library, _ = library_for(device)
        load_s = round(time.perf_counter() - started, 3)
        if library is not None and not any(seen is library for seen in self._timed):
            self._time_jit(library)
        return load_s

    def _time_jit(self, library: Any) -> None:
        """Count the calls of `library.function` that compiled a kernel just in time."""
        function = library.function

        def timed(variant: Any) -> Any:
            before = len(library.compiled)
            started = time.perf_counter()
            result = function(variant)
            if len(library.compiled) > before:
                self._cute = Reading(self._cute.seconds + time.perf_counter() - started,
                                     self._cute.compiled + 1)
            return result

        library.function = timed
        self._timed.append(library)

    def reading(self) -> Reading:
        """The totals so far, Triton's and the cute library's together."""
        return Reading(self._triton.seconds + self._cute.seconds,
                       self._triton.compiled + self._cute.compiled, self._triton.cached)


#: The clock of this process (Triton's listener is process-wide).
CLOCK = CompileClock()
