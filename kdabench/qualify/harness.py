"""What the scenario runners share: the context of a run, the outcome of a case, one kernel
call (inputs, pool, caps, timing), the checks of accepted and rejected metadata, and the
valid and rejected runs that more than one scenario starts from.

The kernels are imported lazily (`kernels_api()`): the CPU tier sets TRITON_INTERPRET=1, which
works only before `kdabench.kernels` is first imported.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kdabench.inputs import KdaInputs, make_inputs
from kdabench.kernel_records import config_record
from kdabench.matrix import Case
from kdabench.oracles import recurrent_kda, relative_error
from kdabench.qualify.metadata import Metadata, build_metadata

SENTINEL = 0.25  # the value of every pool slot that no sequence reads


def kernels_api():
    from kdabench import kernels

    return kernels


# --------------------------------------------------------------------------- context


@dataclass
class Context:
    """What every runner needs: where it runs, which backend (and the config a backend name
    such as cute-s2 pins; None: the policy's), the timing and the seed."""

    device: torch.device
    tier: str
    backend: str
    timing: Mapping[str, int] | None  # None: no timing (CPU tier)
    matrix_seed: int = 0
    config: Any = None

    def rng(self, case: Case, salt: str = "") -> random.Random:
        return random.Random(f"{self.matrix_seed}/{case.id}/{salt}")

    def seed(self, case: Case, salt: str = "") -> int:
        return zlib.crc32(f"{self.matrix_seed}/{case.id}/{salt}".encode())

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"


@dataclass
class Outcome:
    """What a runner found; failures decide the verdict."""

    errors: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    shape: dict[str, Any] = field(default_factory=dict)
    samples_ms: list[float] = field(default_factory=list)
    kernel: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    note: str | None = None  # the message of a case that passes (failures take its place)

    def require(self, ok: bool, message: str) -> None:
        if not ok:
            self.failures.append(message)

    def within(self, name: str, error: float, tolerance: float) -> None:
        self.errors[name] = max(error, self.errors.get(name, 0.0))
        self.require(error <= tolerance,
                     f"{name} error {error:.3e} exceeds tolerance {tolerance:.1e}")


def case_inputs(ctx: Context, case: Case, lengths: Sequence[int], salt: str = "") -> KdaInputs:
    p = case.params
    return make_inputs(
        list(lengths), p["heads"], p["head_dim"], gate=p.get("gate", "precomputed"),
        lower_bound=p.get("lower_bound", -5.0), qk_l2norm=p.get("qk_l2norm", False),
        beta_sigmoid=p.get("beta_sigmoid", False), with_initial_state=True,
        seed=ctx.seed(case, salt), device=ctx.device,
    )


def index_dtype(case: Case) -> torch.dtype:
    return torch.int64 if case.params.get("index_dtype") == "int64" else torch.int32


def shape_record(meta: Metadata) -> dict[str, Any]:
    return {"num_seqs": len(meta.initial), "tokens": meta.cu_seqlens[-1],
            "lengths": meta.lengths, "num_slots": meta.num_slots,
            "active_checkpoints": len(meta.active_entries())}


def make_pool(ctx: Context, meta: Metadata, x: KdaInputs) -> torch.Tensor:
    """The state pool: SENTINEL everywhere, each sequence's initial state in its slot
    (slots out of range, which faults ask for, are left out)."""
    H, D = x.q.shape[1], x.q.shape[2]
    pool = torch.full((meta.num_slots, H, D, D), SENTINEL, dtype=torch.float32,
                      device=ctx.device)
    load_initial(pool, meta, x, range(meta.num_slots))
    return pool


def load_initial(pool: torch.Tensor, meta: Metadata, x: KdaInputs, valid: range) -> None:
    for n, slot in enumerate(meta.initial[: x.initial_state.shape[0]]):
        if slot in valid:
            pool[slot] = x.initial_state[n]


def case_caps(ctx: Context, case: Case, meta: Metadata, tokens: int):
    p = case.params
    return kernels_api().Caps(
        device=ctx.device, num_heads=p["heads"], head_dim=p["head_dim"],
        max_tokens=max(tokens, 1), max_seqs=max(len(meta.initial), 1),
        max_state_slots=max(meta.num_slots, 1), max_checkpoints=p["capacity"],
        gate=p.get("gate", "precomputed"), lower_bound=p.get("lower_bound", -5.0),
        qk_l2norm=p.get("qk_l2norm", False), beta_sigmoid=p.get("beta_sigmoid", False),
        backend=ctx.backend,
    )


def kernel_record(ctx: Context, caps, activation_dtype=torch.bfloat16) -> dict[str, Any]:
    """What kda_prefill resolves for a call with these caps: its config, source and mode
    (resolved as plan() does, without allocating a second plan's workspaces)."""
    kernels = kernels_api()
    if ctx.config is not None:  # the backend name's pinned config, given to plan()
        return config_record(ctx.config, kernels.EXPLICIT_SOURCE, kernels.resolve_mode().value)
    resolved = kernels.resolve_config(caps, activation_dtype=activation_dtype)
    return config_record(resolved.config, resolved.source, resolved.mode.value)


def prefill_call(ctx: Context, x: KdaInputs, meta: Metadata, pool: torch.Tensor, dtype, *,
             out: torch.Tensor | None = None, rows: torch.Tensor | None = None):
    """A closure making one functional kda_prefill call (no host sync) -> KdaResult."""
    kernels = kernels_api()
    tensors = meta.tensors(ctx.device, dtype)
    q, k, v, g, beta = x.q, x.k, x.v, x.g, x.beta
    if rows is not None:
        q, k, v, g, beta = (t[rows] for t in (q, k, v, g, beta))
    gate = x.gate_kwargs()

    def call():
        return kernels.kda_prefill(q, k, v, g, beta, state_pool=pool, out=out, **tensors, **gate,
                                   backend=ctx.backend, config=ctx.config)
    return call


def result_of(result) -> tuple[torch.Tensor, int]:
    """(output, error code) of a KdaResult (synchronises)."""
    return result.o, int(result.error_code.item())


def time_call(ctx: Context, call: Callable[[], Any]) -> list[float]:
    """Raw CUDA-event samples (ms) of `call` after warmup; [] on the CPU tier."""
    if not ctx.gpu or not ctx.timing:
        return []
    for _ in range(ctx.timing["warmup"]):
        call()
    events = []
    for _ in range(ctx.timing["reps"]):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return [round(start.elapsed_time(end), 5) for start, end in events]


# --------------------------------------------------------------------------- checks


def oracle(ctx: Context, x: KdaInputs, meta: Metadata, before):
    """The float64 recurrence over the live tokens, from the initial states the pool held."""
    zeros = torch.zeros_like(x.initial_state[0])
    initial = torch.stack([before[slot] if slot >= 0 else zeros for slot in meta.initial])
    tokens = meta.cu_seqlens[-1]
    return recurrent_kda(
        x.q[:tokens], x.k[:tokens], x.v[:tokens], x.g[:tokens], x.beta[:tokens],
        cu_seqlens=meta.cu_seqlens, initial_state=initial, prefix_lengths=meta.actives(),
        device=ctx.device, **x.gate_kwargs(),
    )


def check_valid(out: Outcome, ctx: Context, case: Case, x: KdaInputs, meta: Metadata,
                pool: torch.Tensor, before: dict[int, torch.Tensor] | torch.Tensor,
                output: torch.Tensor, code: int, *, prefix: str = "", ref: Any = None) -> Any:
    """Accepted metadata: code 0, outputs, final states and checkpoints vs float64, and
    every snapshot slot nothing wrote unchanged bit for bit. Returns the oracle result
    (`ref`, when the caller already has it, else computed here)."""
    tol = case.options["tolerances"]
    if code:
        decoded = kernels_api().decode_error_code(code)
        out.failures.append(f"{prefix}valid metadata rejected: {decoded}")
        return None
    if ref is None:
        ref = oracle(ctx, x, meta, before)
    tokens = meta.cu_seqlens[-1]
    out.within("output", relative_error(ref.o, output[:tokens]), tol["output"])
    for n, slot in enumerate(meta.final):
        if slot >= 0:
            out.within("final_state", relative_error(ref.final_state[n], pool[slot]), tol["state"])
    for n, i, _, slot in meta.active_entries():
        out.within("checkpoint", relative_error(ref.prefix_states[n][i], pool[slot]),
                   tol["state"])
    written = meta.write_slots()
    untouched = _untouched(pool, before, written)
    out.checks["unwritten_slots_unchanged"] = untouched and out.checks.get(
        "unwritten_slots_unchanged", True)
    out.require(untouched, f"{prefix}a slot that no destination names was written")
    return ref


def _untouched(pool: torch.Tensor, before, written: set[int]) -> bool:
    if isinstance(before, dict):  # a snapshot of some slots (huge pools)
        return all(torch.equal(pool[s], saved) for s, saved in before.items() if s not in written)
    keep = [s for s in range(pool.shape[0]) if s not in written]
    return bool(torch.equal(pool[keep], before[keep]))


def check_rejected(out: Outcome, pool: torch.Tensor, before: torch.Tensor, output: torch.Tensor,
                   code: int, expected: int, oracle_code: int, *, prefix: str = "") -> None:
    """Rejected metadata: the exact code, the pool bit for bit unchanged, the output all NaN."""
    out.checks.setdefault("error_code", code)
    out.checks.setdefault("expected_error_code", expected)
    out.require(oracle_code == expected, f"{prefix}kdabench.oracles.metadata expects code "
                f"{oracle_code}, the fault table {expected}")
    out.require(code == expected, f"{prefix}error code {code}, expected {expected}")
    same = bool(torch.equal(pool, before))
    nan = bool(torch.isnan(output).all())
    out.checks["pool_unchanged"] = same and out.checks.get("pool_unchanged", True)
    out.checks["output_all_nan"] = nan and out.checks.get("output_all_nan", True)
    out.require(same, f"{prefix}the pool changed although the metadata was rejected")
    out.require(nan, f"{prefix}the output is not all NaN although the metadata was rejected")


# --------------------------------------------------------------------------- shared runs


def valid_run(ctx: Context, case: Case, *, scatter: bool = False):
    p = case.params
    rng = ctx.rng(case)
    x = case_inputs(ctx, case, case.lengths)
    meta = build_metadata(case.lengths, p["capacity"], p["offsets"], rng, scatter=scatter)
    return x, meta, rng


def fault_base(ctx: Context, case: Case) -> tuple[KdaInputs, Metadata, random.Random]:
    """Valid metadata with every initial slot set, so that any fault can be built on it."""
    rng = ctx.rng(case)
    x = case_inputs(ctx, case, case.lengths)
    meta = build_metadata(case.lengths, case.params["capacity"], case.params["offsets"], rng,
                          initial_share=1.0)
    return x, meta, rng


def rejected_run(ctx: Context, case: Case, x: KdaInputs, meta: Metadata, expected: int,
                  out: Outcome) -> None:
    """Run metadata that must be rejected (planned path when it sets a live count)."""
    dtype = index_dtype(case)
    pool = make_pool(ctx, meta, x)
    before = pool.clone()
    oracle_code = meta.expected_code(x.q.shape[0])
    if meta.num_seqs is None:
        call = prefill_call(ctx, x, meta, pool, dtype)
    else:  # the live count is a planned-path input
        kernels = kernels_api()
        planned = kernels.plan(case_caps(ctx, case, meta, x.q.shape[0]), ctx.config)
        binding = kernels.bind(planned, x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                               num_seqs=meta.num_seqs, A_log=x.A_log, dt_bias=x.dt_bias,
                               **meta.tensors(ctx.device, dtype))

        def call():
            return kernels.run(binding)
    output, code = result_of(call())
    out.shape = shape_record(meta)
    check_rejected(out, pool, before, output, code, expected, oracle_code)
    out.checks["oracle_error_code"] = oracle_code
    out.kernel = kernel_record(ctx, case_caps(ctx, case, meta, x.q.shape[0]))
    out.samples_ms = time_call(ctx, call)
