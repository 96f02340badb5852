"""The CUDA backend of `kdabench bench`: input sets, the kernels, the two ceilings.

Input sets. Set 0 is :func:`kdabench.bench.gates.draw_inputs` (seeded
:func:`kdabench.inputs.make_inputs`, g drawn under the case's gate regime); set i > 0 is
set 0 with every token tensor rolled by i * T / n tokens and the initial state negated for
odd i (still valid samples of the same distribution, at other addresses). There are at least three
sets, and enough that together they hold twice the L2 cache, so rotating among them keeps
the cache from flattering any kernel.

Kernels. kdabench runs through the planned API: one plan per capacity (its workspaces
shared by the sets), a binding per input set with its own state pool and output; eager
calls are ``run(binding)`` and graphs capture that call once per set. The pool of a
sequence n holds its initial state in slot n (read), its final state goes to slot N + n and
its checkpoints to slots 2N + 4n ... (written), so every run reads the same inputs. Each plan
resolves its kernel config under the bench's policy mode (kdabench-baseline, capacity 4 like
kdabench: under the baseline policy mode); the config, its source and the mode go into the
case record (``kernel_configs``). Those plans run on the first kernel backend asked for; each
further backend gets a plan like kdabench's (``kdabench-<backend>``) bound to the same input
sets. Whether a backend can plan at all is asked of ``kernels.ineligibility`` once, before
any shape (:meth:`CudaBackend.backend_unavailable`).
Capacity 4: offsets L/5, 2L/5, 3L/5 + 3, 4L/5 + 3 of each sequence of L tokens; capacity 2
(tuning): L/3 and 2L/3; capacity 1: one offset at L/2. fla: ``chunk_kda(q[None], k[None], v[None], g[None], beta[None],
initial_state=S0 [N, H, K, V], output_final_state=True, cu_seqlens=int64, safe_gate=True,
lower_bound=...)`` under ``torch.inference_mode()``; its graph is captured with
``use_graph=True, max_num_seqs=N`` (fla's graph mode), else plainly, else not at all (the
reason is recorded). Every capture is checked before it is timed
(:func:`kdabench.bench.replay.check_replays`): each input set's graph is replayed once into
zeroed outputs (kdabench: the output and the pool slots it writes, final states and
checkpoints; fla: the output and the final state) and must reproduce an eager call on the
same set. kdabench graphs that do not are refused (the case fails); for fla, a
``use_graph=True`` capture that does not falls back to the plain capture, and the case fails
only when that one does not either. cudnn (:mod:`kdabench.bench.cudnn`): cuDNN frontend's
fused sm90 kernel on the same tensors (g and beta as fp32 copies, cu_seqlens as int32), one
output and final-state buffer per input set; its graph is a plain capture, checked the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kdabench.bench.backend import (
    CUDNN,
    DEFAULT_BACKENDS,
    FLA,
    KDABENCH,
    KDABENCH_BASELINE,
    KDABENCH_C1,
    KernelCalls,
    Outputs,
    Prepared,
    backend_kernel,
    import_failure,
)
from kdabench.bench.breakdown import cuda_kernel_profiler
from kdabench.bench.gates import GateRegime, draw_inputs
from kdabench.bench.replay import check_replays
from kdabench.bench.shapes import BenchShape, ShapeSet
from kdabench.bench.timing import capture_graph, cuda_event_timer
from kdabench.bench.work import CHECKPOINTS, Ceilings, count_bytes
from kdabench.inputs import KdaInputs
from kdabench.kernel_records import backend_and_config, plan_record
from kdabench.stats import median

DEFAULT_L2_BYTES = 50 * 1024 * 1024
MIN_INPUT_SETS = 3
MAX_INPUT_SETS = 32
COPY_BYTES = 1 << 30  # per side of the ceiling copy
MATMUL_SIZE = 8192
CEILING_REPS = 30


def input_set_count(set_bytes: int, l2_bytes: int, minimum: int = MIN_INPUT_SETS) -> int:
    """At least ``minimum`` sets, and enough that together they hold twice the L2."""
    return min(max(minimum, math.ceil(2 * l2_bytes / max(set_bytes, 1))), MAX_INPUT_SETS)


def rotated_sets(base: KdaInputs, count: int) -> list[KdaInputs]:
    """``base`` and ``count - 1`` rolled copies of it (module docstring)."""
    tokens = base.q.shape[0]
    sets = [base]
    for index in range(1, count):
        shift = index * tokens // count

        def roll(t: torch.Tensor, shift: int = shift) -> torch.Tensor:
            return torch.roll(t, shifts=shift, dims=0).contiguous()

        state = base.initial_state
        if state is not None:
            state = torch.roll(state, shifts=index, dims=0) * (-1.0 if index % 2 else 1.0)
            state = state.contiguous()
        sets.append(dataclasses.replace(base, q=roll(base.q), k=roll(base.k), v=roll(base.v),
                                        g=roll(base.g), beta=roll(base.beta),
                                        initial_state=state))
    return sets


def checkpoint_offsets(seq_len: int, capacity: int) -> list[int]:
    """The active checkpoint offsets of one sequence (module docstring)."""
    if capacity == 1:
        return [seq_len // 2]
    if capacity == 2:
        return [seq_len // 3, 2 * seq_len // 3]
    offsets = [seq_len // 5, 2 * seq_len // 5, 3 * seq_len // 5 + 3, 4 * seq_len // 5 + 3]
    if not (1 <= offsets[0] and all(a < b for a, b in itertools.pairwise(offsets))
            and offsets[-1] <= seq_len - 1):
        raise ValueError(f"sequences of {seq_len} tokens are too short for four interior "
                         "checkpoints (need >= 32)")
    return offsets


@dataclasses.dataclass
class KdabenchRun:
    """One binding of a kdabench plan to one input set, with its pool."""

    binding: Any
    pool: torch.Tensor
    final_slots: torch.Tensor

    @property
    def written(self) -> torch.Tensor:
        """The pool slots a run writes, final states and checkpoints (a view of the pool)."""
        return self.pool[self.final_slots.numel():]


def kdabench_runs(kernels: Any, sets: Sequence[KdaInputs], shape: BenchShape, capacity: int,
                  device: torch.device, *, config: Any = None, policy_mode: str | None = None,
                  backend: str = "triton") -> tuple[Any, list[KdabenchRun]]:
    """A plan for ``capacity`` on kernel ``backend`` and a binding per input set (module
    docstring).

    config: an explicit KernelConfig (tuning) or CuteConfig (a pinned key split, "cute-s<N>");
    else the plan resolves one under policy_mode.
    """
    first = sets[0]
    heads, dim, n = shape.heads, first.q.shape[2], shape.seqs
    slots = n * (2 + CHECKPOINTS)
    caps = kernels.Caps(device=device, num_heads=heads, head_dim=dim, max_tokens=shape.tokens,
                        max_seqs=n, max_state_slots=slots, max_checkpoints=capacity,
                        gate=first.gate, lower_bound=first.lower_bound,
                        qk_l2norm=first.qk_l2norm, beta_sigmoid=first.beta_sigmoid,
                        backend=backend)
    plan = kernels.plan(caps, config, policy_mode=policy_mode, activation_dtype=first.q.dtype,
                        own_output=False)

    def index(values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    offsets = checkpoint_offsets(shape.seq_len, capacity)
    ck_offsets = [offsets for _ in range(n)]
    ck_slots = [[2 * n + CHECKPOINTS * s + c for c in range(capacity)] for s in range(n)]
    if capacity == 1:
        ck_offsets, ck_slots = [row[0] for row in ck_offsets], [row[0] for row in ck_slots]
    runs = []
    for x in sets:
        pool = torch.zeros(slots, heads, dim, dim, dtype=torch.float32, device=device)
        pool[:n] = x.initial_state
        final_slots = index(list(range(n, 2 * n)))
        binding = kernels.bind(
            plan, x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
            cu_seqlens=x.cu_seqlens.to(torch.int32),
            initial_state_indices=index(list(range(n))), final_state_indices=final_slots,
            checkpoint_offsets=index(ck_offsets), checkpoint_state_indices=index(ck_slots),
            A_log=x.A_log, dt_bias=x.dt_bias, out=torch.empty_like(x.v),
        )
        runs.append(KdabenchRun(binding, pool, final_slots))
    return plan, runs


AUTOTUNE_CACHE_VARIABLE = "TRITON_CACHE_AUTOTUNING"


@dataclasses.dataclass(frozen=True)
class FlaSet:
    """fla's arguments for one input set (:func:`fla_sets`): q, k, v, g, beta with a batch
    dimension, the initial state as [N, H, K, V], the shape's int64 cu_seqlens.

    Made once per set and held for as long as the set's calls and graphs live: a captured
    graph reads its inputs by address, so a tensor made for one call and freed after the
    capture (as a transposed initial state made inside a closure would be) leaves the replays
    reading whatever memory took its place. fla also caches what it derives from cu_seqlens by
    the tensor's identity, four entries deep (``fla.utils.tensor_cache``), so every set of a
    shape passes one cu_seqlens object."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    initial_state: torch.Tensor
    cu_seqlens: torch.Tensor
    lower_bound: float


def fla_sets(sets: Sequence[KdaInputs]) -> list[FlaSet]:
    """fla's arguments for each input set; the sets share their lengths (ValueError if not)."""
    first = sets[0].cu_seqlens
    if any(not torch.equal(x.cu_seqlens, first) for x in sets[1:]):
        raise ValueError("the input sets of one shape must share their cu_seqlens")
    cu_seqlens = first.to(torch.int64)
    return [FlaSet(*(t.unsqueeze(0) for t in (x.q, x.k, x.v, x.g, x.beta)),
                   initial_state=x.initial_state.transpose(-1, -2).contiguous(),
                   cu_seqlens=cu_seqlens, lower_bound=x.lower_bound) for x in sets]


def fla_call(chunk_kda: Callable, s: FlaSet, *, graph_mode: bool = False
             ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """A closure calling fla's chunk_kda on ``s`` (eagerly, or with fla's ``use_graph``)."""
    extra = {"use_graph": True, "max_num_seqs": s.cu_seqlens.numel() - 1} if graph_mode else {}

    def call():
        with torch.inference_mode():
            return chunk_kda(s.q, s.k, s.v, s.g, s.beta, initial_state=s.initial_state,
                             output_final_state=True, cu_seqlens=s.cu_seqlens, safe_gate=True,
                             lower_bound=s.lower_bound, **extra)
    return call


def import_fla() -> tuple[Callable | None, str | None]:
    """fla's chunk_kda, or None and the reason it cannot be imported.

    Before the import, TRITON_CACHE_AUTOTUNING defaults to 1: fla's autotuners (made when fla
    is imported) then keep their choices in Triton's on-disk cache, so only the first run on
    a machine pays for autotuning (the receipt's config says whether it was on)."""
    os.environ.setdefault(AUTOTUNE_CACHE_VARIABLE, "1")
    try:
        from fla.ops.kda import chunk_kda
    except Exception as error:  # noqa: BLE001 - a missing or broken install is a reason
        return None, import_failure("fla", error, "kdabench[bench]",
                                    "(fla-core 0.6.0) to compare against fla's chunk_kda")
    return chunk_kda, None


class CudaBackend:
    """Real kernels on the current CUDA device (see the module docstring)."""

    def __init__(self) -> None:
        self.timer = cuda_event_timer
        self.profiler = cuda_kernel_profiler
        self._peers: dict[str, tuple[Any, str | None]] = {}  # peer: (its entry, why not)

    def unavailable(self) -> str | None:
        if not torch.cuda.is_available():
            return ("kdabench bench needs a CUDA GPU and torch sees none here "
                    "(torch.cuda.is_available() is False)")
        if os.environ.get("TRITON_INTERPRET") == "1":
            return "TRITON_INTERPRET=1 is set: unset it to benchmark the compiled kernels"
        return None

    def identity(self) -> dict[str, Any]:
        from kdabench.environment import device_identity

        return device_identity("cuda")

    def peer_unavailable(self, peer: str) -> str | None:
        if peer not in self._peers:
            if peer == FLA:
                self._peers[peer] = import_fla()
            elif peer == CUDNN:
                from kdabench.bench.cudnn import import_cudnn_kda

                self._peers[peer] = import_cudnn_kda()
            else:
                self._peers[peer] = (None, f"no peer kernel named {peer!r}")
        return self._peers[peer][1]

    def backend_unavailable(self, backend: str, shapes: ShapeSet) -> str | None:
        from kdabench import kernels as kda

        backend, _ = backend_and_config(backend)
        caps = kda.Caps(device=torch.device("cuda", torch.cuda.current_device()), num_heads=1,
                        head_dim=shapes.head_dim, max_tokens=1, max_seqs=1,
                        max_state_slots=2 + CHECKPOINTS, max_checkpoints=CHECKPOINTS,
                        lower_bound=shapes.lower_bound, backend=backend)
        reasons = kda.ineligibility(caps)
        return "cannot plan this KDA prefill: " + "; ".join(reasons) if reasons else None

    def l2_bytes(self) -> int:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return int(getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES)

    def ceilings(self) -> Ceilings:
        device = torch.device("cuda", torch.cuda.current_device())
        copy = self.timer([_copy_call(device)], 3, CEILING_REPS)
        matmul = self.timer([_matmul_call(device)], 3, CEILING_REPS)
        torch.cuda.empty_cache()
        copy_ms, matmul_ms = median(copy), median(matmul)
        return Ceilings(
            copy_bytes_per_s=2 * COPY_BYTES / (copy_ms / 1e3),
            matmul_flops_per_s=2 * MATMUL_SIZE**3 / (matmul_ms / 1e3),
            details={"copy": {"bytes_each_way": COPY_BYTES, "counted": "read + written",
                              "median_ms": copy_ms, "samples_ms": copy},
                     "matmul": {"m": MATMUL_SIZE, "n": MATMUL_SIZE, "k": MATMUL_SIZE,
                                "dtype": "bfloat16", "data": "randn", "median_ms": matmul_ms,
                                "samples_ms": matmul}},
        )

    def prepare(self, shape: BenchShape, shapes: ShapeSet, kernels: Sequence[str],
                modes: Sequence[str], gates: GateRegime, policy_mode: str | None = None,
                baseline_policy: str | None = None,
                backends: Sequence[str] = DEFAULT_BACKENDS) -> Prepared:
        from kdabench import kernels as kda

        device = torch.device("cuda", torch.cuda.current_device())
        set_bytes = count_bytes(shape.tokens, shape.heads, shapes.head_dim, shape.seqs)
        count = input_set_count(set_bytes, self.l2_bytes())
        base, gate_stats = draw_inputs(shape, shapes, gates, device)
        sets = rotated_sets(base, count)
        calls: dict[str, KernelCalls] = {}
        plans: dict[str, Any] = {}
        kda_runs: dict[str, list[KdabenchRun]] = {}
        resolved: dict[str, dict[str, Any]] = {}
        first, *others = backends
        specs = [(KDABENCH, CHECKPOINTS, policy_mode, first), (KDABENCH_C1, 1, policy_mode, first),
                 (KDABENCH_BASELINE, CHECKPOINTS, baseline_policy, first)]
        specs += [(backend_kernel(b), CHECKPOINTS, policy_mode, b) for b in others]
        for name, capacity, mode, backend_name in specs:
            if name not in kernels:
                continue
            backend, config = backend_and_config(backend_name)
            plan, runs = kdabench_runs(kda, sets, shape, capacity, device, config=config,
                                       policy_mode=mode, backend=backend)
            plans[name] = plan
            resolved[name] = plan_record(plan)
            kda_runs[name] = runs
            eager = [(lambda b=r.binding: kda.run(b)) for r in runs]
            calls[name] = KernelCalls(eager=eager)
            if "graph" in modes:
                captured = [capture_graph(call) for call in eager]
                replays = check_replays(
                    [(graph, (result.o, run.written)) for (graph, result), run
                     in zip(captured, runs, strict=True)],
                    [(lambda call=call, run=run: (call().o, run.written)) for call, run
                     in zip(eager, runs, strict=True)])
                calls[name].replay_check = replays
                calls[name].graph = None if replays["problem"] else \
                    [graph.replay for graph, _ in captured]
                calls[name].graph_note = replays["problem"] or \
                    "plan/bind once per input set; run(binding) captured; every replay checked"
        fla_calls: list[Callable] = []
        fla_inputs: list[FlaSet] = []
        if FLA in kernels:
            chunk_kda = self._peers[FLA][0]
            fla_inputs = fla_sets(sets)  # held until release: graphs read them
            fla_calls = [fla_call(chunk_kda, s) for s in fla_inputs]
            calls[FLA] = KernelCalls(eager=fla_calls)
            if "graph" in modes:
                calls[FLA].graph, calls[FLA].graph_note, calls[FLA].replay_check = \
                    _capture_fla(chunk_kda, fla_inputs)

        cudnn_calls: list[Callable] = []
        if CUDNN in kernels:
            cudnn_calls = _cudnn_calls(self._peers[CUDNN][0], sets)
            calls[CUDNN] = KernelCalls(eager=cudnn_calls)
            if "graph" in modes:
                calls[CUDNN].graph, calls[CUDNN].graph_note, calls[CUDNN].replay_check = \
                    _capture_plain(cudnn_calls)

        def outputs() -> Outputs:
            found = Outputs()
            for name, runs in kda_runs.items():
                run = runs[0]
                result = kda.run(run.binding)
                result.raise_for_error()
                found.output[name] = result.o.float().clone()
                found.final_state[name] = run.pool[run.final_slots.long()].clone()
            if fla_calls:
                o, final = fla_calls[0]()
                found.output[FLA] = o[0].float().clone()
                found.final_state[FLA] = final.transpose(-1, -2).float().clone()
            if cudnn_calls:
                o, final = cudnn_calls[0]()
                found.output[CUDNN] = o.float().clone()
                found.final_state[CUDNN] = final.float().clone()
            torch.cuda.synchronize()
            return found

        def check() -> list[str]:
            torch.cuda.synchronize()
            problems = []
            for name, plan in plans.items():
                code = int(plan.error_code.item())
                if code:
                    problems.append(f"{name} (capacity {plan.caps.max_checkpoints}): error code "
                                    f"{code} ({kda.decode_error_code(code)})")
            return problems

        def release() -> None:
            calls.clear()
            kda_runs.clear()
            fla_calls.clear()
            fla_inputs.clear()
            cudnn_calls.clear()
            plans.clear()
            sets.clear()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

        return Prepared(input_sets=count, input_set_bytes=set_bytes, calls=calls,
                        outputs=outputs, check=check, release=release,
                        details={"l2_bytes": self.l2_bytes(), "kernel_configs": resolved},
                        gate_stats=gate_stats)


def _capture_fla(chunk_kda: Callable, sets: Sequence[FlaSet]
                 ) -> tuple[list[Callable] | None, str, dict[str, Any] | None]:
    """Graph replays of fla, one per set, the note and the replay check: fla's graph mode
    first, then a plain capture. The check is None when no capture could be made at all; it
    has a ``problem`` when captures were made and none replays what an eager call computes."""
    failures = []
    rejected = None
    for graph_mode, label in ((True, "use_graph=True"), (False, "plain call")):
        try:
            captured = [capture_graph(fla_call(chunk_kda, s, graph_mode=graph_mode))
                        for s in sets]
        except Exception as error:  # noqa: BLE001 - a failed capture is recorded, not fatal
            failures.append(f"{label}: {type(error).__name__}: {str(error)[:200]}")
            with contextlib.suppress(Exception):  # a broken capture may leave an error behind
                torch.cuda.synchronize()
            continue
        replays = check_replays([(graph, _output_and_state(out)) for graph, out in captured],
                                [_outputs(fla_call(chunk_kda, s)) for s in sets])
        if replays["problem"]:
            failures.append(f"{label}: {replays['problem']}")
            rejected = replays
            continue
        note = f"captured with {label}; every replay checked"
        if failures:
            note += " (" + "; ".join(failures) + ")"
        return [graph.replay for graph, _ in captured], note, replays
    note = "fla graph capture failed: " + "; ".join(failures)
    return None, note, None if rejected is None else {**rejected, "problem": note}


def _cudnn_calls(cuda_host: Any, sets: Sequence[KdaInputs]) -> list[Callable]:
    """One cuDNN call per input set, each with its own output and final-state buffers (so a
    graph per set writes its own); the first call compiles the kernel if no earlier one did."""
    from kdabench.bench.cudnn import cudnn_call

    return [cudnn_call(cuda_host, x) for x in sets]


def _capture_plain(calls: Sequence[Callable[[], Any]]
                   ) -> tuple[list[Callable] | None, str, dict[str, Any] | None]:
    """A plain graph capture of each call, every replay checked against an eager call: the
    replays (None when a capture failed or a replay differs), the note and the check."""
    try:
        captured = [capture_graph(call) for call in calls]
    except Exception as error:  # noqa: BLE001 - a failed capture is recorded, not fatal
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        return None, f"graph capture failed: {type(error).__name__}: {str(error)[:200]}", None
    replays = check_replays([(graph, out) for graph, out in captured], list(calls))
    if replays["problem"]:
        return None, replays["problem"], replays
    return ([graph.replay for graph, _ in captured],
            "plain capture of the launch; every replay checked", replays)


def _output_and_state(result: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, final_state): the first two things chunk_kda returns with output_final_state."""
    o, final, *_ = result
    return o, final


def _outputs(call: Callable[[], Any]) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """``call`` (an fla call) returning its output and final state."""
    return lambda: _output_and_state(call())


def _copy_call(device: torch.device) -> Callable[[], Any]:
    source = torch.randn(COPY_BYTES // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    return lambda: target.copy_(source)


def _matmul_call(device: torch.device) -> Callable[[], Any]:
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=torch.bfloat16, device=device)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=torch.bfloat16, device=device)
    c = torch.empty_like(a)
    return lambda: torch.matmul(a, b, out=c)

