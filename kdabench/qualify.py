"""Running a qualification matrix: one runner per scenario, the run loop, and the receipt.

    from kdabench.matrix import load_matrix
    from kdabench.qualify import Qualification

    run = Qualification(load_matrix(), tier="cpu", out_dir="results")
    result = run.run(on_case=print)          # writes results/qualify-<device>-<time>.json
    result.ok, result.receipt_path, result.by_scenario

Every case builds seeded inputs (kdabench.inputs) and metadata (slot indices, checkpoint
offsets) from its id, runs the kernel and checks it: outputs, final states and every
checkpoint against the float64 recurrence on the same device (relative Frobenius error,
tolerances from the matrix, recorded beside the measured error), pool slots that nothing
should write compared bit for bit, and for rejected metadata the exact error code (from the
fault table and from kdabench.oracles.metadata), an untouched pool and an all-NaN output.

A case's record: id, index, scenario, params, shape, errors, tolerances, checks, verdict
(pass / fail / error), message, median_ms and samples_ms (GPU: CUDA events around the call;
CPU tier: None and []), kernel_config and config_source (what plan() resolves for the call).

The CPU tier runs the Triton kernels under the interpreter: `prepare_tier("cpu")` sets
TRITON_INTERPRET=1, which works only before `kdabench.kernels` is first imported, so this
module imports the kernels lazily.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import random
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kdabench.inputs import KdaInputs, lengths_with_edges, make_inputs
from kdabench.matrix import FAULT_VARIANTS, OFFSET_MODES, Case, Matrix, MatrixError, select_cases
from kdabench.oracles import chunk_kda_mirror, prefix_batch, recurrent_kda, relative_error
from kdabench.oracles.metadata import expected_error_code
from kdabench.receipts import new_receipt

CHUNK = 16  # tokens per chunk: "aligned" offsets are its multiples
SENTINEL = 0.25  # the value of every pool slot that no sequence reads
INT32_LINE = 2**31  # elements: slots past it need 64-bit addressing

DUPLICATE, MALFORMED, OUT_OF_RANGE, BAD_OFFSET = 1, 2, 4, 8
FAULT_BITS = {
    "duplicate-final": DUPLICATE, "duplicate-final-checkpoint": DUPLICATE,
    "duplicate-checkpoint": DUPLICATE, "write-aliases-initial": DUPLICATE,
    "lengths-decreasing": MALFORMED, "lengths-nonzero-start": MALFORMED,
    "lengths-past-capacity": MALFORMED, "live-count-zero": MALFORMED,
    "live-count-over-capacity": MALFORMED,
    "slot-range-initial": OUT_OF_RANGE, "slot-range-final": OUT_OF_RANGE,
    "slot-range-checkpoint": OUT_OF_RANGE, "slot-negative": OUT_OF_RANGE,
    "offset-zero": BAD_OFFSET, "offset-at-length": BAD_OFFSET, "offset-past-length": BAD_OFFSET,
    "offset-not-increasing": BAD_OFFSET, "offset-equal": BAD_OFFSET,
}
FOURTH_BITS = {"out-of-range": OUT_OF_RANGE, "negative": OUT_OF_RANGE,
               "duplicate-final": DUPLICATE, "duplicate-checkpoint": DUPLICATE,
               "aliases-initial": DUPLICATE}


class QualifyError(ValueError):
    """A run that cannot start (no GPU for the GPU tier, unknown backend); one line."""


class CannotBuild(Exception):
    """The case's layout cannot carry what the scenario asks (e.g. no room for 4 offsets)."""


# --------------------------------------------------------------------------- tiers


def default_tier() -> str:
    """'gpu' when torch sees a CUDA device, else 'cpu'."""
    return "gpu" if torch.cuda.is_available() else "cpu"


def _kernels_interpreted() -> bool | None:
    """Whether the imported kernels are interpreted; None when not imported yet."""
    launch = sys.modules.get("kdabench.kernels.triton.launch")
    return None if launch is None else bool(launch.interpreted())


def prepare_tier(tier: str) -> torch.device:
    """Set the process up for a tier and return its device (raises QualifyError)."""
    interpreted = _kernels_interpreted()
    if tier == "cpu":
        if interpreted is False:
            raise QualifyError(
                "the kernels were already imported compiled for the GPU; run the CPU tier in a "
                "fresh process"
            )
        os.environ["TRITON_INTERPRET"] = "1"
        return torch.device("cpu")
    if tier != "gpu":
        raise QualifyError(f"unknown tier {tier!r}; expected cpu or gpu")
    if not torch.cuda.is_available():
        raise QualifyError(
            "--tier gpu needs a CUDA GPU and torch sees none here "
            "(torch.cuda.is_available() is False); run --tier cpu instead"
        )
    if interpreted or (interpreted is None and os.environ.get("TRITON_INTERPRET") == "1"):
        raise QualifyError("TRITON_INTERPRET=1 is set: unset it to run the GPU tier")
    return torch.device("cuda", torch.cuda.current_device())


def _kernels():
    from kdabench import kernels

    return kernels


# --------------------------------------------------------------------------- metadata


@dataclass
class Metadata:
    """Host-side metadata of one call: lists of ints, turned into tensors per call.

    offsets/slots hold C entries per sequence; slot -1 marks an inactive entry (its offset
    may be anything). num_seqs: the live count of a planned call (None: every sequence).
    """

    cu_seqlens: list[int]
    initial: list[int]
    final: list[int]
    offsets: list[list[int]]
    slots: list[list[int]]
    num_slots: int
    capacity: int
    num_seqs: int | None = None

    @property
    def lengths(self) -> list[int]:
        return [b - a for a, b in itertools.pairwise(self.cu_seqlens)]

    def actives(self) -> list[list[int]]:
        """Active offsets per sequence, in entry order (the oracle's prefix lengths)."""
        return [[o for o, s in zip(offs, slots, strict=True) if s >= 0]
                for offs, slots in zip(self.offsets, self.slots, strict=True)]

    def active_entries(self) -> list[tuple[int, int, int, int]]:
        """(sequence, position among its actives, offset, slot) of every active entry."""
        entries = []
        for n, (offs, slots) in enumerate(zip(self.offsets, self.slots, strict=True)):
            live = [(o, s) for o, s in zip(offs, slots, strict=True) if s >= 0]
            entries += [(n, i, o, s) for i, (o, s) in enumerate(live)]
        return entries

    def write_slots(self) -> set[int]:
        return {s for s in self.final if s >= 0} | {s for _, _, _, s in self.active_entries()}

    def expected_code(self, token_capacity: int) -> int:
        """The error code kdabench.oracles.metadata expects for this metadata."""
        num_seqs = len(self.initial) if self.num_seqs is None else self.num_seqs
        offsets = self.offsets if self.capacity > 1 else [row[0] for row in self.offsets]
        slots = self.slots if self.capacity > 1 else [row[0] for row in self.slots]
        return expected_error_code(self.cu_seqlens, num_seqs, self.initial, self.final,
                                   offsets, slots, self.num_slots, token_capacity)

    def tensors(self, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        def tensor(values) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        offsets, slots = tensor(self.offsets), tensor(self.slots)
        if self.capacity == 1:
            offsets, slots = offsets[:, 0].contiguous(), slots[:, 0].contiguous()
        return {"cu_seqlens": tensor(self.cu_seqlens),
                "initial_state_indices": tensor(self.initial),
                "final_state_indices": tensor(self.final),
                "checkpoint_offsets": offsets, "checkpoint_state_indices": slots}


def choose_offsets(length: int, capacity: int, mode: str, rng: random.Random) -> list[int]:
    """Up to `capacity` increasing checkpoint offsets in 1..length-1 placed as `mode` says."""
    candidates = range(1, length)
    if not candidates:
        return []
    if mode == "aligned":
        pool = [p for p in candidates if p % CHUNK == 0]
    elif mode == "unaligned":
        pool = [p for p in candidates if p % CHUNK]
    elif mode in ("first", "last"):
        forced = 1 if mode == "first" else length - 1
        rest = [p for p in candidates if p != forced]
        return sorted([forced, *rng.sample(rest, min(capacity - 1, len(rest)))])
    else:
        raise ValueError(f"unknown offsets mode {mode!r}")
    return sorted(rng.sample(pool, min(capacity, len(pool))))


def build_metadata(
    lengths: Sequence[int], capacity: int, mode: str, rng: random.Random, *,
    num_slots: int | None = None, initial_share: float = 0.75, scatter: bool = False,
) -> Metadata:
    """Valid metadata: distinct random slots, some null initial states, offsets per `mode`.

    scatter: spread the active entries among the inactive ones (keeping their order).
    """
    offsets, slots_needed = [], 0
    initial_wanted = [n == 0 or rng.random() < initial_share for n in range(len(lengths))]
    for length in lengths:
        active = choose_offsets(length, capacity, mode, rng)
        positions = sorted(rng.sample(range(capacity), len(active))) if scatter else \
            list(range(len(active)))
        row = [0] * capacity
        for position, offset in zip(positions, active, strict=True):
            row[position] = offset
        offsets.append((row, positions))
        slots_needed += len(active) + 1
    slots_needed += sum(initial_wanted)
    if num_slots is None:
        num_slots = slots_needed + 3
    if num_slots < slots_needed:
        raise CannotBuild(f"{slots_needed} slots needed, the pool has {num_slots}")
    free = iter(rng.sample(range(num_slots), slots_needed))
    initial = [next(free) if wanted else -1 for wanted in initial_wanted]
    final = [next(free) for _ in lengths]
    slot_rows = []
    for _, positions in offsets:
        row = [-1] * capacity
        for position in positions:
            row[position] = next(free)
        slot_rows.append(row)
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    return Metadata(cu, initial, final, [row for row, _ in offsets], slot_rows, num_slots,
                    capacity)


# --------------------------------------------------------------------------- context


@dataclass
class Context:
    """What every runner needs: where it runs, which backend, the timing and the seed."""

    device: torch.device
    tier: str
    backend: str
    timing: Mapping[str, int] | None  # None: no timing (CPU tier)
    matrix_seed: int = 0

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

    def require(self, ok: bool, message: str) -> None:
        if not ok:
            self.failures.append(message)

    def within(self, name: str, error: float, tolerance: float) -> None:
        self.errors[name] = max(error, self.errors.get(name, 0.0))
        self.require(error <= tolerance,
                     f"{name} error {error:.3e} exceeds tolerance {tolerance:.1e}")


def _inputs(ctx: Context, case: Case, lengths: Sequence[int], salt: str = "") -> KdaInputs:
    p = case.params
    return make_inputs(
        list(lengths), p["heads"], p["head_dim"], gate=p.get("gate", "precomputed"),
        lower_bound=p.get("lower_bound", -5.0), qk_l2norm=p.get("qk_l2norm", False),
        beta_sigmoid=p.get("beta_sigmoid", False), with_initial_state=True,
        seed=ctx.seed(case, salt), device=ctx.device,
    )


def _index_dtype(case: Case) -> torch.dtype:
    return torch.int64 if case.params.get("index_dtype") == "int64" else torch.int32


def _shape(meta: Metadata) -> dict[str, Any]:
    return {"num_seqs": len(meta.initial), "tokens": meta.cu_seqlens[-1],
            "lengths": meta.lengths, "num_slots": meta.num_slots,
            "active_checkpoints": len(meta.active_entries())}


def _make_pool(ctx: Context, meta: Metadata, x: KdaInputs) -> torch.Tensor:
    """The state pool: SENTINEL everywhere, each sequence's initial state in its slot
    (slots out of range, which faults ask for, are left out)."""
    H, D = x.q.shape[1], x.q.shape[2]
    pool = torch.full((meta.num_slots, H, D, D), SENTINEL, dtype=torch.float32,
                      device=ctx.device)
    _load_initial(pool, meta, x, range(meta.num_slots))
    return pool


def _load_initial(pool: torch.Tensor, meta: Metadata, x: KdaInputs, valid: range) -> None:
    for n, slot in enumerate(meta.initial[: x.initial_state.shape[0]]):
        if slot in valid:
            pool[slot] = x.initial_state[n]


def _caps(ctx: Context, case: Case, meta: Metadata, tokens: int):
    p = case.params
    return _kernels().Caps(
        device=ctx.device, num_heads=p["heads"], head_dim=p["head_dim"],
        max_tokens=max(tokens, 1), max_seqs=max(len(meta.initial), 1),
        max_state_slots=max(meta.num_slots, 1), max_checkpoints=p["capacity"],
        gate=p.get("gate", "precomputed"), lower_bound=p.get("lower_bound", -5.0),
        qk_l2norm=p.get("qk_l2norm", False), beta_sigmoid=p.get("beta_sigmoid", False),
        backend=ctx.backend,
    )


def _kernel_record(ctx: Context, caps) -> dict[str, Any]:
    """plan.config and plan.config_source for caps (what kda_prefill resolves for the call)."""
    planned = _kernels().plan(caps, own_output=False)
    return {"kernel_config": dataclasses.asdict(planned.config),
            "config_source": planned.config_source}


def _prefill(ctx: Context, x: KdaInputs, meta: Metadata, pool: torch.Tensor, dtype, *,
             out: torch.Tensor | None = None, rows: torch.Tensor | None = None):
    """A closure making one functional kda_prefill call (no host sync) -> KdaResult."""
    kernels = _kernels()
    tensors = meta.tensors(ctx.device, dtype)
    q, k, v, g, beta = x.q, x.k, x.v, x.g, x.beta
    if rows is not None:
        q, k, v, g, beta = (t[rows] for t in (q, k, v, g, beta))
    gate = x.gate_kwargs()

    def call():
        return kernels.kda_prefill(q, k, v, g, beta, state_pool=pool, out=out, **tensors, **gate)
    return call


def _result(result) -> tuple[torch.Tensor, int]:
    """(output, error code) of a KdaResult (synchronises)."""
    return result.o, int(result.error_code.item())


def _time(ctx: Context, call: Callable[[], Any]) -> list[float]:
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


def _oracle(ctx: Context, x: KdaInputs, meta: Metadata, before):
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
                output: torch.Tensor, code: int, *, prefix: str = "") -> Any:
    """Accepted metadata: code 0, outputs, final states and checkpoints vs float64, and
    every snapshot slot nothing wrote unchanged bit for bit. Returns the oracle result."""
    tol = case.options["tolerances"]
    if code:
        decoded = _kernels().decode_error_code(code)
        out.failures.append(f"{prefix}valid metadata rejected: {decoded}")
        return None
    ref = _oracle(ctx, x, meta, before)
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


# --------------------------------------------------------------------------- scenarios


def _valid_run(ctx: Context, case: Case, *, scatter: bool = False):
    p = case.params
    rng = ctx.rng(case)
    x = _inputs(ctx, case, case.lengths)
    meta = build_metadata(case.lengths, p["capacity"], p["offsets"], rng, scatter=scatter)
    return x, meta, rng


def run_accuracy(ctx: Context, case: Case, *, meta_edit=None, poison: bool = False) -> Outcome:
    """Outputs, final states and every checkpoint against the float64 recurrence.

    meta_edit(meta, rng, outcome) edits the metadata first (the inactive scenario);
    poison: the output buffer starts as NaN and every live row must be written.
    """
    out = Outcome()
    x, meta, rng = _valid_run(ctx, case, scatter=meta_edit is not None)
    if meta_edit is not None:
        meta_edit(meta, rng, out)
    dtype = _index_dtype(case)
    pool = _make_pool(ctx, meta, x)
    before = pool.clone()
    buffer = None
    if poison:
        buffer = torch.full(x.v.shape, float("nan"), dtype=x.v.dtype, device=ctx.device)
    call = _prefill(ctx, x, meta, pool, dtype, out=buffer)
    output, code = _result(call())
    out.shape = _shape(meta)
    out.checks["error_code"] = code
    if poison:
        finite = bool(torch.isfinite(output).all())
        out.checks["live_rows_finite"] = finite
        out.require(finite, "a live output row kept its NaN poison")
        out.require(output.data_ptr() == buffer.data_ptr(), "the output is not the buffer given")
    check_valid(out, ctx, case, x, meta, pool, before, output, code)
    out.kernel = _kernel_record(ctx, _caps(ctx, case, meta, x.q.shape[0]))
    out.samples_ms = _time(ctx, call)
    return out


def _deactivate(meta: Metadata, rng: random.Random, out: Outcome) -> None:
    """Inactive entries with garbage offsets, and null final slots (slots stay in the pool)."""
    entries = meta.active_entries()
    dropped = {(n, i) for n, i, _, _ in entries if rng.random() < 0.5}
    if entries and len(dropped) == len(entries):
        dropped.discard((entries[0][0], entries[0][1]))
    if entries and not dropped:
        dropped.add((entries[-1][0], entries[-1][1]))
    garbage = [0, -3, 2**30]
    for n, row in enumerate(meta.slots):
        live = [c for c, s in enumerate(row) if s >= 0]
        for i, c in enumerate(live):
            if (n, i) in dropped:
                row[c] = -1
                meta.offsets[n][c] = rng.choice([*garbage, meta.lengths[n] + 7])
        for c, s in enumerate(row):
            if s < 0 and (n, c) not in dropped:
                meta.offsets[n][c] = rng.choice(garbage)
    nulls = [n for n in range(len(meta.final)) if rng.random() < 0.34] or [len(meta.final) - 1]
    if len(meta.final) > 1 and len(nulls) == len(meta.final):
        nulls = nulls[1:]
    for n in nulls:
        meta.final[n] = -1
    inactive = sum(1 for row in meta.slots for s in row if s < 0)
    out.details.update(inactive_entries=inactive, null_final_slots=len(nulls))


def run_inactive(ctx: Context, case: Case) -> Outcome:
    """Inactive entries (with garbage offsets) and null final slots write nothing."""
    return run_accuracy(ctx, case, meta_edit=_deactivate)


def run_poisoned(ctx: Context, case: Case) -> Outcome:
    """An output poisoned with NaN before a valid run comes back finite in every live row."""
    return run_accuracy(ctx, case, poison=True)


def run_prefix(ctx: Context, case: Case) -> Outcome:
    """Checkpoints vs kernel runs over each prefix: bit for bit where the offset is aligned."""
    out = Outcome()
    x, meta, _ = _valid_run(ctx, case)
    dtype, capacity = _index_dtype(case), case.params["capacity"]
    pool = _make_pool(ctx, meta, x)
    before = pool.clone()
    call = _prefill(ctx, x, meta, pool, dtype)
    output, code = _result(call())
    out.shape = _shape(meta)
    out.checks["error_code"] = code
    check_valid(out, ctx, case, x, meta, pool, before, output, code)
    if code:
        return out
    batch = prefix_batch(meta.cu_seqlens, meta.actives())
    count = len(batch.owners)
    if not count:
        raise CannotBuild("no active checkpoint in this layout: nothing to compare")
    # One sequence per prefix, same capacity (all entries inactive), fresh final slots.
    initial = [meta.initial[n] for n, _ in batch.owners]
    prefix_meta = Metadata(
        cu_seqlens=batch.cu_seqlens.tolist(),
        initial=[i if initial[i] >= 0 else -1 for i in range(count)],
        final=[count + i for i in range(count)], offsets=[[1] * capacity] * count,
        slots=[[-1] * capacity] * count, num_slots=2 * count, capacity=capacity,
    )
    prefix_pool = torch.full((2 * count, *pool.shape[1:]), SENTINEL, dtype=pool.dtype,
                             device=ctx.device)
    for i, slot in enumerate(initial):
        if slot >= 0:
            prefix_pool[i] = before[slot]
    rows = batch.token_index.to(ctx.device)
    _, prefix_code = _result(_prefill(ctx, x, prefix_meta, prefix_pool, dtype, rows=rows)())
    out.require(prefix_code == 0, f"the prefix run was rejected (code {prefix_code})")
    aligned = equal = 0
    worst_abs, worst_unaligned = 0.0, 0.0
    entries = meta.active_entries()
    for i, (n, _, offset, slot) in enumerate(entries):
        mine, theirs = pool[slot], prefix_pool[count + i]
        if offset % CHUNK == 0:
            aligned += 1
            same = bool(torch.equal(mine, theirs))
            equal += same
            worst_abs = max(worst_abs, float((mine - theirs).abs().max()))
            out.require(same, f"checkpoint of sequence {n} at aligned offset {offset} differs "
                        f"from the prefix run's final state (max |diff| {worst_abs:.3e})")
        else:
            worst_unaligned = max(worst_unaligned, relative_error(theirs, mine))
    out.errors["prefix_aligned_max_abs"] = worst_abs
    if aligned < len(entries):
        out.within("prefix_unaligned", worst_unaligned, case.options["tolerances"]["state"])
    out.checks.update(aligned_checkpoints=aligned, aligned_bitwise_equal=equal)
    out.require(aligned > 0 or case.params["offsets"] != "aligned",
                "no aligned checkpoint fits this layout")
    out.kernel = _kernel_record(ctx, _caps(ctx, case, meta, x.q.shape[0]))
    out.samples_ms = _time(ctx, call)
    return out


# Fault mutations: edit valid metadata in place so that exactly one rule breaks.

def _longest(meta: Metadata, min_active: int = 1) -> int:
    candidates = [n for n, a in enumerate(meta.actives()) if len(a) >= min_active]
    if not candidates:
        raise CannotBuild(f"no sequence of this layout holds {min_active} active checkpoint(s)")
    return max(candidates, key=lambda n: meta.lengths[n])


def _active_positions(meta: Metadata, n: int) -> list[int]:
    return [c for c, s in enumerate(meta.slots[n]) if s >= 0]


def _no_checkpoints(meta: Metadata) -> None:
    meta.slots = [[-1] * meta.capacity for _ in meta.slots]


def _fault_duplicate_final(meta, rng):
    meta.final[1] = meta.final[0]


def _fault_duplicate_final_checkpoint(meta, rng):
    n = _longest(meta)
    meta.slots[n][_active_positions(meta, n)[0]] = meta.final[n]


def _fault_duplicate_checkpoint(meta, rng):
    n = _longest(meta, 2)
    first, second = _active_positions(meta, n)[:2]
    meta.slots[n][second] = meta.slots[n][first]


def _fault_write_aliases_initial(meta, rng):
    if meta.initial[0] < 0:
        raise CannotBuild("sequence 0 has no initial slot")
    meta.final[1] = meta.initial[0]


def _fault_lengths_decreasing(meta, rng):
    _no_checkpoints(meta)
    cu = meta.cu_seqlens
    if len(cu) > 2:
        cu[1] = cu[2] + 1
    else:
        cu[1] = -1


def _fault_lengths_nonzero_start(meta, rng):
    _no_checkpoints(meta)
    meta.cu_seqlens[0] = 1


def _fault_lengths_past_capacity(meta, rng):
    _no_checkpoints(meta)
    meta.cu_seqlens[-1] += 1


def _fault_live_count_zero(meta, rng):
    meta.num_seqs = 0


def _fault_live_count_over(meta, rng):
    meta.num_seqs = len(meta.initial) + 1


def _fault_slot_range_initial(meta, rng):
    meta.initial[0] = meta.num_slots


def _fault_slot_range_final(meta, rng):
    meta.final[-1] = meta.num_slots + 7


def _fault_slot_range_checkpoint(meta, rng):
    n = _longest(meta)
    meta.slots[n][_active_positions(meta, n)[-1]] = meta.num_slots


def _fault_slot_negative(meta, rng):
    meta.final[0] = -2


def _offset_fault(kind: str):
    def mutate(meta, rng):
        n = _longest(meta, 2 if kind in ("not-increasing", "equal") else 1)
        positions = _active_positions(meta, n)
        row = meta.offsets[n]
        if kind == "zero":
            row[positions[0]] = 0
        elif kind == "at-length":
            row[positions[-1]] = meta.lengths[n]
        elif kind == "past-length":
            row[positions[-1]] = meta.lengths[n] + 5
        elif kind == "not-increasing":
            row[positions[0]], row[positions[1]] = row[positions[1]], row[positions[0]]
        else:
            row[positions[1]] = row[positions[0]]
    return mutate


FAULTS: dict[str, Callable[[Metadata, random.Random], None]] = {
    "duplicate-final": _fault_duplicate_final,
    "duplicate-final-checkpoint": _fault_duplicate_final_checkpoint,
    "duplicate-checkpoint": _fault_duplicate_checkpoint,
    "write-aliases-initial": _fault_write_aliases_initial,
    "lengths-decreasing": _fault_lengths_decreasing,
    "lengths-nonzero-start": _fault_lengths_nonzero_start,
    "lengths-past-capacity": _fault_lengths_past_capacity,
    "live-count-zero": _fault_live_count_zero,
    "live-count-over-capacity": _fault_live_count_over,
    "slot-range-initial": _fault_slot_range_initial,
    "slot-range-final": _fault_slot_range_final,
    "slot-range-checkpoint": _fault_slot_range_checkpoint,
    "slot-negative": _fault_slot_negative,
    "offset-zero": _offset_fault("zero"),
    "offset-at-length": _offset_fault("at-length"),
    "offset-past-length": _offset_fault("past-length"),
    "offset-not-increasing": _offset_fault("not-increasing"),
    "offset-equal": _offset_fault("equal"),
}
assert set(FAULTS) == set(FAULT_VARIANTS) == set(FAULT_BITS)


def _fault_base(ctx: Context, case: Case) -> tuple[KdaInputs, Metadata, random.Random]:
    """Valid metadata with every initial slot set, so that any fault can be built on it."""
    rng = ctx.rng(case)
    x = _inputs(ctx, case, case.lengths)
    meta = build_metadata(case.lengths, case.params["capacity"], case.params["offsets"], rng,
                          initial_share=1.0)
    return x, meta, rng


def _rejected_run(ctx: Context, case: Case, x: KdaInputs, meta: Metadata, expected: int,
                  out: Outcome) -> None:
    """Run metadata that must be rejected (planned path when it sets a live count)."""
    dtype = _index_dtype(case)
    pool = _make_pool(ctx, meta, x)
    before = pool.clone()
    oracle_code = meta.expected_code(x.q.shape[0])
    if meta.num_seqs is None:
        call = _prefill(ctx, x, meta, pool, dtype)
    else:  # the live count is a planned-path input
        kernels = _kernels()
        planned = kernels.plan(_caps(ctx, case, meta, x.q.shape[0]))
        binding = kernels.bind(planned, x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                               num_seqs=meta.num_seqs, A_log=x.A_log, dt_bias=x.dt_bias,
                               **meta.tensors(ctx.device, dtype))

        def call():
            return kernels.run(binding)
    output, code = _result(call())
    out.shape = _shape(meta)
    check_rejected(out, pool, before, output, code, expected, oracle_code)
    out.checks["oracle_error_code"] = oracle_code
    out.kernel = _kernel_record(ctx, _caps(ctx, case, meta, x.q.shape[0]))
    out.samples_ms = _time(ctx, call)


def run_fault(ctx: Context, case: Case) -> Outcome:
    """One fault class: its exact bit, the pool bit for bit unchanged, the output all NaN."""
    out = Outcome()
    x, meta, rng = _fault_base(ctx, case)
    variant = case.params["variant"]
    FAULTS[variant](meta, rng)
    _rejected_run(ctx, case, x, meta, FAULT_BITS[variant], out)
    return out


def run_invalid_fourth(ctx: Context, case: Case) -> Outcome:
    """Capacity 4, three good destinations and a bad fourth one."""
    out = Outcome()
    x, meta, rng = _fault_base(ctx, case)
    n = max(range(len(meta.lengths)), key=lambda i: meta.lengths[i])
    length = meta.lengths[n]
    if length < 5:
        raise CannotBuild("the longest sequence is too short for four checkpoints")
    offsets = choose_offsets(length, 4, case.params["offsets"], rng)
    if len(offsets) < 4:
        offsets = sorted(rng.sample(range(1, length), 4))
    meta.offsets[n] = offsets
    for c in range(4):  # fresh slots at the end of the pool for entries that had none
        if meta.slots[n][c] < 0:
            meta.slots[n][c] = meta.num_slots
            meta.num_slots += 1
    variant = case.params["variant"]
    others = [m for m in range(len(meta.initial)) if m != n and meta.initial[m] >= 0]
    meta.slots[n][3] = {
        "out-of-range": meta.num_slots,
        "negative": -2,
        "duplicate-final": meta.final[others[0]] if others else meta.final[n],
        "duplicate-checkpoint": meta.slots[n][0],
        "aliases-initial": meta.initial[others[0]] if others else None,
    }[variant]
    if meta.slots[n][3] is None:
        raise CannotBuild("no other sequence has an initial slot to alias")
    out.details["fourth_destination"] = meta.slots[n][3]
    _rejected_run(ctx, case, x, meta, FOURTH_BITS[variant], out)
    return out


def run_fuzz(ctx: Context, case: Case) -> Outcome:
    """Seeded random metadata sets; the metadata oracle says which are valid and their code."""
    out = Outcome()
    p, o = case.params, case.options
    capacity = p["capacity"]
    mutations = {name: FAULTS[name] for name, needs in FAULT_VARIANTS.items()
                 if needs <= capacity and not name.startswith("live-count")}
    mutations.update(RANDOM_MUTATIONS)
    sets, valid, invalid = [], 0, 0
    for s in range(o["sets"]):
        rng = ctx.rng(case, f"set{s}")
        count = rng.randint(1, o["max_seqs"])
        lengths = lengths_with_edges(rng, count, o["max_len"])
        meta = build_metadata(lengths, capacity, rng.choice(OFFSET_MODES), rng,
                              num_slots=None, initial_share=0.7, scatter=True)
        for n in range(count):
            if rng.random() < 0.2:
                meta.final[n] = -1
        applied = []
        if rng.random() < o["invalid_share"]:
            for name in rng.sample(sorted(mutations), rng.choice((1, 1, 2))):
                try:
                    mutations[name](meta, rng)
                except (CannotBuild, IndexError):  # the set has no room for this one
                    continue
                applied.append(name)
        x = _inputs(ctx, case, lengths, f"set{s}")
        dtype = rng.choice((torch.int32, torch.int64))
        expected = meta.expected_code(x.q.shape[0])
        pool = _make_pool(ctx, meta, x)
        before = pool.clone()
        output, code = _result(_prefill(ctx, x, meta, pool, dtype)())
        failures_before = len(out.failures)
        tag = f"set {s}: "
        if expected:
            invalid += 1
            check_rejected(out, pool, before, output, code, expected, expected, prefix=tag)
        else:
            valid += 1
            check_valid(out, ctx, case, x, meta, pool, before, output, code, prefix=tag)
        sets.append({"set": s, "lengths": lengths, "mutations": applied, "expected": expected,
                     "code": code, "ok": len(out.failures) == failures_before})
    out.checks.pop("error_code", None)
    out.checks.pop("expected_error_code", None)
    out.details.update(valid_sets=valid, invalid_sets=invalid, sets=sets)
    out.shape = {"sets": len(sets), "max_seqs": o["max_seqs"], "max_len": o["max_len"]}
    return out


def _random_slot(meta: Metadata, rng: random.Random) -> None:
    """Any slot set to a value in [-3, num_slots + 2]: valid or not, the oracle decides."""
    value = rng.randint(-3, meta.num_slots + 2)
    n = rng.randrange(len(meta.initial))
    target = rng.choice(("initial", "final", "checkpoint"))
    if target == "checkpoint":
        meta.slots[n][rng.randrange(meta.capacity)] = value
    else:
        getattr(meta, target)[n] = value


def _random_offset(meta: Metadata, rng: random.Random) -> None:
    """Any checkpoint offset set to a value in [-2, len + 2]."""
    n = rng.randrange(len(meta.initial))
    meta.offsets[n][rng.randrange(meta.capacity)] = rng.randint(-2, meta.lengths[n] + 2)


def _random_lengths(meta: Metadata, rng: random.Random) -> None:
    """One cu_seqlens entry moved by 1 or 2 either way."""
    position = rng.randrange(len(meta.cu_seqlens))
    meta.cu_seqlens[position] += rng.choice((-2, -1, 1, 2))


RANDOM_MUTATIONS = {"random-slot": _random_slot, "random-offset": _random_offset,
                    "random-lengths": _random_lengths}


def run_graph(ctx: Context, case: Case) -> Outcome:
    """One planned binding captured once, replayed with new lengths, offsets, slots and
    sequence counts: `replays` replays checked against the oracle, plus one (the third)
    whose metadata must be rejected, after which the replays must recover."""
    out = Outcome()
    kernels = _kernels()
    p = case.params
    capacity, layout = p["capacity"], list(case.lengths)
    rng = ctx.rng(case)
    dtype = _index_dtype(case)
    x = _inputs(ctx, case, layout)
    max_seqs, tokens = len(layout), sum(layout)
    num_slots = max_seqs * (2 + capacity) + 4
    shape_meta = Metadata([0] * (max_seqs + 1), [-1] * max_seqs, [-1] * max_seqs,
                          [[1] * capacity] * max_seqs, [[-1] * capacity] * max_seqs,
                          num_slots, capacity)
    static = shape_meta.tensors(ctx.device, dtype)
    pool = torch.full((num_slots, p["heads"], p["head_dim"], p["head_dim"]), SENTINEL,
                      dtype=torch.float32, device=ctx.device)
    planned = kernels.plan(_caps(ctx, case, shape_meta, tokens))
    binding = kernels.bind(planned, x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                           A_log=x.A_log, dt_bias=x.dt_bias, **static)

    def load(meta: Metadata) -> None:
        live = len(meta.initial)
        fresh = meta.tensors(ctx.device, dtype)
        tail = max_seqs - live
        static["cu_seqlens"].copy_(torch.cat([fresh["cu_seqlens"],
                                              fresh["cu_seqlens"][-1:].repeat(tail)]))
        for key in ("initial_state_indices", "final_state_indices",
                    "checkpoint_state_indices", "checkpoint_offsets"):
            filler = torch.full((tail, *fresh[key].shape[1:]), -1 if "offsets" not in key else 1,
                                dtype=dtype, device=ctx.device)
            static[key].copy_(torch.cat([fresh[key], filler]))
        binding.set_num_seqs(live)
        pool.fill_(SENTINEL)
        _load_initial(pool, meta, x, range(num_slots))

    def draw(r: int) -> Metadata:
        count = max_seqs if r in (0, 2) else 1 if r == 1 else rng.randint(1, max_seqs)
        chosen = rng.sample(layout, count)
        meta = build_metadata(chosen, capacity, p["offsets"], rng, num_slots=num_slots,
                              scatter=r % 2 == 1)
        if r == 2:  # one rejected replay in the middle: two sequences share a final slot
            meta.final[1] = meta.final[0]
        return meta

    first = draw(0)
    load(first)
    kernels.run(binding)  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernels.run(binding)
    replays = []
    for r in range(case.options["replays"] + 1):
        meta = first if r == 0 else draw(r)
        load(meta)
        before = pool.clone()
        graph.replay()
        torch.cuda.synchronize()
        code = int(planned.error_code.item())
        tag = f"replay {r}: "
        if r == 2:
            expected = meta.expected_code(tokens)
            check_rejected(out, pool, before, binding.out, code, DUPLICATE, expected, prefix=tag)
        else:
            check_valid(out, ctx, case, x, meta, pool, before, binding.out, code, prefix=tag)
        replays.append({"num_seqs": len(meta.initial), "tokens": meta.cu_seqlens[-1],
                        "code": code, "rejected_on_purpose": r == 2})
    out.checks.pop("error_code", None)
    out.checks.pop("expected_error_code", None)
    out.details["replays"] = replays
    out.shape = {"max_seqs": max_seqs, "max_tokens": tokens, "num_slots": num_slots}
    out.kernel = {"kernel_config": dataclasses.asdict(planned.config),
                  "config_source": planned.config_source}
    out.samples_ms = _time(ctx, graph.replay)
    del graph
    return out


def run_int32_boundary(ctx: Context, case: Case) -> Outcome:
    """Initial, final and checkpoint slots past the 2^31-element line of a ~9 GB pool."""
    out = Outcome()
    p = case.params
    rng = ctx.rng(case)
    x = _inputs(ctx, case, case.lengths)
    slot_elements = p["heads"] * p["head_dim"] * p["head_dim"]
    line = -(-INT32_LINE // slot_elements)  # first slot starting at or past 2^31 elements
    meta = build_metadata(case.lengths, p["capacity"], p["offsets"], rng)
    base = line - 1  # slots used: base .. base + num_slots - 1 (all but one past the line)
    meta.initial = [s + base if s >= 0 else s for s in meta.initial]
    meta.final = [s + base if s >= 0 else s for s in meta.final]
    meta.slots = [[s + base if s >= 0 else s for s in row] for row in meta.slots]
    used = meta.num_slots
    meta.num_slots = base + used + 1
    pool = torch.empty((meta.num_slots, p["heads"], p["head_dim"], p["head_dim"]),
                       dtype=torch.float32, device=ctx.device)
    watched = [0, 1, *range(base, meta.num_slots)]
    pool[watched] = SENTINEL
    _load_initial(pool, meta, x, range(meta.num_slots))
    before = {s: pool[s].clone() for s in watched}
    dtype = _index_dtype(case)
    call = _prefill(ctx, x, meta, pool, dtype)
    output, code = _result(call())
    out.shape = {**_shape(meta), "pool_bytes": pool.numel() * 4,
                 "first_slot_past_line": line,
                 "highest_write_element": (max(meta.write_slots()) + 1) * slot_elements}
    out.checks["error_code"] = code
    out.require(max(meta.write_slots()) * slot_elements >= INT32_LINE,
                "no destination slot lies past the 2^31-element line")
    check_valid(out, ctx, case, x, meta, pool, before, output, code)
    out.kernel = _kernel_record(ctx, _caps(ctx, case, meta, x.q.shape[0]))
    out.samples_ms = _time(ctx, call)
    del pool, before, call
    return out


def run_mirror(ctx: Context, case: Case) -> Outcome:
    """The chunk mirror (fp32) against the float64 recurrence: outputs, finals, checkpoints."""
    out = Outcome()
    rng = ctx.rng(case)
    x = _inputs(ctx, case, case.lengths)
    offsets = [choose_offsets(n, 4, case.params["offsets"], rng) for n in case.lengths]
    tol = case.options["tolerances"]
    kwargs = {"cu_seqlens": x.cu_seqlens, "initial_state": x.initial_state, **x.gate_kwargs()}
    mirror = chunk_kda_mirror(x.q, x.k, x.v, x.g, x.beta, checkpoint_offsets=offsets, **kwargs)
    ref = recurrent_kda(x.q, x.k, x.v, x.g, x.beta, prefix_lengths=offsets, **kwargs)
    out.within("output", relative_error(ref.o, mirror.o), tol["output"])
    for n in range(len(case.lengths)):
        out.within("final_state", relative_error(ref.final_state[n], mirror.final_state[n]),
                   tol["state"])
        for i in range(len(offsets[n])):
            out.within("checkpoint", relative_error(ref.prefix_states[n][i],
                                                    mirror.checkpoint_states[n][i]), tol["state"])
    out.shape = {"num_seqs": len(case.lengths), "tokens": sum(case.lengths),
                 "lengths": list(case.lengths)}
    return out


def run_contract(ctx: Context, case: Case) -> Outcome:
    """Host-side contracts: plan refuses what it cannot run, bind refuses bad shapes."""
    out = Outcome()
    kernels = _kernels()
    variant = case.params["variant"]
    base = kernels.Caps(device=ctx.device, num_heads=2, head_dim=64, max_tokens=32, max_seqs=2,
                        max_state_slots=64, max_checkpoints=2, backend=ctx.backend)
    if variant == "decode-names-every-bit":
        text = kernels.decode_error_code(sum(int(f) for f in kernels.MetadataFault))
        missing = [f.name for f in kernels.MetadataFault if f.name not in text]
        out.require(not missing, f"decode_error_code leaves out {missing}")
        out.require(kernels.decode_error_code(0) == "accepted",
                    "code 0 does not decode as accepted")
        return out
    refusals = {
        "plan-refuses-capacity-3": ({"max_checkpoints": 3}, "max_checkpoints"),
        "plan-refuses-head-dim-96": ({"head_dim": 96}, "head_dim"),
        "plan-refuses-lower-bound-6": ({"lower_bound": -6.0}, "lower_bound"),
        "plan-refuses-unknown-backend": ({"backend": "no-such-backend"}, "backend"),
    }
    if variant in refusals:
        change, word = refusals[variant]

        def attempt():
            return kernels.plan(dataclasses.replace(base, **change))
    else:
        planned = kernels.plan(base)
        heads = 3 if variant == "bind-refuses-wrong-heads" else 2
        x = make_inputs([16, 16], heads, 64, seed=ctx.seed(case), device=ctx.device)
        meta = build_metadata([16, 16], 2, "unaligned", ctx.rng(case))
        tensors = meta.tensors(ctx.device, torch.int32)
        if variant == "bind-refuses-vector-metadata-for-capacity-2":
            tensors["checkpoint_offsets"] = tensors["checkpoint_offsets"][:, 0].contiguous()
            tensors["checkpoint_state_indices"] = (
                tensors["checkpoint_state_indices"][:, 0].contiguous())
            word = "checkpoint_offsets"
        else:
            word = "q"
        pool = torch.zeros(meta.num_slots, 2, 64, 64, device=ctx.device)

        def attempt():
            return kernels.bind(planned, x.q, x.k, x.v, x.g, x.beta, state_pool=pool, **tensors)
    try:
        attempt()
    except kernels.KdaConfigError as error:
        out.details["message"] = str(error)
        out.require(word in str(error), f"the refusal does not name {word!r}: {error}")
    else:
        out.failures.append(f"{variant}: accepted instead of refused")
    return out


RUNNERS: dict[str, Callable[[Context, Case], Outcome]] = {
    "accuracy": run_accuracy,
    "prefix": run_prefix,
    "inactive": run_inactive,
    "poisoned": run_poisoned,
    "invalid-fourth": run_invalid_fourth,
    "fault": run_fault,
    "graph": run_graph,
    "int32-boundary": run_int32_boundary,
    "fuzz": run_fuzz,
    "mirror": run_mirror,
    "contract": run_contract,
}


# --------------------------------------------------------------------------- run loop


def run_case(ctx: Context, case: Case) -> dict[str, Any]:
    """Run one case and return its receipt record (never raises but for Ctrl-C)."""
    started = time.perf_counter()
    record = {**case.describe(), "tolerances": dict(case.options["tolerances"])}
    try:
        outcome = RUNNERS[case.scenario](ctx, case)
    except KeyboardInterrupt:
        raise
    except Exception as error:  # noqa: BLE001 - a crash is a verdict, not the end of the run
        record.update(verdict="error", message=f"{type(error).__name__}: {error}",
                      errors={}, checks={}, median_ms=None, samples_ms=[])
        if ctx.gpu and isinstance(error, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
    else:
        samples = outcome.samples_ms
        record.update(
            verdict="fail" if outcome.failures else "pass",
            message="; ".join(outcome.failures[:8]) or None,
            errors=outcome.errors, checks=outcome.checks, shape=outcome.shape,
            median_ms=round(statistics.median(samples), 5) if samples else None,
            samples_ms=samples, **outcome.kernel,
        )
        if outcome.details:
            record["details"] = outcome.details
    if case.scenario == "int32-boundary" and ctx.gpu:
        torch.cuda.empty_cache()
    record["wall_s"] = round(time.perf_counter() - started, 3)
    return record


@dataclass
class QualifyResult:
    """The outcome of a run: its cases, the receipt written, the verdict."""

    receipt_path: Path
    receipt: dict[str, Any]
    cases: list[dict[str, Any]]

    @property
    def summary(self) -> dict[str, int]:
        return self.receipt["summary"]

    @property
    def ok(self) -> bool:
        return bool(self.cases) and all(case["verdict"] == "pass" for case in self.cases)

    @property
    def by_scenario(self) -> dict[str, dict[str, Any]]:
        return summarize_by_scenario(self.cases)

    def to_dict(self) -> dict[str, Any]:
        config = self.receipt["config"]
        return {
            "ok": self.ok, "receipt": str(self.receipt_path), "sha256": self.receipt["sha256"],
            "status": self.receipt["status"], "tier": config["tier"],
            "backend": config["backend"], "device": self.receipt["device"].get("name"),
            "summary": self.summary, "scenarios": self.by_scenario,
            "failures": [{"id": c["id"], "verdict": c["verdict"], "message": c.get("message")}
                         for c in self.cases if c["verdict"] != "pass"],
        }


def _worst(values: Iterable[Any]) -> float | None:
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(numbers) if numbers else None


def summarize_by_scenario(cases: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scenario: case counts by verdict, worst output and state errors, median time."""
    table: dict[str, dict[str, Any]] = {}
    for case in cases:
        row = table.setdefault(case["scenario"], {"cases": 0, "pass": 0, "fail": 0, "error": 0,
                                                  "skip": 0, "_out": [], "_state": [], "_ms": []})
        row["cases"] += 1
        row[case["verdict"]] += 1
        errors = case.get("errors") or {}
        row["_out"].append(errors.get("output"))
        row["_state"] += [errors.get(k) for k in ("final_state", "checkpoint", "prefix_unaligned")]
        row["_ms"].append(case.get("median_ms"))
    for row in table.values():
        row["worst_output_error"] = _worst(row.pop("_out"))
        row["worst_state_error"] = _worst(row.pop("_state"))
        times = [t for t in row.pop("_ms") if isinstance(t, (int, float))]
        row["median_ms"] = statistics.median(times) if times else None
    return table


class Qualification:
    """One run of a matrix on a tier: the cases chosen, the device, the receipt path.

    Construction checks everything a user can get wrong (tier, backend, shard, filter) and
    raises QualifyError or MatrixError; `run()` then runs the cases and writes the receipt
    (kind "qualify") as they finish, partial if interrupted.
    """

    def __init__(
        self, matrix: Matrix, *, tier: str | None = None, backend: str | None = None,
        shard: tuple[int, int] | None = None, contains: str | None = None,
        out_dir: str | os.PathLike | None = None, command_line: Sequence[str] | None = None,
        created_at: str | None = None,
    ) -> None:
        self.matrix = matrix
        self.tier = tier or default_tier()
        self.backend = backend or matrix.backends[0]
        if self.backend not in matrix.backends:
            raise QualifyError(f"backend {self.backend!r} is not in the matrix's backends "
                               f"({', '.join(matrix.backends)})")
        self.cases = select_cases(matrix.expand(self.tier), shard=shard, contains=contains)
        if not self.cases:
            raise MatrixError(f"no {self.tier}-tier case of {matrix.origin} matches "
                              f"{'the filter ' + repr(contains) if contains else 'this shard'}")
        self.device = prepare_tier(self.tier)
        from kdabench.kernels.config import BACKENDS

        if self.backend not in BACKENDS:
            raise QualifyError(f"backend {self.backend!r} is not available here "
                               f"(have: {', '.join(BACKENDS)})")
        self.shard = shard
        config = {
            "tier": self.tier, "backend": self.backend, "matrix_name": matrix.name,
            "matrix_origin": "default" if matrix.origin == "default" else "file",
            "matrix_sha256": matrix.sha256, "matrix": matrix.document,
            "filter": contains or None,
            "timing": dict(matrix.timing) if self.tier == "gpu" else None,
        }
        if shard is not None:
            config["shard"] = f"{shard[0]}/{shard[1]}"
        from kdabench.environment import device_identity

        self.builder = new_receipt("qualify", config=config, command_line=command_line,
                                   device=device_identity(str(self.device)), created_at=created_at)
        self.path = _receipt_path(Path(out_dir) if out_dir else default_out_dir(),
                                  self.builder.filename(), shard)
        self.context = Context(self.device, self.tier, self.backend,
                               matrix.timing if self.tier == "gpu" else None, matrix.seed)

    def run(self, *, on_start: Callable[[Case], None] | None = None,
            on_case: Callable[[dict[str, Any]], None] | None = None) -> QualifyResult:
        records = []
        with self.builder.writer(self.path, every=5 if self.tier == "gpu" else 1) as writer:
            for case in self.cases:
                if on_start:
                    on_start(case)
                record = run_case(self.context, case)
                records.append(writer.add_case(record))
                if on_case:
                    on_case(record)
        return QualifyResult(self.path, self.builder.document("complete"), records)


def default_out_dir() -> Path:
    from kdabench.qualification import default_results_dir

    return default_results_dir()


def _receipt_path(folder: Path, filename: str, shard: tuple[int, int] | None) -> Path:
    stem = filename.removesuffix(".json")
    if shard is not None:
        stem += f"-shard{shard[0]}of{shard[1]}"
    path, number = folder / f"{stem}.json", 1
    while path.exists():
        number += 1
        path = folder / f"{stem}-{number}.json"
    return path


def fmt_error(value: Any) -> str:
    """An error for a table: 3 significant digits, '-' when absent."""
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:.2e}" if isinstance(value, (int, float)) else str(value)
