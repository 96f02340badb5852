"""The Triton prefill on a GPU (the GPU test tier; skipped without a CUDA device).

(a) outputs, final states and each of four exported states against the float64 recurrence
    (computed on the GPU) on 13 shapes up to T = 65536, H 4..64, 1..64 sequences, and no
    worse than 1.5x fla's chunk_kda on the same inputs (those tests skip without fla); both
    pipelines (fused, split) under explicit bf16 configs at chunks 16 and 64, the interior
    checkpoints finished by their kernel or (at chunk 16) in the pass;
(b) exported states at chunk-aligned offsets equal, bit for bit, the final state of a separate
    kernel run over the prefix; unaligned ones lie within the state tolerance of it;
(c) every fault class leaves the whole pool torch.equal to its copy, sets its bit, NaNs the output,
    clashes of write slots across the validator's tiles among them;
(d) one CUDA graph captured once over a planned binding, replayed with new lengths, offsets,
    slots and live sequence counts, each replay checked against the oracle;
(e) a pool whose written slots lie past 2^31 elements.

The measured errors land in ERRORS, printed at the end of the module (pytest -s) and written as
JSON to the file named by $KDABENCH_GPU_REPORT when it is set.

    python -m pytest tests/kernels/test_prefill_gpu.py -m gpu -s -q

Time goes mostly to compiling, not computing. Triton compiles a kernel once per constexpr set
(heads, head_dim, gate, norms, capacity), index dtype and integer-argument class (== 1,
multiple of 16, other), so the cases share a few (heads, gate) sets and pad their token and slot
capacities to multiples of 16 (tokens past the live ones are never read). fla's chunk_kda
autotunes once per (heads, head_dim): about 1.5 minutes each on an H200, four of them here;
`-k "not fla"` leaves that comparison out.
"""

from __future__ import annotations

import functools
import json
import os
import random

import pytest
import torch
from write_slot_clashes import CLASHES, MANY_SEQS

from kdabench.inputs import make_inputs
from kdabench.kernels import Caps, KernelConfig, MetadataFault, bind, kda_prefill, plan, run
from kdabench.kernels.config import CHUNK_SIZE
from kdabench.oracles import assert_close, log_decay, prefix_batch, recurrent_kda, relative_error

pytestmark = pytest.mark.gpu

OUTPUT_TOL = 5e-3
STATE_TOL = 3e-3
FLA_FACTOR = 1.5
CHUNK = CHUNK_SIZE  # aligned offsets are its multiples
CAPACITY = 4
SENTINEL = 16384.0
DEVICE = "cuda"

ERRORS: dict[str, dict[str, float | int | str]] = {}
REFERENCES: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # float64 o and finals, for fla


def round_up(value: int, multiple: int = 16) -> int:
    return -(-value // multiple) * multiple


def token_capacity(num_tokens: int, num_seqs: int) -> int:
    """Tokens to allocate: >= num_tokens, a multiple of the chunk, and with capacity / chunk +
    num_seqs (the kernels' chunk-slot count) a multiple of 16, so shapes share compilations."""
    chunks = round_up(round_up(num_tokens, CHUNK) // CHUNK + num_seqs) - num_seqs
    return chunks * CHUNK


def ragged(total: int, count: int, seed: int, edges=(1, 15, 16, 17, 63, 64, 65)) -> list[int]:
    """`count` lengths summing to `total`: the edge lengths first, the rest cut at random."""
    rng = random.Random(seed)
    fixed = list(edges[: max(count - 1, 0)])
    rest, pieces = total - sum(fixed), count - len(fixed)
    assert rest >= pieces, f"{count} sequences with edge lengths need more than {total} tokens"
    cuts = sorted(rng.sample(range(1, rest), pieces - 1))
    lengths = fixed + [b - a for a, b in zip([0, *cuts], [*cuts, rest])]
    rng.shuffle(lengths)
    return lengths


# id, lengths, heads, head_dim, gate, qk_l2norm + beta_sigmoid, index dtype, seed.
# Few distinct (heads, head_dim, gate, norms, index dtype): see the module docstring.
I32, I64 = torch.int32, torch.int64
ACCURACY_CASES = [
    ("T65536-N1-H4-K128-i64", [65536], 4, 128, "precomputed", False, I64, 1),
    ("T49152-N3-H4-K128-i64", [16385, 32751, 16], 4, 128, "precomputed", False, I64, 2),
    ("T20000-N5-H4-K128-ragged", ragged(20000, 5, 3), 4, 128, "precomputed", False, I32, 3),
    ("T16384-N4-H16-K128", [8192, 4096, 3000, 1096], 16, 128, "precomputed", False, I32, 4),
    ("T12288-N3-H16-K128", [4095, 4097, 4096], 16, 128, "precomputed", False, I32, 5),
    ("T8192-N64-H16-K128-ragged", ragged(8192, 64, 6), 16, 128, "precomputed", False, I32, 6),
    ("T1000-N33-H16-K128-edges", ragged(1000, 33, 7), 16, 128, "precomputed", False, I32, 7),
    ("T8192-N8-H64-K128", [1024] * 8, 64, 128, "precomputed", False, I32, 8),
    ("T4096-N64-H64-K128-ragged", ragged(4096, 64, 9), 64, 128, "precomputed", False, I32, 9),
    ("T32768-N2-H16-K128-sigmoid-l2norm", [20000, 12768], 16, 128, "sigmoid", True, I32, 10),
    ("T2048-N16-H16-K128-ragged-sigmoid-l2norm", ragged(2048, 16, 11), 16, 128, "sigmoid", True,
     I32, 11),
    ("T8192-N64-H4-K128-ragged-softplus", ragged(8192, 64, 12), 4, 128, "softplus", False, I32,
     12),
    ("T4000-N3-H4-K64", [1, 1999, 2000], 4, 64, "precomputed", False, I32, 13),
]
CASES_BY_ID = {case[0]: case for case in ACCURACY_CASES}


def checkpoint_offsets(length: int, rng: random.Random) -> list[int]:
    """Up to four increasing offsets: 1, a chunk multiple, an unaligned one, len - 1."""
    if length < 2:
        return []
    wanted = {1, length - 1}
    if length > CHUNK + 1:
        wanted.add(CHUNK * rng.randint(1, (length - 2) // CHUNK))
    candidates = [p for p in range(2, length - 1) if p % CHUNK and p not in wanted]
    if candidates:
        wanted.add(rng.choice(candidates))
    spare = [p for p in range(2, length - 1) if p not in wanted]
    while len(wanted) < CAPACITY and spare:
        wanted.add(spare.pop(rng.randrange(len(spare))))
    return sorted(wanted)[:CAPACITY]


class Call:
    """One call's metadata: initial slots 0..N-1, finals N..2N-1, checkpoints after, spares."""

    def __init__(self, lengths: list[int], seed: int, index_dtype=I32):
        rng = random.Random(seed)
        n = len(lengths)
        self.lengths = lengths
        self.cu_seqlens = [0]
        for length in lengths:
            self.cu_seqlens.append(self.cu_seqlens[-1] + length)
        self.initial = list(range(n))
        self.final = list(range(n, 2 * n))
        self.offsets = [checkpoint_offsets(length, rng) for length in lengths]
        self.ck_offsets = [row + [0] * (CAPACITY - len(row)) for row in self.offsets]
        next_slot = iter(range(2 * n, 2 * n + CAPACITY * n))
        self.ck_slots = [[next(next_slot) for _ in row] + [-1] * (CAPACITY - len(row))
                         for row in self.offsets]
        self.num_slots = round_up(2 * n + CAPACITY * n)
        self.num_tokens = token_capacity(self.cu_seqlens[-1], n)
        self.index_dtype = index_dtype

    def tensors(self) -> dict[str, torch.Tensor]:
        def t(values):
            return torch.tensor(values, dtype=self.index_dtype, device=DEVICE)

        return {"cu_seqlens": t(self.cu_seqlens), "initial_state_indices": t(self.initial),
                "final_state_indices": t(self.final), "checkpoint_offsets": t(self.ck_offsets),
                "checkpoint_state_indices": t(self.ck_slots)}


def padded_inputs(lengths: list[int], heads: int, dim: int, seed: int, **options):
    """Inputs with unused tokens after the live ones, up to the call's token capacity."""
    live = sum(lengths)
    pad = token_capacity(live, len(lengths)) - live
    return make_inputs([*lengths, pad], heads, dim, seed=seed, device=DEVICE, **options)


@functools.cache
def case_inputs(case_id: str):
    """Seeded inputs of an accuracy case on the GPU (drawn once: they are large)."""
    _, lengths, heads, dim, gate, fused, _, seed = CASES_BY_ID[case_id]
    return padded_inputs(lengths, heads, dim, seed, gate=gate, qk_l2norm=fused,
                         beta_sigmoid=fused)


def run_case(case_id: str):
    """Inputs, the call, and the pool and output after one kernel run of an accuracy case."""
    _, lengths, heads, dim, _, _, index_dtype, seed = CASES_BY_ID[case_id]
    x = case_inputs(case_id)
    call = Call(lengths, seed, index_dtype)
    pool = torch.zeros(call.num_slots, heads, dim, dim, device=DEVICE)
    pool[: len(lengths)] = x.initial_state[: len(lengths)]
    out = torch.full_like(x.v, SENTINEL)
    result = kda_prefill(x.q, x.k, x.v, x.g, x.beta, state_pool=pool, out=out,
                         **call.tensors(), **x.gate_kwargs())
    assert int(result.error_code) == 0, result.message()
    return x, call, pool, result.o


def live_inputs(x, call: Call) -> tuple[torch.Tensor, ...]:
    """q, k, v, g, beta of the live tokens only."""
    live = call.cu_seqlens[-1]
    return tuple(t[:live] for t in (x.q, x.k, x.v, x.g, x.beta))


@functools.cache
def measured(case_id: str) -> dict[str, float | int | str]:
    """Kernel errors against float64 for one case; computed once, recorded in ERRORS."""
    x, call, pool, o = run_case(case_id)
    errors, ref = errors_against_float64(x, call, pool, o)
    REFERENCES[case_id] = (ref.o, ref.final_state)
    ERRORS[case_id] = errors
    return errors


def errors_against_float64(x, call: Call, pool: torch.Tensor, o: torch.Tensor):
    """Relative errors of o, the finals and each checkpoint column against the float64
    recurrence, and counts of rows left unwritten or written past the live tokens."""
    live = call.cu_seqlens[-1]
    n = len(call.lengths)
    ref = recurrent_kda(*live_inputs(x, call), cu_seqlens=call.cu_seqlens,
                        initial_state=x.initial_state[:n], prefix_lengths=call.offsets,
                        device=DEVICE, **x.gate_kwargs())
    errors: dict[str, float | int | str] = {
        "unwritten_rows": int((o[:live] == SENTINEL).flatten(1).any(dim=1).sum()),
        "written_past_live": int((o[live:] != SENTINEL).flatten(1).any(dim=1).sum()),
        "o": relative_error(ref.o, o[:live]),
        "final": relative_error(ref.final_state, pool[call.final]),
    }
    for c in range(CAPACITY):
        having = [m for m, row in enumerate(call.offsets) if len(row) > c]
        expected = torch.stack([ref.prefix_states[m][c] for m in having])
        got = torch.stack([pool[call.ck_slots[m][c]] for m in having])
        errors[f"checkpoint_{c}"] = relative_error(expected, got)
    return errors, ref


def tolerance_failures(errors: dict[str, float | int | str]) -> list[str]:
    """What of `errors` exceeds the output and state tolerances (empty when all hold)."""
    return [f"{name} {errors[name]:.3e} > {tol:.0e}" for name, tol in
            [("o", OUTPUT_TOL), ("final", STATE_TOL),
             *((f"checkpoint_{c}", STATE_TOL) for c in range(CAPACITY))]
            if not errors[name] <= tol]


def fla_errors(case_id: str) -> dict[str, float | str]:
    """fla 0.6.0 chunk_kda on the same inputs (gates, norms and sigmoids applied for it)."""
    try:
        from fla.ops.kda import chunk_kda
    except ImportError as exc:
        return {"fla": f"unavailable ({exc})"}
    x = case_inputs(case_id)
    _, lengths, *_ = CASES_BY_ID[case_id]
    call = Call(lengths, 0)
    q, k, v, g, beta = live_inputs(x, call)
    g = log_decay(g, x.gate, lower_bound=x.lower_bound, A_log=x.A_log, dt_bias=x.dt_bias,
                  dtype=torch.float32)
    beta = torch.sigmoid(beta) if x.beta_sigmoid else beta
    with torch.inference_mode():
        o, final = chunk_kda(
            q[None], k[None], v[None], g[None].contiguous(), beta[None].contiguous(),
            initial_state=x.initial_state[: len(lengths)].transpose(-1, -2).contiguous(),
            output_final_state=True, use_qk_l2norm_in_kernel=x.qk_l2norm,
            cu_seqlens=torch.tensor(call.cu_seqlens, dtype=torch.long, device=DEVICE),
            safe_gate=True, lower_bound=x.lower_bound,
        )  # fmt: skip
    ref_o, ref_final = REFERENCES[case_id]
    return {"fla": "fla chunk_kda", "fla_o": relative_error(ref_o, o[0]),
            "fla_final": relative_error(ref_final, final.transpose(-1, -2))}


@pytest.fixture(scope="module", autouse=True)
def error_report():
    """Print the error table after the module; write it as JSON to $KDABENCH_GPU_REPORT."""
    yield
    if not ERRORS:
        return
    columns = ["o", "final", *(f"checkpoint_{c}" for c in range(CAPACITY)), "fla_o", "fla_final"]
    lines = [f"{'case':42s} " + " ".join(f"{c:>12s}" for c in columns)]
    for case_id, errors in ERRORS.items():
        cells = [errors.get(c) for c in columns]
        lines.append(f"{case_id:42s} " + " ".join(
            f"{v:12.3e}" if isinstance(v, float) else f"{'-':>12s}" for v in cells))
    print(f"\nrelative errors against float64 (tolerances: o {OUTPUT_TOL}, states {STATE_TOL}, "
          f"at most {FLA_FACTOR}x fla)")
    print("\n".join(lines))
    path = os.environ.get("KDABENCH_GPU_REPORT")
    if path:
        report = {"tolerances": {"o": OUTPUT_TOL, "state": STATE_TOL, "fla_factor": FLA_FACTOR},
                  "device": torch.cuda.get_device_name(), "errors": ERRORS}
        with open(path, "w") as handle:
            json.dump(report, handle, indent=2)


# ---- (a) accuracy ------------------------------------------------------------------------------


@pytest.mark.parametrize("case_id", list(CASES_BY_ID))
def test_accuracy_against_float64(case_id):
    errors = measured(case_id)
    assert errors["unwritten_rows"] == 0, f"{errors['unwritten_rows']} live rows never written"
    assert errors["written_past_live"] == 0, "rows past the live tokens were written"
    failures = tolerance_failures(errors)
    assert not failures, f"{case_id}: " + "; ".join(failures)


# (pipeline, solve, checkpoints, chunk_size, segments); checkpoints "pass": 16-token chunks only
PIPELINE_CONFIGS = [
    *((pipeline, solve, "kernel", chunk_size, segments)
      for pipeline, solve in (("fused", "substitution"), ("split", "substitution"),
                              ("split", "inverse"))
      for chunk_size, segments in ((16, 1), (64, 1), (64, 8))),
    *((pipeline, solve, "pass", 16, segments)
      for pipeline, solve in (("fused", "substitution"), ("split", "inverse"))
      for segments in (1, 8)),
]


@pytest.mark.parametrize("pipeline, solve, checkpoints, chunk_size, segments", PIPELINE_CONFIGS)
@pytest.mark.parametrize("case_id", ["T8192-N64-H16-K128-ragged", "T65536-N1-H4-K128-i64"])
def test_pipelines_against_float64(pipeline, solve, checkpoints, chunk_size, segments, case_id):
    """Each pipeline (the split one with either solve of stage 1; the interior checkpoints
    finished by their kernel or, at 16-token chunks, in the pass) under an explicit config
    (bf16 operands, as the H200 profile picks), with the serial walk and with eight parallel
    segments, on a ragged 64-sequence batch and on one long sequence, four checkpoints per
    sequence, against the float64 recurrence."""
    _, lengths, heads, dim, _, _, index_dtype, seed = CASES_BY_ID[case_id]
    x = case_inputs(case_id)
    call = Call(lengths, seed, index_dtype)
    pool = torch.zeros(call.num_slots, heads, dim, dim, device=DEVICE)
    pool[: len(lengths)] = x.initial_state[: len(lengths)]
    caps = Caps(device=DEVICE, num_heads=heads, head_dim=dim, max_tokens=x.q.shape[0],
                max_seqs=len(lengths), max_state_slots=call.num_slots,
                max_checkpoints=CAPACITY)
    config = KernelConfig(chunk_size=chunk_size, block_v=16, num_stages=2,
                          operand_dtype="bfloat16", pipeline=pipeline, segments=segments,
                          solve=solve, checkpoints=checkpoints)
    binding = bind(plan(caps, config), x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                   **call.tensors())
    binding.out.fill_(SENTINEL)
    result = run(binding)
    assert int(result.error_code) == 0, result.message()
    errors, _ = errors_against_float64(x, call, pool, result.o)
    ERRORS[f"{case_id}-{pipeline}-{solve}-{checkpoints}-c{chunk_size}-s{segments}"] = errors
    assert errors["unwritten_rows"] == 0 and errors["written_past_live"] == 0
    failures = tolerance_failures(errors)
    assert not failures, f"{pipeline} c{chunk_size} segments {segments}: " + "; ".join(failures)


@pytest.mark.parametrize("case_id", list(CASES_BY_ID))
def test_accuracy_no_worse_than_fla(case_id):
    errors = measured(case_id)
    compared = fla_errors(case_id)
    errors.update(compared)
    if "fla_o" not in compared:
        pytest.skip(f"fla's chunk_kda is {compared['fla']}")
    failures = [f"{name} {errors[name]:.3e} > {FLA_FACTOR} x fla {errors['fla_' + name]:.3e}"
                for name in ("o", "final")
                if not errors[name] <= FLA_FACTOR * errors["fla_" + name]]
    assert not failures, f"{case_id}: " + "; ".join(failures)


# ---- (b) checkpoints against prefix runs -------------------------------------------------------


@pytest.mark.parametrize("case_id", ["T65536-N1-H4-K128-i64", "T4096-N64-H64-K128-ragged",
                                     "T8192-N64-H16-K128-ragged",
                                     "T2048-N16-H16-K128-ragged-sigmoid-l2norm"])
def test_checkpoints_equal_prefix_runs(case_id):
    """Kernel against kernel: each prefix's own run (same capacity, inactive checkpoints)."""
    x, call, pool, _ = run_case(case_id)
    batch = prefix_batch(call.cu_seqlens, call.offsets)
    p, dtype = len(batch.owners), call.index_dtype
    prefix_tokens = int(batch.cu_seqlens[-1])
    pad = token_capacity(prefix_tokens, p) - prefix_tokens
    idx = torch.cat([batch.token_index, torch.zeros(pad, dtype=torch.int64)]).to(DEVICE)
    slots = round_up(2 * p)
    prefix_pool = torch.zeros(slots, *pool.shape[1:], device=DEVICE)
    prefix_pool[:p] = x.initial_state[batch.sequence_index.to(DEVICE)]
    result = kda_prefill(
        x.q[idx], x.k[idx], x.v[idx], x.g[idx], x.beta[idx], state_pool=prefix_pool,
        cu_seqlens=batch.cu_seqlens.to(device=DEVICE, dtype=dtype),
        initial_state_indices=torch.arange(p, dtype=dtype, device=DEVICE),
        final_state_indices=torch.arange(p, 2 * p, dtype=dtype, device=DEVICE),
        checkpoint_offsets=torch.ones(p, CAPACITY, dtype=dtype, device=DEVICE),
        checkpoint_state_indices=torch.full((p, CAPACITY), -1, dtype=dtype, device=DEVICE),
        **x.gate_kwargs(),
    )  # fmt: skip
    assert int(result.error_code) == 0, result.message()
    ck_slots = [s for row in call.ck_slots for s in row if s != -1]
    aligned = 0
    for i, ((n, offset), slot) in enumerate(zip(batch.owners, ck_slots)):
        own_run = prefix_pool[p + i]
        if offset % CHUNK == 0:
            aligned += 1
            assert torch.equal(pool[slot], own_run), (
                f"sequence {n}, aligned offset {offset}: differs bitwise from its prefix run "
                f"(max diff {(pool[slot] - own_run).abs().max().item():.3e})")
        else:
            assert_close(f"sequence {n} offset {offset} vs its prefix run", own_run, pool[slot],
                         STATE_TOL)
    assert aligned, "the case exports no chunk-aligned checkpoint"


# ---- (c) faults ---------------------------------------------------------------------------------

FAULT_LENGTHS = [300, 17, 1000, 16, 1]  # sequence 0 exports offsets 1, 16k, unaligned, 299
FAULT_HEADS = 4
DUP = MetadataFault.DUPLICATE_WRITE_SLOT
LENGTHS = MetadataFault.MALFORMED_LENGTHS
RANGE = MetadataFault.SLOT_OUT_OF_RANGE
OFFSET = MetadataFault.BAD_CHECKPOINT_OFFSET


def edit(key, row, column, value):
    def apply(call: Call):
        entries = getattr(call, key)
        if column is None:
            entries[row] = value
        else:
            entries[row][column] = value
    return apply


FAULTS = [
    ("duplicate-final-slots", edit("final", 1, None, 5), DUP),  # sequence 0's final slot
    ("checkpoint-on-other-final", edit("ck_slots", 2, 0, 5), DUP),
    ("final-on-other-initial", edit("final", 0, None, 2), DUP),
    ("checkpoint-on-other-initial", edit("ck_slots", 0, 1, 4), DUP),
    ("cu-seqlens-decreasing", edit("cu_seqlens", 5, None, 1300), LENGTHS),  # len-1 sequence 4
    ("cu-seqlens-not-from-zero", edit("cu_seqlens", 0, None, -5), LENGTHS),
    ("tokens-beyond-capacity", edit("cu_seqlens", 5, None, token_capacity(1334, 5) + 1), LENGTHS),
    ("final-slot-eq-num-slots", edit("final", 3, None, 32), RANGE),
    ("initial-slot-minus-2", edit("initial", 1, None, -2), RANGE),
    ("checkpoint-slot-past-2-32", edit("ck_slots", 0, 0, 2**32 + 11), RANGE),
    ("offset-0", edit("ck_offsets", 0, 0, 0), OFFSET),
    ("offset-eq-len", edit("ck_offsets", 0, 3, 300), OFFSET),
    ("offsets-not-increasing", edit("ck_offsets", 0, 2, 2), OFFSET),
    ("duplicate-offsets", edit("ck_offsets", 0, 1, 1), OFFSET),
    ("fourth-destination-out-of-range", edit("ck_slots", 0, 3, -3), RANGE),
]


def fault_setup():
    call = Call(FAULT_LENGTHS, seed=21)
    assert call.num_slots == 32 and call.cu_seqlens[-1] == 1334
    x = padded_inputs(FAULT_LENGTHS, FAULT_HEADS, 128, seed=21)
    pool = torch.randn(call.num_slots, FAULT_HEADS, 128, 128, device=DEVICE)
    return x, call, pool, pool.clone()


def assert_rejected(result, pool, pool_before, fault):
    torch.cuda.synchronize()
    assert int(result.error_code) == int(fault), result.message()
    assert torch.equal(pool, pool_before), "a rejected call changed the state pool"
    assert bool(result.o.isnan().all()), "a rejected call left non-NaN output"
    assert fault.name in result.message()


@pytest.mark.parametrize("mutate, fault", [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS])
def test_fault_leaves_pool_untouched(mutate, fault):
    x, call, pool, pool_before = fault_setup()
    mutate(call)
    if any(s >= 2**31 for row in call.ck_slots for s in row):
        call.index_dtype = I64
    result = kda_prefill(x.q, x.k, x.v, x.g, x.beta, state_pool=pool, **call.tensors())
    assert_rejected(result, pool, pool_before, fault)


# The split pipeline's own kernels (stage-1 trio, checkpoint and output kernels) under the same
# faults, one of each class (fp32 operands: this checks the error path, not the rounding).
SPLIT = KernelConfig(chunk_size=64, block_v=16, num_stages=2, pipeline="split")
SEGMENTS = KernelConfig(chunk_size=64, block_v=16, num_stages=2, pipeline="split", segments=5)
SPLIT_FAULTS = ["checkpoint-on-other-final", "cu-seqlens-decreasing", "final-slot-eq-num-slots",
                "offsets-not-increasing"]


def force_ranges(monkeypatch, count: int) -> None:
    """Make the split pipeline cut its chunks into `count` ranges, whatever the shape."""
    from kdabench.kernels.triton import launch

    monkeypatch.setattr(launch, "split_range_count", lambda *_: count)


@pytest.mark.parametrize("config, ranges", [(SPLIT, 1), (SPLIT, 3), (SEGMENTS, 1)],
                         ids=["one-range", "three-ranges", "five-segments"])
@pytest.mark.parametrize("mutate, fault", [f[1:] for f in FAULTS if f[0] in SPLIT_FAULTS],
                         ids=SPLIT_FAULTS)
def test_split_pipeline_fault_leaves_pool_untouched(mutate, fault, config, ranges, monkeypatch):
    """The split pipeline in one range and in three, and parallel segments (the transition,
    scan and parallel pass kernels), under one fault of each class."""
    force_ranges(monkeypatch, ranges)
    x, call, pool, pool_before = fault_setup()
    mutate(call)
    caps = Caps(device=DEVICE, num_heads=FAULT_HEADS, head_dim=128, max_tokens=x.q.shape[0],
                max_seqs=len(FAULT_LENGTHS), max_state_slots=call.num_slots,
                max_checkpoints=CAPACITY)
    binding = bind(plan(caps, config), x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                   **call.tensors())
    assert_rejected(run(binding), pool, pool_before, fault)


# The clash check over tile pairs (kernels/triton/validate.py, kda_clash_kernel), on
# write_slot_clashes' cases: 1,500 writes, 24 tiles of 64, checked against each other and
# against the 5 tiles of initial slots, one program per pair, each ORing its finding into the
# code on the device.


@pytest.mark.parametrize("clash", list(CLASHES))
def test_write_slot_clashes_across_tiles(clash):
    from kdabench.oracles.metadata import expected_error_code

    n, length = MANY_SEQS, 6
    x = make_inputs([length] * n, 1, 64, seed=3, device=DEVICE)
    slots = {"initial": list(range(n)), "final": list(range(n, 2 * n)),
             "checkpoint": [[2 * n + CAPACITY * i + c for c in range(CAPACITY)] for i in range(n)]}
    offsets = [[1, 2, 3, 5]] * n
    fault = CLASHES[clash]
    if fault is None:
        slots["final"] = list(slots["initial"])
    else:
        (dst, i, c), (src, j, d) = fault

        def cell(kind, row, column):
            return (slots[kind][row], column) if kind == "checkpoint" else (slots[kind], row)

        target, at = cell(dst, i, c)
        source, frm = cell(src, j, d)
        target[at] = source[frm]
    num_slots = (2 + CAPACITY) * n
    cu = [length * i for i in range(n + 1)]
    expected = expected_error_code(cu, n, slots["initial"], slots["final"], offsets,
                                   slots["checkpoint"], num_slots, x.q.shape[0])
    assert expected == (0 if fault is None else int(MetadataFault.DUPLICATE_WRITE_SLOT))
    pool = torch.full((num_slots, 1, 64, 64), SENTINEL, device=DEVICE)
    pool[:n] = x.initial_state
    before = pool.clone()

    def index(values):
        return torch.tensor(values, dtype=torch.int32, device=DEVICE)

    result = kda_prefill(
        x.q, x.k, x.v, x.g, x.beta, state_pool=pool, cu_seqlens=index(cu),
        initial_state_indices=index(slots["initial"]), final_state_indices=index(slots["final"]),
        checkpoint_offsets=index(offsets), checkpoint_state_indices=index(slots["checkpoint"]),
    )  # fmt: skip
    torch.cuda.synchronize()
    assert int(result.error_code) == expected, result.message()
    if fault is None:
        assert not torch.equal(pool, before)
    else:
        assert torch.equal(pool, before)
        assert torch.isnan(result.o).all()


@pytest.mark.parametrize("num_seqs", [0, len(FAULT_LENGTHS) + 1], ids=["zero", "above-capacity"])
def test_fault_live_sequence_count(num_seqs):
    x, call, pool, pool_before = fault_setup()
    caps = Caps(device=DEVICE, num_heads=FAULT_HEADS, head_dim=128, max_tokens=x.q.shape[0],
                max_seqs=len(FAULT_LENGTHS), max_state_slots=call.num_slots,
                max_checkpoints=CAPACITY)
    binding = bind(plan(caps), x.q, x.k, x.v, x.g, x.beta, state_pool=pool, num_seqs=num_seqs,
                   **call.tensors())
    assert_rejected(run(binding), pool, pool_before, LENGTHS)


# ---- (d) CUDA graph -----------------------------------------------------------------------------

GRAPH_TOKENS, GRAPH_SEQS, GRAPH_SLOTS, GRAPH_HEADS = 4000, 6, 64, 16
GRAPH_REPLAYS = [  # lengths (the live sequences), initial slots, first slot written
    ([4000], [-1], 1),
    ([1000, 17, 1, 2000], [0, 1, 2, 3], 10),
    ([16, 15, 33, 64, 65, 3000], [5, -1, 6, 7, 8, 9], 20),
    ([2048, 1952], [30, 31], 40),
    ([100, 300, 500], [40, 41, 42], 0),
    ([1, 2, 3, 4, 5, 3333], [60, 61, 62, 63, 59, 58], 10),
]


@pytest.mark.parametrize("config, ranges", [
    (None, None), (SPLIT, None), (SPLIT, 3), (SEGMENTS, None),
    (KernelConfig(chunk_size=16, block_v=32, num_stages=2, segments=8), None)],
    ids=["default", "split", "split-3-ranges", "split-5-segments", "fused-8-segments"])
def test_cuda_graph_replays_with_new_metadata(config, ranges, monkeypatch):
    if ranges is not None:
        force_ranges(monkeypatch, ranges)
    x = make_inputs([GRAPH_TOKENS], GRAPH_HEADS, 128, gate="sigmoid", qk_l2norm=True,
                    beta_sigmoid=True, seed=31, device=DEVICE)
    caps = Caps(device=DEVICE, num_heads=GRAPH_HEADS, head_dim=128, max_tokens=GRAPH_TOKENS,
                max_seqs=GRAPH_SEQS, max_state_slots=GRAPH_SLOTS, max_checkpoints=CAPACITY,
                gate="sigmoid", qk_l2norm=True, beta_sigmoid=True)
    pool = torch.randn(GRAPH_SLOTS, GRAPH_HEADS, 128, 128, device=DEVICE)

    def metadata_tensor(shape, fill):
        return torch.full(shape, fill, dtype=I32, device=DEVICE)

    metadata = {
        "cu_seqlens": metadata_tensor((GRAPH_SEQS + 1,), GRAPH_TOKENS),
        "initial_state_indices": metadata_tensor((GRAPH_SEQS,), -1),
        "final_state_indices": metadata_tensor((GRAPH_SEQS,), -1),
        "checkpoint_offsets": metadata_tensor((GRAPH_SEQS, CAPACITY), 1),
        "checkpoint_state_indices": metadata_tensor((GRAPH_SEQS, CAPACITY), -1),
    }
    metadata["cu_seqlens"][0] = 0
    num_seqs = torch.ones(1, dtype=I32, device=DEVICE)
    binding = bind(plan(caps, config), x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                   A_log=x.A_log, dt_bias=x.dt_bias, num_seqs=num_seqs, **metadata)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            run(binding)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(binding)

    for replay, (lengths, initial, first_write) in enumerate(GRAPH_REPLAYS):
        call = Call(lengths, seed=40 + replay)
        n, pad = len(lengths), GRAPH_SEQS - len(lengths)
        final = [first_write + i for i in range(n)]
        next_slot = iter(range(first_write + n, GRAPH_SLOTS))
        ck_slots = [[next(next_slot) if s != -1 else -1 for s in row] for row in call.ck_slots]
        values = {
            "cu_seqlens": call.cu_seqlens + [call.cu_seqlens[-1]] * pad,
            "initial_state_indices": initial + [-1] * pad,
            "final_state_indices": final + [-1] * pad,
            "checkpoint_offsets": call.ck_offsets + [[1] * CAPACITY] * pad,
            "checkpoint_state_indices": ck_slots + [[-1] * CAPACITY] * pad,
        }
        for name, value in values.items():
            metadata[name].copy_(torch.tensor(value, dtype=I32))
        num_seqs.fill_(n)
        binding.out.fill_(SENTINEL)
        pool_before = pool.clone()
        graph.replay()
        torch.cuda.synchronize()
        assert int(captured.error_code) == 0, f"replay {replay}: {captured.message()}"

        live = call.cu_seqlens[-1]
        zeros = torch.zeros_like(pool[0])
        initial_states = torch.stack([pool_before[s] if s != -1 else zeros for s in initial])
        ref = recurrent_kda(*live_inputs(x, call), cu_seqlens=call.cu_seqlens,
                            initial_state=initial_states, prefix_lengths=call.offsets,
                            device=DEVICE, **x.gate_kwargs())
        o = captured.o
        assert not bool((o[:live] == SENTINEL).any()), f"replay {replay}: live rows not written"
        assert bool((o[live:] == SENTINEL).all()), f"replay {replay}: rows past the live ones"
        assert_close(f"replay {replay} o", ref.o, o[:live], OUTPUT_TOL)
        assert_close(f"replay {replay} final", ref.final_state, pool[final], STATE_TOL)
        written = set(final)
        for seq, row in enumerate(call.offsets):
            for c, offset in enumerate(row):
                written.add(ck_slots[seq][c])
                assert_close(f"replay {replay} sequence {seq} checkpoint at {offset}",
                             ref.prefix_states[seq][c], pool[ck_slots[seq][c]], STATE_TOL)
        for slot in sorted(set(range(GRAPH_SLOTS)) - written):
            assert torch.equal(pool[slot], pool_before[slot]), f"replay {replay}: slot {slot}"


@pytest.mark.parametrize("ranges", [2, 8])
@pytest.mark.parametrize("captured", [False, True], ids=["eager", "graph"])
def test_split_ranges_equal_one_range_bit_for_bit(ranges, captured, monkeypatch):
    """The split pipeline in ranges (each range's pass on a side stream, overlapping the next
    range's stage 1) writes the output and pool of one range bit for bit, eager and replayed
    from a CUDA graph; sequences cross the range edges and carry checkpoints on both sides."""
    lengths, heads = [3000, 1, 5000, 190], 4
    call = Call(lengths, seed=17)
    x = padded_inputs(lengths, heads, 128, seed=17)
    caps = Caps(device=DEVICE, num_heads=heads, head_dim=128, max_tokens=x.q.shape[0],
                max_seqs=len(lengths), max_state_slots=call.num_slots,
                max_checkpoints=CAPACITY)
    config = KernelConfig(chunk_size=64, block_v=16, num_stages=3, operand_dtype="bfloat16",
                          pipeline="split")
    initial = torch.randn(call.num_slots, heads, 128, 128, device=DEVICE)
    written = []
    for count in (1, ranges):
        force_ranges(monkeypatch, count)
        pool = initial.clone()
        binding = bind(plan(caps, config), x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                       **call.tensors())
        binding.out.fill_(SENTINEL)
        result = run(binding)
        if captured:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                result = run(binding)
            pool.copy_(initial)
            binding.out.fill_(SENTINEL)
            graph.replay()
        torch.cuda.synchronize()
        assert int(result.error_code) == 0, result.message()
        written.append((result.o.clone(), pool))
    (o_one, pool_one), (o_many, pool_many) = written
    assert torch.equal(o_many, o_one)
    assert torch.equal(pool_many, pool_one)
    assert not torch.equal(pool_one, initial)


def test_split_ranges_follow_capture(monkeypatch):
    """The split pipeline asks for its range count as captured under a CUDA graph or not (a
    launch costs nothing on replay, so a captured call may cut its chunks finer)."""
    from kdabench.kernels.triton import launch

    asked = []
    policy = launch.split_range_count
    monkeypatch.setattr(launch, "split_range_count",
                        lambda slots, capacity, capturing: asked.append(capturing)
                        or policy(slots, capacity, capturing))
    lengths, heads = [9000], 2
    call = Call(lengths, seed=5)
    x = padded_inputs(lengths, heads, 128, seed=5)
    caps = Caps(device=DEVICE, num_heads=heads, head_dim=128, max_tokens=x.q.shape[0],
                max_seqs=1, max_state_slots=call.num_slots, max_checkpoints=CAPACITY)
    pool = torch.zeros(call.num_slots, heads, 128, 128, device=DEVICE)
    binding = bind(plan(caps, KernelConfig(chunk_size=64, block_v=16, pipeline="split")),
                   x.q, x.k, x.v, x.g, x.beta, state_pool=pool, **call.tensors())
    run(binding)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(binding)
    assert asked == [False, True]
    chunks = launch.chunk_slots(x.q.shape[0], 1, 64)
    assert policy(chunks, 1, False) == 1 and policy(chunks, 1, True) == 2


# ---- (e) 64-bit pool addressing -----------------------------------------------------------------


def test_pool_slots_past_2_31_elements():
    heads, dim = 4, 128
    slot_elements = heads * dim * dim  # 65536: slot 32768 starts at element 2^31
    num_slots = round_up(33000)  # ~8.7 GB
    initial_slot, final_slot = 32900, 32768 + 100
    checkpoint_slots = [num_slots - 1, 32768]
    assert min(initial_slot, final_slot, *checkpoint_slots) * slot_elements >= 2**31
    lengths, offsets = [777], [300, 512]
    x = padded_inputs(lengths, heads, dim, seed=51)
    pool = torch.randn(num_slots, heads, dim, dim, device=DEVICE)
    pool[initial_slot] = x.initial_state[0]
    checksums_before = pool.view(num_slots, -1).sum(dim=1)
    spot = [0, 1, 100, 32767, 32769, final_slot - 1, final_slot + 1, num_slots - 2, initial_slot]
    spot_before = pool[spot].clone()

    def index(values):
        return torch.tensor(values, dtype=I64, device=DEVICE)

    result = kda_prefill(
        x.q, x.k, x.v, x.g, x.beta, state_pool=pool, cu_seqlens=index([0, 777]),
        initial_state_indices=index([initial_slot]), final_state_indices=index([final_slot]),
        checkpoint_offsets=index([[*offsets, 0, 0]]),
        checkpoint_state_indices=index([[*checkpoint_slots, -1, -1]]),
    )  # fmt: skip
    assert int(result.error_code) == 0, result.message()
    ref = recurrent_kda(x.q[:777], x.k[:777], x.v[:777], x.g[:777], x.beta[:777],
                        initial_state=x.initial_state[:1], prefix_lengths=[offsets],
                        device=DEVICE)
    assert_close("o", ref.o, result.o[:777], OUTPUT_TOL)
    assert_close("final state past 2^31", ref.final_state[0], pool[final_slot], STATE_TOL)
    for i, slot in enumerate(checkpoint_slots):
        assert_close(f"checkpoint at {offsets[i]} in slot {slot}", ref.prefix_states[0][i],
                     pool[slot], STATE_TOL)
    assert torch.equal(pool[spot], spot_before), "a slot near the written ones changed"
    checksums = pool.view(num_slots, -1).sum(dim=1)
    changed = (checksums != checksums_before).nonzero().flatten().tolist()
    assert sorted(changed) == sorted([final_slot, *checkpoint_slots]), f"slots changed: {changed}"
