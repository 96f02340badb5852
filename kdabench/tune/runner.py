"""What `kdabench tune` needs from a device: time candidate configs, check a winner.

    runner.unavailable() -> str | None          why it cannot run here (None: it can)
    runner.identity() -> dict                   the device (kdabench.environment)
    runner.device_name() -> str                 the name its profile is kept under
    runner.backend_unavailable(backend, query) -> str | None   why a backend cannot run it
    runner.measure(query, configs, warmup, reps, seed) -> [Timed]   one per config
    runner.check(query, config, check, seed) -> {"instance": ..., "errors": ...}

A config names its backend by its type (:func:`backend_of`): a KernelConfig runs on Triton, a
CuteConfig on the CuTe DSL backend, so one measure() times both on the same input sets.

`KernelRunner` runs the real kernels on one device. Timing reuses the bench's pieces: the
input sets are kdabench.bench.cuda.rotated_sets (enough of them to hold twice the L2 cache,
at least three), each config gets a plan and a binding per set (kdabench_runs with the config
given explicitly), and the timer (kdabench.bench.timing: CUDA events around each call, calls
rotating among the sets, one sync at the end) returns the raw samples. The check runs the
winner on a smaller instance of the query and compares outputs, final states and every
checkpoint with the float64 recurrence (kdabench.oracles.recurrent_kda).

A candidate that does not compile or launch (out of shared memory, say) is a Timed with an
error, not the end of the run. The timer is injectable, so tests run the whole runner on the
CPU under the Triton interpreter with a fake timer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from kdabench.bench.cuda import (
    DEFAULT_L2_BYTES,
    checkpoint_offsets,
    input_set_count,
    kdabench_runs,
    rotated_sets,
)
from kdabench.bench.shapes import BenchShape
from kdabench.bench.timing import Timer, cuda_event_timer
from kdabench.bench.work import CHECKPOINTS, count_bytes
from kdabench.inputs import KdaInputs, make_inputs
from kdabench.oracles import recurrent_kda, relative_error

ERROR_CHARS = 300


@dataclass
class Timed:
    """One candidate's raw samples (ms), or why it could not be timed."""

    samples_ms: list[float]
    error: str | None = None
    input_sets: int | None = None


def backend_of(config: Any) -> str:
    """The backend a config is for: CuteConfig names it ("cute"); a KernelConfig is Triton's."""
    return str(getattr(config, "backend", "triton"))


class Runner(Protocol):
    timer: Timer

    def unavailable(self) -> str | None: ...

    def backend_unavailable(self, backend: str, query: Any) -> str | None: ...

    def identity(self) -> dict[str, Any]: ...

    def device_name(self) -> str: ...

    def target(self) -> torch.device: ...

    def measure(self, query: Any, configs: Sequence[Any], warmup: int, reps: int,
                seed: int) -> list[Timed]: ...

    def check(self, query: Any, config: Any, check: dict[str, Any],
              seed: int) -> dict[str, Any]: ...


def query_inputs(query: Any, shape: BenchShape, seed: int, device: torch.device) -> KdaInputs:
    """Seeded inputs of `shape` for `query` (its gate and lower bound, q/k/v in its dtype)."""
    x = make_inputs(shape.lengths, shape.heads, query.head_dim, gate=query.gate,
                    lower_bound=query.lower_bound, seed=seed, device=device)
    dtype = getattr(torch, query.dtype)
    if x.q.dtype != dtype:
        x = dataclasses.replace(x, q=x.q.to(dtype), k=x.k.to(dtype), v=x.v.to(dtype))
    return x


def oracle_check(kernels: Any, query: Any, config: Any, device: torch.device, *,
                 max_tokens: int, max_seqs: int, seed: int) -> dict[str, Any]:
    """Run `config` on a smaller instance of `query`; its errors against float64.

    Returns {"instance": {tokens, heads, seqs, seq_len, offsets}, "errors": {output,
    final_state, checkpoint}} (relative Frobenius errors; the largest over sequences and
    checkpoints). Raises KdaMetadataError when the kernel rejects the call.
    """
    shape = query.check_shape(max_tokens, max_seqs)
    x = query_inputs(query, shape, seed, device)
    _, runs = kdabench_runs(kernels, [x], shape, query.capacity, device, config=config,
                            backend=backend_of(config))
    run = runs[0]
    result = kernels.run(run.binding)
    result.raise_for_error()
    n = shape.seqs
    offsets = checkpoint_offsets(shape.seq_len, query.capacity)
    ref = recurrent_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens,
                        initial_state=x.initial_state, prefix_lengths=[offsets] * n,
                        device=device, **x.gate_kwargs())
    pool = run.pool
    errors = {
        "output": relative_error(ref.o, result.o),
        "final_state": max(relative_error(ref.final_state[s], pool[n + s]) for s in range(n)),
        "checkpoint": max(relative_error(ref.prefix_states[s][c], pool[2 * n + CHECKPOINTS * s + c])
                          for s in range(n) for c in range(len(offsets))),
    }
    return {"instance": {"tokens": shape.tokens, "heads": shape.heads, "seqs": n,
                         "seq_len": shape.seq_len, "offsets": offsets},
            "errors": errors}


class KernelRunner:
    """The real kernels on `device` (default: the current CUDA device), timed by `timer`."""

    def __init__(self, device: str | torch.device | None = None, timer: Timer | None = None,
                 l2_bytes: int | None = None) -> None:
        self.device = None if device is None else torch.device(device)
        self.timer = timer or cuda_event_timer
        self._l2_bytes = l2_bytes

    def target(self) -> torch.device:
        """The device the kernels run on."""
        if self.device is not None:
            return self.device
        return torch.device("cuda", torch.cuda.current_device())

    def unavailable(self) -> str | None:
        if self.device is not None and self.device.type == "cpu":
            if os.environ.get("TRITON_INTERPRET") != "1":
                return "the CPU runs the kernels only under TRITON_INTERPRET=1"
            return None
        if not torch.cuda.is_available():
            return ("kdabench tune needs a CUDA GPU and torch sees none here "
                    "(torch.cuda.is_available() is False); profiles are measured on the "
                    "device they are for")
        if os.environ.get("TRITON_INTERPRET") == "1":
            return "TRITON_INTERPRET=1 is set: unset it to time the compiled kernels"
        return None

    def backend_unavailable(self, backend: str, query: Any) -> str | None:
        """Why `backend` cannot run `query` on this device (None: it can)."""
        from kdabench.kernels.api import ineligibility

        reasons = ineligibility(dataclasses.replace(query.caps(self.target()), backend=backend))
        return "; ".join(reasons) or None

    def identity(self) -> dict[str, Any]:
        from kdabench.environment import device_identity

        return device_identity(str(self.target()))

    def device_name(self) -> str:
        """The name the policy catalog looks this device's profile up by."""
        from kdabench.kernels.policy import device_name_of

        return device_name_of(self.target())

    def l2_bytes(self) -> int:
        if self._l2_bytes is not None:
            return self._l2_bytes
        device = self.target()
        if device.type != "cuda":
            return DEFAULT_L2_BYTES
        props = torch.cuda.get_device_properties(device)
        return int(getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES)

    def measure(self, query: Any, configs: Sequence[Any], warmup: int, reps: int,
                seed: int) -> list[Timed]:
        from kdabench import kernels

        device = self.target()
        shape = query.shape
        base = query_inputs(query, shape, seed, device)
        set_bytes = count_bytes(shape.tokens, shape.heads, query.head_dim, shape.seqs)
        sets = rotated_sets(base, input_set_count(set_bytes, self.l2_bytes()))
        timed = []
        for config in configs:
            timed.append(self._time_one(kernels, sets, query, config, device, warmup, reps))
        del sets, base
        self._release(device)
        return timed

    def _time_one(self, kernels: Any, sets: list[KdaInputs], query: Any, config: Any,
                  device: torch.device, warmup: int, reps: int) -> Timed:
        runs: list[Any] = []
        try:
            plan, runs = kdabench_runs(kernels, sets, query.shape, query.capacity, device,
                                       config=config, backend=backend_of(config))
            calls = [(lambda b=r.binding: kernels.run(b)) for r in runs]
            samples = [float(s) for s in self.timer(calls, warmup, reps)]
            code = int(plan.error_code.item())
            if code:
                return Timed(samples, f"error code {code}: {kernels.decode_error_code(code)}",
                             len(sets))
            return Timed(samples, None, len(sets))
        except Exception as error:  # noqa: BLE001 - a candidate that fails is recorded
            with contextlib.suppress(Exception):
                if device.type == "cuda":
                    torch.cuda.synchronize()
            message = " ".join(f"{type(error).__name__}: {error}".split())
            return Timed([], message[:ERROR_CHARS], len(sets))
        finally:
            runs.clear()
            self._release(device)

    def check(self, query: Any, config: Any, check: dict[str, Any], seed: int
              ) -> dict[str, Any]:
        from kdabench import kernels

        found = oracle_check(kernels, query, config, self.target(),
                             max_tokens=check["max_tokens"], max_seqs=check["max_seqs"],
                             seed=seed + 1)
        self._release(self.target())
        return found

    @staticmethod
    def _release(device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
