"""The Triton prefill under the interpreter (CPU) against the float64 recurrence.

Every case checks outputs, final states and every exported checkpoint against `recurrent_kda`,
that every live output row was written (the output is poisoned first), that no pool slot other
than the call's destinations changed, and, kernel against kernel, that each checkpoint equals
the final state of a second run over its prefix to fp32 rounding (PREFIX_TOL).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest
import torch

from kdabench.inputs import lengths_with_edges, make_inputs
from kdabench.kernels import Caps, KernelConfig, bind, kda_prefill, plan, run
from kdabench.oracles import assert_close, prefix_batch, recurrent_kda

OUTPUT_TOL = 5e-3  # bf16 outputs (the interpreter truncates fp32 -> bf16: ~3.3e-3 measured)
STATE_TOL = 3e-3  # fp32 states (~1e-7 measured on the CPU)
# A checkpoint against the final state of a run over its prefix: the same fp32 arithmetic on the
# same values, but not bit for bit by construction. The prefix run's operands have other shapes,
# and under the interpreter tl.dot is numpy's BLAS, whose kernel (OPENBLAS_CORETYPE) decides the
# order in which a product's terms are summed. A reordered fp32 sum of n terms moves by at most
# n * 2**-24 of the sum of magnitudes: n = K = 128 products per entry, 128 * 6e-8 = 7.6e-6, and
# a few such sums per token. Measured: 0 with the default kernel, 3.5e-8 with Haswell's; a
# checkpoint one token off errs by ~1e-2.
PREFIX_TOL = 1e-5
CHUNK = 16
SENTINEL = 16384.0  # exact in bf16; no output of these inputs comes near it


@dataclass
class Metadata:
    """One call's metadata as Python lists; checkpoint rows hold C entries (-1 slot: inactive)."""

    cu_seqlens: list[int]
    initial: list[int]
    final: list[int]
    ck_offsets: list[list[int]]
    ck_slots: list[list[int]]

    @property
    def lengths(self) -> list[int]:
        return [b - a for a, b in zip(self.cu_seqlens, self.cu_seqlens[1:])]

    def active_checkpoints(self) -> list[list[tuple[int, int]]]:
        """(offset, slot) of the active entries, per sequence, in entry order."""
        return [[(o, s) for o, s in zip(offs, slots) if s != -1]
                for offs, slots in zip(self.ck_offsets, self.ck_slots)]

    def write_slots(self) -> list[int]:
        ck = [s for row in self.active_checkpoints() for _, s in row]
        return [s for s in self.final if s != -1] + ck

    def tensors(self, dtype: torch.dtype, vector: bool) -> dict[str, torch.Tensor]:
        def t(values):
            return torch.tensor(values, dtype=dtype)

        offsets, slots = t(self.ck_offsets), t(self.ck_slots)
        if vector:
            offsets, slots = offsets[:, 0].contiguous(), slots[:, 0].contiguous()
        return {"cu_seqlens": t(self.cu_seqlens), "initial_state_indices": t(self.initial),
                "final_state_indices": t(self.final), "checkpoint_offsets": offsets,
                "checkpoint_state_indices": slots}


def lay_out(lengths, checkpoints, *, capacity, null_initial=(), null_final=(), seed=0):
    """Metadata and slot count for `checkpoints` (per sequence: C entries, an offset or None).

    Every slot is distinct (drawn from a random permutation); inactive entries carry garbage
    offsets (0, or past the end), which the kernel must ignore.
    """
    rng = random.Random(seed)
    n = len(lengths)
    num_slots = n * (2 + capacity) + 3
    free = rng.sample(range(num_slots), num_slots)
    initial = [-1 if i in null_initial else free.pop() for i in range(n)]
    final = [-1 if i in null_final else free.pop() for i in range(n)]
    ck_offsets, ck_slots = [], []
    for length, row in zip(lengths, checkpoints):
        assert len(row) == capacity
        ck_offsets.append([rng.choice([0, length + 5]) if o is None else o for o in row])
        ck_slots.append([-1 if o is None else free.pop() for o in row])
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    return Metadata(cu, initial, final, ck_offsets, ck_slots), num_slots


def random_checkpoints(rng: random.Random, length: int, capacity: int) -> list[int | None]:
    """Up to `capacity` increasing offsets from {1, len-1, multiples of 16, one random}."""
    candidates = {1, length - 1, rng.randint(1, max(length - 1, 1))}
    candidates |= set(range(CHUNK, length, CHUNK))
    candidates = sorted(c for c in candidates if 1 <= c <= length - 1)
    chosen = sorted(rng.sample(candidates, rng.randint(0, min(capacity, len(candidates)))))
    row: list[int | None] = [None] * capacity
    positions = sorted(rng.sample(range(capacity), len(chosen)))
    for position, offset in zip(positions, chosen):
        row[position] = offset
    return row


def make_pool(meta: Metadata, num_slots, x, seed) -> torch.Tensor:
    """A pool of random states (so stray writes show) with the initial states in place."""
    num_heads, dim = x.q.shape[1], x.q.shape[2]
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randn(num_slots, num_heads, dim, dim, generator=gen)
    for n, slot in enumerate(meta.initial):
        if slot != -1:
            pool[slot] = x.initial_state[n]
    return pool


def initial_states(meta: Metadata, pool: torch.Tensor) -> torch.Tensor:
    """[N, H, V, K] initial states as the kernel reads them (zeros for the null slot)."""
    zeros = torch.zeros_like(pool[0])
    return torch.stack([pool[s] if s != -1 else zeros for s in meta.initial])


def check_against_oracle(x, meta, pool_before, pool, o, *, scale=None):
    """Outputs of the live rows, finals, checkpoints and untouched slots against float64."""
    live = meta.cu_seqlens[-1]
    tokens = slice(0, live)
    active = meta.active_checkpoints()
    ref = recurrent_kda(
        x.q[tokens], x.k[tokens], x.v[tokens], x.g[tokens], x.beta[tokens],
        cu_seqlens=meta.cu_seqlens, initial_state=initial_states(meta, pool_before),
        scale=scale, prefix_lengths=[[off for off, _ in row] for row in active],
        **x.gate_kwargs(),
    )
    unwritten = (o[:live] == SENTINEL).flatten(1).any(dim=1).nonzero().flatten().tolist()
    assert not unwritten, f"live output rows never written: {unwritten}"
    assert_close("o", ref.o, o[:live], OUTPUT_TOL)

    finals = [n for n, s in enumerate(meta.final) if s != -1]
    if finals:
        got = torch.stack([pool[meta.final[n]] for n in finals])
        assert_close("final states", ref.final_state[finals], got, STATE_TOL)
    for n, row in enumerate(active):
        for i, (offset, slot) in enumerate(row):
            assert_close(f"checkpoint of sequence {n} at offset {offset}",
                         ref.prefix_states[n][i], pool[slot], STATE_TOL)
    for n, length in enumerate(meta.lengths):
        if length == 0 and meta.final[n] != -1:
            assert torch.equal(pool[meta.final[n]], initial_states(meta, pool_before)[n]), (
                f"zero-length sequence {n}: final state is not its initial state, bit for bit")

    written = set(meta.write_slots())
    untouched = [s for s in range(pool.shape[0]) if s not in written]
    changed = [s for s in untouched if not torch.equal(pool[s], pool_before[s])]
    assert not changed, f"slots outside the call's destinations changed: {changed}"


def check_against_prefix_runs(x, meta, pool_before, pool, index_dtype, *, scale=None):
    """Each checkpoint vs the final state of a second kernel run over its prefix (PREFIX_TOL)."""
    active = meta.active_checkpoints()
    batch = prefix_batch(meta.cu_seqlens, [[off for off, _ in row] for row in active])
    if not batch.owners:
        return
    p = len(batch.owners)
    idx = batch.token_index
    init_pool = initial_states(meta, pool_before)[batch.sequence_index]
    prefix_pool = torch.cat([init_pool, torch.zeros_like(init_pool)])
    initial = [n if meta.initial[owner] != -1 else -1 for n, (owner, _) in enumerate(batch.owners)]
    result = kda_prefill(
        x.q[idx], x.k[idx], x.v[idx], x.g[idx], x.beta[idx], state_pool=prefix_pool,
        cu_seqlens=batch.cu_seqlens.to(index_dtype),
        initial_state_indices=torch.tensor(initial, dtype=index_dtype),
        final_state_indices=torch.arange(p, 2 * p, dtype=index_dtype),
        scale=scale, **x.gate_kwargs(),
    )
    assert int(result.error_code) == 0, result.message()
    slots = [s for row in active for _, s in row]
    for i, ((n, offset), slot) in enumerate(zip(batch.owners, slots)):
        assert_close(f"sequence {n}: the checkpoint at offset {offset} vs the final state of a "
                     "run over its prefix", prefix_pool[p + i], pool[slot], PREFIX_TOL)


N_ = None  # an inactive checkpoint entry, in the tables below

CASES = [
    # id, lengths, heads, head_dim, capacity, checkpoints, gate, l2norm+beta_sigmoid, index dtype,
    # null initial slots, null final slots, scale
    ("L1-15-16-17-33-H2-K64-C1-precomputed-i32", [1, 15, 16, 17, 33], 2, 64, 1,
     [[N_], [1], [14], [16], [32]], "precomputed", False, torch.int32, (0, 3), (), None),
    ("L33-17-H1-K64-C2-sigmoid-i64", [33, 17], 1, 64, 2,
     [[16, 17], [N_, 9]], "sigmoid", False, torch.int64, (1,), (), None),
    ("L17-1-16-H3-K64-C4-softplus-l2norm-betasigmoid-i32", [17, 1, 16], 3, 64, 4,
     [[1, 5, N_, 16], [N_, N_, N_, N_], [N_, 8, 15, N_]], "softplus", True, torch.int32,
     (), (1,), None),
    ("L48-H2-K64-C4-offsets1-16-32-47-precomputed-i64", [48], 2, 64, 4,
     [[1, 16, 32, 47]], "precomputed", False, torch.int64, (), (), None),
    ("L33-0-20-H2-K64-C2-zero-length-sigmoid-l2norm-i32", [33, 0, 20], 2, 64, 2,
     [[N_, 31], [N_, N_], [3, 19]], "sigmoid", True, torch.int32, (2,), (), None),
    ("L40-H1-K128-C4-precomputed-scale0.3-i64", [40], 1, 128, 4,
     [[7, 16, N_, 39]], "precomputed", False, torch.int64, (), (), 0.3),
]


def random_case(seed: int, capacity: int, gate: str, index_dtype: torch.dtype, *,
                num_seqs: int = 4, max_len: int = 40, heads: int = 2):
    rng = random.Random(seed)
    lengths = lengths_with_edges(rng, num_seqs, max_len)
    checkpoints = [random_checkpoints(rng, n, capacity) for n in lengths]
    null_initial = tuple(i for i in range(num_seqs) if rng.random() < 0.3)
    fused_norms = seed % 2 == 1
    name = "-".join(map(str, lengths)) if num_seqs <= 6 else f"{num_seqs}seqs-upto{max_len}"
    norms = "-l2norm-betasigmoid" if fused_norms else ""
    dtype = "i32" if index_dtype == torch.int32 else "i64"
    return (f"random{seed}-L{name}-H{heads}-K64-C{capacity}-{gate}{norms}-{dtype}", lengths,
            heads, 64, capacity, checkpoints, gate, fused_norms, index_dtype, null_initial, (),
            None)


CASES += [
    random_case(101, 4, "precomputed", torch.int32),
    random_case(102, 2, "softplus", torch.int64),
    random_case(103, 1, "sigmoid", torch.int64),
    # more sequences than one block of the validator (64): chunk offsets across blocks
    random_case(104, 2, "precomputed", torch.int32, num_seqs=70, max_len=20, heads=1),
]


@pytest.mark.parametrize(
    "lengths, heads, head_dim, capacity, checkpoints, gate, fused_norms, index_dtype, "
    "null_initial, null_final, scale",
    [case[1:] for case in CASES], ids=[case[0] for case in CASES],
)
def test_prefill_matches_recurrent_oracle(lengths, heads, head_dim, capacity, checkpoints, gate,
                                          fused_norms, index_dtype, null_initial, null_final,
                                          scale, seed):
    x = make_inputs(lengths, heads, head_dim, gate=gate, qk_l2norm=fused_norms,
                    beta_sigmoid=fused_norms, seed=seed % 1000)
    meta, num_slots = lay_out(lengths, checkpoints, capacity=capacity, null_initial=null_initial,
                              null_final=null_final, seed=seed)
    pool = make_pool(meta, num_slots, x, seed)
    pool_before = pool.clone()
    out = torch.full_like(x.v, SENTINEL)
    result = kda_prefill(x.q, x.k, x.v, x.g, x.beta, state_pool=pool, out=out, scale=scale,
                         **meta.tensors(index_dtype, vector=capacity == 1), **x.gate_kwargs())
    assert int(result.error_code) == 0, result.message()
    assert result.o.data_ptr() == out.data_ptr(), "the kernel did not write into out="
    check_against_oracle(x, meta, pool_before, pool, result.o, scale=scale)
    check_against_prefix_runs(x, meta, pool_before, pool, index_dtype, scale=scale)


def test_planned_binding_reused_with_new_metadata(seed):
    """One binding, two runs: new lengths, offsets, slots and a smaller live count in place."""
    heads, dim, max_tokens = 2, 64, 64
    x = make_inputs([max_tokens], heads, dim, gate="sigmoid", seed=seed % 1000)
    caps = Caps(device="cpu", num_heads=heads, head_dim=dim, max_tokens=max_tokens, max_seqs=3,
                max_state_slots=20, max_checkpoints=2, gate="sigmoid")
    planned = plan(caps)
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randn(20, heads, dim, dim, generator=gen)
    first = Metadata([0, 17, 47, 56], [0, -1, 1], [2, 3, 4], [[16, 9], [1, 29], [0, 0]],
                     [[5, -1], [6, 7], [-1, -1]])
    second = Metadata([0, 33, 40, 40], [3, 4, 0], [8, 9, -1], [[1, 32], [3, 0], [0, 0]],
                      [[10, 11], [12, -1], [-1, -1]])  # third entry left over, not live
    tensors = first.tensors(torch.int64, vector=False)
    binding = bind(planned, x.q, x.k, x.v, x.g, x.beta, state_pool=pool, A_log=x.A_log,
                   dt_bias=x.dt_bias, **tensors)
    for meta, live in ((first, 3), (second, 2)):
        for name, value in meta.tensors(torch.int64, vector=False).items():
            getattr(binding, name).copy_(value)
        binding.set_num_seqs(live)
        live_meta = Metadata(meta.cu_seqlens[: live + 1], meta.initial[:live], meta.final[:live],
                             meta.ck_offsets[:live], meta.ck_slots[:live])
        binding.out.fill_(SENTINEL)
        pool_before = pool.clone()
        result = run(binding)
        assert int(result.error_code) == 0, result.message()
        check_against_oracle(x, live_meta, pool_before, pool, result.o)
        rest = result.o[live_meta.cu_seqlens[-1]:]
        assert bool((rest == SENTINEL).all()), "rows past the live tokens were written"


@pytest.mark.parametrize("pipeline, solve", [
    ("fused", "substitution"), ("split", "substitution"), ("split", "inverse")],
    ids=["fused", "split", "split-inverse"])
@pytest.mark.parametrize("chunk_size, block_v, fused_norms", [
    (16, 16, False), (32, 32, True), (64, 16, False), (64, 64, True)],
    ids=["c16-bv16", "c32-bv32-l2norm", "c64-bv16", "c64-bv64-l2norm"])
def test_kernel_configs_match_recurrent_oracle(pipeline, solve, chunk_size, block_v, fused_norms,
                                               seed):
    """Each pipeline (the split one with either solve of stage 1) at each chunk size (one, two
    and four 16-token sub-blocks in stage 1) and V block, on sequences spanning several chunks,
    a partial last chunk and checkpoints inside chunks, against the float64 recurrence."""
    config = KernelConfig(chunk_size=chunk_size, block_v=block_v, pipeline=pipeline, solve=solve)
    planned = run_config_checked(config, fused_norms, seed,
                                 [[1, 63, 64, 100], [N_, 4, N_, N_], [16, N_, 48, 63]])
    assert ("ws_S" in planned.workspaces) == (pipeline == "split")


@pytest.mark.parametrize("pipeline, solve, block_v, fused_norms", [
    ("fused", "substitution", 16, False), ("fused", "substitution", 32, True),
    ("split", "substitution", 16, False), ("split", "inverse", 64, True)],
    ids=["fused-bv16", "fused-bv32-l2norm", "split-bv16", "split-inverse-bv64-l2norm"])
def test_checkpoints_in_the_pass_match_recurrent_oracle(pipeline, solve, block_v, fused_norms,
                                                        seed):
    """config.checkpoints "pass" (16-token chunks): each interior checkpoint formed in the state
    pass from kd^T, at a chunk's first and last in-chunk positions, two in one chunk, in the
    partial last chunk of a sequence and in the one chunk of a short sequence, against the
    float64 recurrence."""
    config = KernelConfig(chunk_size=16, block_v=block_v, pipeline=pipeline, solve=solve,
                          checkpoints="pass")
    run_config_checked(config, fused_norms, seed,
                       [[1, 15, 64, 147], [N_, 4, N_, N_], [17, 31, 48, 63]])


@pytest.mark.parametrize("pipeline", ["fused", "split"])
@pytest.mark.parametrize("erasing", [False, True], ids=["mild", "erasing"])
def test_checkpoints_in_the_pass_exact_up_to_the_largest_lift(pipeline, erasing, seed):
    """config.checkpoints "pass" forms each checkpoint from kd^T scaled by exp(lift), lift =
    G_p - G_last per channel, and stays exact up to the largest lift the gate contract allows
    a 16-token chunk. Mild gates (at most -0.5 a token) keep every lift at most 7.5; erasing
    ones hold one channel of each head at the lower bound, -5 a token, a lift of 5 for each
    token from the checkpoint to its chunk's last one: 75 at in-chunk position 1 (offsets 1
    and 17), the contract's largest. Each against the float64 recurrence."""
    lengths = [150, 37]
    x = make_inputs(lengths, 2, 64, seed=seed % 1000)
    x.g.clamp_(min=-0.5)
    if erasing:
        x.g[:, :, 5] = -5.0
    config = KernelConfig(chunk_size=16, block_v=32, pipeline=pipeline, checkpoints="pass")
    run_layout_checked(config, x, lengths, [[1, 29, 57, 141], [13, 17, N_, 36]], seed)


def run_config_checked(config: KernelConfig, fused_norms: bool, seed: int,
                       checkpoints: list[list[int]]):
    """Plan `config` for three sequences (150, 5 and 64 tokens, 2 heads of 64, the softplus
    gate) with these checkpoints at capacity 4, run it and check it against the float64
    recurrence (run_checked); returns the plan."""
    lengths = [150, 5, 64]
    x = make_inputs(lengths, 2, 64, gate="softplus", qk_l2norm=fused_norms,
                    beta_sigmoid=fused_norms, seed=seed % 1000)
    return run_layout_checked(config, x, lengths, checkpoints, seed, gate="softplus",
                              qk_l2norm=fused_norms, beta_sigmoid=fused_norms)


def run_layout_checked(config: KernelConfig, x, lengths: list[int],
                       checkpoints: list[list[int]], seed: int, **caps_options):
    """Plan `config` for inputs x of sequences of `lengths` with these checkpoints at capacity
    4 (caps_options: the gate and the fused transforms), run it and check it against the
    float64 recurrence (run_checked); returns the plan."""
    heads, dim = x.q.shape[1], x.q.shape[2]
    meta, num_slots = lay_out(lengths, checkpoints, capacity=4, seed=seed)
    caps = Caps(device="cpu", num_heads=heads, head_dim=dim, max_tokens=sum(lengths),
                max_seqs=len(lengths), max_state_slots=num_slots, max_checkpoints=4,
                **caps_options)
    planned = plan(caps, config)
    run_checked(planned, x, meta, make_pool(meta, num_slots, x, seed))
    return planned


def run_checked(planned, x, meta: Metadata, pool: torch.Tensor) -> torch.Tensor:
    """Bind `planned` to x and meta with int32 metadata, run it into a poisoned output, check
    the error code and everything against the float64 recurrence; returns the output."""
    pool_before = pool.clone()
    binding = bind(planned, x.q, x.k, x.v, x.g, x.beta, state_pool=pool, A_log=x.A_log,
                   dt_bias=x.dt_bias, **meta.tensors(torch.int32, vector=False))
    binding.out.fill_(SENTINEL)
    result = run(binding)
    assert int(result.error_code) == 0, result.message()
    check_against_oracle(x, meta, pool_before, pool, result.o)
    return result.o


@pytest.mark.parametrize("segments", [2, 3, 7])
def test_split_ranges_equal_one_pass_bit_for_bit(segments, seed, monkeypatch):
    """The split pipeline in ranges of chunks (each range's pass starting from the state the
    previous one carried in ws_carry) gives the output and pool of one range, bit for bit:
    sequences cross range boundaries, one is empty, checkpoints fall on both sides of them."""
    from kdabench.kernels.triton import launch

    lengths, heads, dim = [150, 0, 5, 90], 2, 64
    checkpoints = [[1, 63, 64, 100], [N_, N_, N_, N_], [4, N_, N_, N_], [16, 32, 48, 89]]
    x = make_inputs(lengths, heads, dim, gate="softplus", seed=seed % 1000)
    meta, num_slots = lay_out(lengths, checkpoints, capacity=4, seed=seed)
    caps = Caps(device="cpu", num_heads=heads, head_dim=dim, max_tokens=sum(lengths),
                max_seqs=len(lengths), max_state_slots=num_slots, max_checkpoints=4,
                gate="softplus")
    config = KernelConfig(chunk_size=16, block_v=32, pipeline="split")
    passes = []
    state_pass = launch._state_pass
    monkeypatch.setattr(launch, "_state_pass", lambda *args: passes.append(args[2:])
                        or state_pass(*args))
    results = []
    for count in (1, segments):
        monkeypatch.setattr(launch, "split_range_count", lambda *_, count=count: count)
        passes.clear()
        pool = make_pool(meta, num_slots, x, seed)
        pool_before = pool.clone()
        binding = bind(plan(caps, config), x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                       A_log=x.A_log, dt_bias=x.dt_bias, **meta.tensors(torch.int32, vector=False))
        result = run(binding)
        assert int(result.error_code) == 0, result.message()
        results.append((result.o.clone(), pool))
        assert [segment for segment, _, _ in passes] == list(range(count))
        assert passes[0][1] == 0 and all(a[2] == b[1] for a, b in itertools.pairwise(passes))
    check_against_oracle(x, meta, pool_before, pool, result.o)
    (o_one, pool_one), (o_many, pool_many) = results
    assert torch.equal(o_many, o_one)
    assert torch.equal(pool_many, pool_one)


@pytest.mark.parametrize("bound_slots, meta_capacity, capturing, expected", [
    (129, 1, False, 1),    # 8192 tokens, chunk 64, eager: one range
    (129, 1, True, 2),     # the same captured: launches are free on replay
    (513, 1, False, 2),    # 32768 tokens eager
    (1025, 1, False, 4),
    (1025, 1, True, 8),    # capped at SPLIT_RANGES
    (133, 4, True, 1),     # four sequences already run four passes side by side
    (5, 8, True, 1),       # fewer chunks than slots
    (0, 0, False, 1),
])
def test_split_range_count(bound_slots, meta_capacity, capturing, expected):
    from kdabench.kernels.triton import launch

    assert launch.SPLIT_RANGES == 8
    assert launch.split_range_count(bound_slots, meta_capacity, capturing) == expected


# Segmented against serial: the same fp32 chain, except that each range edge's state arrives
# through P_r S + b_r instead of token after token (a reordered sum of K = 64 terms per entry,
# a few times over), so equal to about 1e-6 where a wrong transition errs by O(1).
SEGMENT_TOL = 1e-5


@pytest.mark.parametrize("pipeline, finished_in", [
    ("fused", "kernel"), ("split", "kernel"), ("split", "pass")],
    ids=["fused", "split", "split-in-pass"])
@pytest.mark.parametrize("segments", [2, 3, 7])
def test_parallel_segments_match_the_serial_walk(pipeline, finished_in, segments, seed):
    """Parallel segments (kernels/triton/segments.py) against the float64 recurrence and
    against the serial walk of the same config: ranges cut sequences (one runs through several
    ranges, one is empty, one starts inside a range and runs past it), checkpoints fall on
    both sides of range edges (finished by their kernel or in the pass), and one sequence's
    initial slot is its final slot (the copy the transition pass takes must be what the first
    range reads)."""
    lengths, heads, dim = [150, 0, 5, 90, 33], 2, 64
    checkpoints = [[1, 63, 64, 100], [N_, N_, N_, N_], [4, N_, N_, N_], [16, 32, 48, 89],
                   [N_, 17, N_, N_]]
    x = make_inputs(lengths, heads, dim, gate="softplus", seed=seed % 1000)
    meta, num_slots = lay_out(lengths, checkpoints, capacity=4, seed=seed)
    meta.final[0] = meta.initial[0]  # in place: the long sequence writes back its own slot
    caps = Caps(device="cpu", num_heads=heads, head_dim=dim, max_tokens=sum(lengths),
                max_seqs=len(lengths), max_state_slots=num_slots, max_checkpoints=4,
                gate="softplus")
    results = []
    for count in (1, segments):
        config = KernelConfig(chunk_size=16, block_v=32, pipeline=pipeline, segments=count,
                              checkpoints=finished_in)
        planned = plan(caps, config)
        assert ("ws_trans" in planned.workspaces) == (count > 1)
        pool = make_pool(meta, num_slots, x, seed)
        results.append((run_checked(planned, x, meta, pool).clone(), pool))
    (o_serial, pool_serial), (o_parallel, pool_parallel) = results
    assert_close("output, segmented vs serial", o_serial.float(), o_parallel.float(), OUTPUT_TOL)
    assert_close("pool, segmented vs serial", pool_serial, pool_parallel, SEGMENT_TOL)


def test_parallel_segments_leave_the_pool_unchanged_on_bad_metadata(seed):
    """A rejected call with parallel segments writes NaN to the output and nothing to the
    pool, bit for bit: the transition and scan kernels do not run on a non-zero code."""
    lengths, heads, dim = [150, 40], 2, 64
    x = make_inputs(lengths, heads, dim, gate="softplus", seed=seed % 1000)
    meta, num_slots = lay_out(lengths, [[1, 63, 64, 100], [16, N_, N_, N_]], capacity=4,
                              seed=seed)
    meta.ck_slots[1][0] = meta.final[0]  # a destination written twice
    caps = Caps(device="cpu", num_heads=heads, head_dim=dim, max_tokens=sum(lengths),
                max_seqs=len(lengths), max_state_slots=num_slots, max_checkpoints=4,
                gate="softplus")
    pool = make_pool(meta, num_slots, x, seed)
    pool_before = pool.clone()
    config = KernelConfig(chunk_size=16, block_v=32, segments=4)
    binding = bind(plan(caps, config), x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                   A_log=x.A_log, dt_bias=x.dt_bias, **meta.tensors(torch.int32, vector=False))
    result = run(binding)
    assert int(result.error_code) & 1, result.message()
    assert torch.equal(pool, pool_before)
    assert bool(result.o.isnan().all())
