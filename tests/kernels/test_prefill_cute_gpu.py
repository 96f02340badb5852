"""The cute backend on a GPU: the contract of docs/DESIGN.md §2, as the Triton tests.

Runs the CuTe kernels from an ahead-of-time build ($KDABENCH_CUTE_KERNELS) or compiled just in
time; skips without a GPU or when neither is available. For every config (CuteConfig: the
tensor-core chunks with each key split, and the token recurrence): outputs, final states and up to four exported
states against the float64 recurrence (all gate modes and transforms, K 64 and 128, int32 and
int64 indices), a fault leaving the pool bit for bit unchanged, one CUDA graph replayed with
new metadata, and agreement with the Triton backend on the same inputs.

    KDABENCH_CUTE_KERNELS=DIR python -m pytest tests/kernels/test_prefill_cute_gpu.py -m gpu
"""

from __future__ import annotations

import random

import cute_chunk_edges
import pytest
import torch
from write_slot_clashes import CLASHES, MANY_SEQS

from kdabench.inputs import make_inputs
from kdabench.kernels import Caps, MetadataFault, bind, ineligibility, kda_prefill, plan, run
from kdabench.kernels.config import CuteConfig
from kdabench.kernels.cute import launch as cute_launch
from kdabench.kernels.cute.manifest import arch_of
from kdabench.kernels.cute.variants import KEY_SPLITS, WGMMA_ARCHS, key_split_divides
from kdabench.oracles import recurrent_kda, relative_error
from kdabench.oracles.metadata import expected_error_code

pytestmark = pytest.mark.gpu

OUTPUT_TOL = 5e-3
STATE_TOL = 3e-3
# the chunk algorithm's state path runs split in three on bf16 tensor cores, near fp32
CHUNK_STATE_TOL = 2e-5
DEVICE = "cuda"
SENTINEL = 0.25
CONFIGS = {"recurrence": CuteConfig(algorithm="recurrence"),
           **{f"chunk-s{s}": CuteConfig(algorithm="chunk", key_split=s) for s in KEY_SPLITS},
           "wgmma": CuteConfig(algorithm="wgmma")}
TENSOR_CORE = ("chunk", "wgmma")  # the algorithms whose state path runs split in three

# lengths, heads, head_dim, gate, qk_l2norm + beta_sigmoid, capacity, index dtype
CASES = {
    "K128-H8-ragged-precomputed-C4": ([700, 1, 64, 333], 8, 128, "precomputed", False, 4,
                                      torch.int32),
    "K64-H4-sigmoid-fused-C2-i64": ([257, 1000], 4, 64, "sigmoid", True, 2, torch.int64),
    "K128-H2-softplus-C1": ([2048], 2, 128, "softplus", False, 1, torch.int32),
    "K128-H16-fused-softplus-C4": ([513, 129, 77], 16, 128, "softplus", True, 4, torch.int64),
}


@pytest.fixture(autouse=True)
def cute_available(request):
    reasons = ineligibility(Caps(device=DEVICE, num_heads=1, head_dim=64, max_tokens=1,
                                 max_seqs=1, max_state_slots=1, backend="cute"))
    if reasons:
        pytest.skip("cute backend unavailable: " + "; ".join(reasons))
    params = getattr(request.node, "callspec", None)
    if params is not None and params.params.get("config") == "wgmma" \
            and arch_of(torch.cuda.get_device_capability()) not in WGMMA_ARCHS:
        pytest.skip(f"the wgmma pass runs on {', '.join(WGMMA_ARCHS)} only")


def metadata(lengths: list[int], capacity: int, dtype: torch.dtype, seed: int):
    """Slots (initial n, final N + n, checkpoints after) and random increasing offsets."""
    rng = random.Random(seed)
    n = len(lengths)
    offsets, slots = [], []
    for i, length in enumerate(lengths):
        picks = sorted(rng.sample(range(1, length), min(capacity, length - 1)))
        picks += [1] * (capacity - len(picks))
        active = min(capacity, length - 1)
        offsets.append(picks)
        slots.append([2 * n + i * capacity + c if c < active else -1 for c in range(capacity)])
    shape = (n,) if capacity == 1 else (n, capacity)

    def tensor(values):
        return torch.tensor(values, dtype=dtype, device=DEVICE).reshape(shape)

    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    return {
        "cu_seqlens": torch.tensor(cu, dtype=dtype, device=DEVICE),
        "initial_state_indices": torch.arange(n, dtype=dtype, device=DEVICE),
        "final_state_indices": torch.arange(n, 2 * n, dtype=dtype, device=DEVICE),
        "checkpoint_offsets": tensor(offsets),
        "checkpoint_state_indices": tensor(slots),
    }, offsets, slots, 2 * n + n * capacity


def prepared(case_id: str):
    lengths, heads, dim, gate, fused, capacity, dtype = CASES[case_id]
    x = make_inputs(lengths, heads, dim, gate=gate, qk_l2norm=fused, beta_sigmoid=fused,
                    seed=len(case_id), device=DEVICE)
    tensors, offsets, slots, num_slots = metadata(lengths, capacity, dtype, seed=heads)
    pool = torch.full((num_slots, heads, dim, dim), SENTINEL, device=DEVICE)
    pool[: len(lengths)] = x.initial_state
    return x, tensors, offsets, slots, pool


def cute_prefill(x, tensors: dict, pool: torch.Tensor, config: CuteConfig):
    """One call of the cute backend with `config` on inputs x (plan, bind, run)."""
    return run(cute_binding(x, tensors, pool, config))


def cute_binding(x, tensors: dict, pool: torch.Tensor, config: CuteConfig):
    """The cute backend planned with `config` for inputs x and bound to them."""
    capacity = 1 if tensors["checkpoint_offsets"].dim() == 1 \
        else tensors["checkpoint_offsets"].shape[1]
    caps = Caps(device=DEVICE, num_heads=x.q.shape[1], head_dim=x.q.shape[2],
                max_tokens=x.q.shape[0], max_seqs=len(x.lengths), max_state_slots=pool.shape[0],
                max_checkpoints=capacity, gate=x.gate, lower_bound=x.lower_bound,
                qk_l2norm=x.qk_l2norm, beta_sigmoid=x.beta_sigmoid, backend="cute")
    return bind(plan(caps, config=config), x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                **tensors, A_log=x.A_log, dt_bias=x.dt_bias)


def test_the_default_is_the_chunk_algorithm():
    assert CuteConfig().algorithm == "chunk"


@pytest.mark.parametrize(("case_id", "config"), [
    (case_id, config) for case_id in CASES for config in CONFIGS
    if key_split_divides(CONFIGS[config].key_split, CASES[case_id][2])])
def test_against_float64(case_id, config):
    x, tensors, offsets, slots, pool = prepared(case_id)
    assert_matches_recurrence(x, tensors, pool, offsets, slots, config)


def assert_matches_recurrence(x, tensors: dict, pool: torch.Tensor, offsets, slots,
                              config: str):
    """One call with `config`; its output, final states (pool[n:2n]) and the checkpoints of
    the active (offset, slot) pairs against the float64 recurrence."""
    result = cute_prefill(x, tensors, pool, CONFIGS[config])
    assert int(result.error_code) == 0, result.message()
    state_tol = CHUNK_STATE_TOL if CONFIGS[config].algorithm in TENSOR_CORE else STATE_TOL
    assert_outputs_match_recurrence(x, result.o, pool, offsets, slots, state_tol)


def assert_outputs_match_recurrence(x, out: torch.Tensor, pool: torch.Tensor, offsets, slots,
                                    state_tol: float):
    """A call's output, final states (pool[n:2n]) and the checkpoints of the active (offset,
    slot) pairs against the float64 recurrence."""
    active = [[o for o, s in zip(row, srow, strict=True) if s >= 0]
              for row, srow in zip(offsets, slots, strict=True)]
    ref = recurrent_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens.tolist(),
                        initial_state=x.initial_state, prefix_lengths=active, device=DEVICE,
                        **x.gate_kwargs())
    n = len(x.lengths)
    assert relative_error(ref.o, out) <= OUTPUT_TOL
    assert relative_error(ref.final_state, pool[n: 2 * n]) <= state_tol
    for m in range(n):
        live = [s for s in slots[m] if s >= 0]
        for c, slot in enumerate(live):
            assert relative_error(ref.prefix_states[m][c], pool[slot]) <= state_tol


@pytest.mark.parametrize("config", list(CONFIGS))
def test_checkpoints_at_chunk_edges(config):
    """Offsets on 16-token chunk boundaries, one token either side of one, and one token before
    a sequence's end (lengths 700, 1, 64, 333; the one-token sequence has none)."""
    x, tensors, _, _, pool = prepared("K128-H8-ragged-precomputed-C4")
    assert x.lengths == cute_chunk_edges.LENGTHS and pool.shape[0] == cute_chunk_edges.NUM_SLOTS
    offsets, slots = cute_chunk_edges.OFFSETS, cute_chunk_edges.SLOTS
    tensors["checkpoint_offsets"].copy_(torch.tensor(offsets))
    tensors["checkpoint_state_indices"].copy_(torch.tensor(slots))
    assert_matches_recurrence(x, tensors, pool, offsets, slots, config)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_fault_leaves_pool_untouched(config):
    x, tensors, _, _, pool = prepared("K128-H8-ragged-precomputed-C4")
    tensors["final_state_indices"][1] = tensors["final_state_indices"][0]  # one slot twice
    before = pool.clone()
    result = cute_prefill(x, tensors, pool, CONFIGS[config])
    assert int(result.error_code) & int(MetadataFault.DUPLICATE_WRITE_SLOT)
    assert torch.equal(pool, before)
    assert torch.isnan(result.o).all()


# The validator's clash check in tiles (kernels/cute/source.py), on write_slot_clashes' cases:
# 1,500 writes (six tiles of 256) matched against 1,800 entries (the writes, then the initial
# slots: two tiles of 1,024).


@pytest.mark.parametrize("clash", list(CLASHES))
def test_write_slot_clashes_across_tiles(clash):
    lengths = [6] * MANY_SEQS
    x = make_inputs(lengths, 1, 64, seed=3, device=DEVICE)
    tensors, offsets, _, num_slots = metadata(lengths, 4, torch.int32, seed=3)
    slots = {"initial": tensors["initial_state_indices"],
             "final": tensors["final_state_indices"],
             "checkpoint": tensors["checkpoint_state_indices"]}

    def at(kind: str, n: int, c: int) -> tuple:
        return (slots[kind], (n, c) if kind == "checkpoint" else n)

    fault = CLASHES[clash]
    if fault is None:
        slots["final"].copy_(slots["initial"])
    else:
        (dst, i), (src, j) = at(*fault[0]), at(*fault[1])
        dst[i] = src[j]
    expected = expected_error_code(tensors["cu_seqlens"].tolist(), MANY_SEQS,
                                   slots["initial"].tolist(), slots["final"].tolist(), offsets,
                                   slots["checkpoint"].tolist(), num_slots, x.q.shape[0])
    assert expected == (0 if fault is None else int(MetadataFault.DUPLICATE_WRITE_SLOT))
    pool = torch.full((num_slots, 1, 64, 64), SENTINEL, device=DEVICE)
    pool[:MANY_SEQS] = x.initial_state
    before = pool.clone()
    result = cute_prefill(x, tensors, pool, CuteConfig())
    assert int(result.error_code) == expected
    if fault is not None:
        assert torch.equal(pool, before)
        assert torch.isnan(result.o).all()


@pytest.mark.parametrize("config", list(CONFIGS))
def test_cuda_graph_replays_with_new_metadata(config):
    x, tensors, _, _, pool = prepared("K128-H8-ragged-precomputed-C4")
    caps = Caps(device=DEVICE, num_heads=8, head_dim=128, max_tokens=x.q.shape[0],
                max_seqs=4, max_state_slots=pool.shape[0], max_checkpoints=4, backend="cute")
    binding = bind(plan(caps, config=CONFIGS[config]), x.q, x.k, x.v, x.g, x.beta,
                   state_pool=pool, **tensors)
    start = pool.clone()
    run(binding)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        run(binding)
    cu = torch.tensor([0, 300, 700, 863, 1098], dtype=torch.int32, device=DEVICE)  # new split
    binding.cu_seqlens.copy_(cu)
    new_offsets = torch.tensor([[10, 20, 30, 299], [1, 2, 3, 399], [5, 6, 7, 8],
                                [100, 200, 210, 234]], dtype=torch.int32, device=DEVICE)
    binding.checkpoint_offsets.copy_(new_offsets)
    binding.checkpoint_state_indices.copy_(torch.arange(8, 24, device=DEVICE).reshape(4, 4))
    pool.copy_(start)
    graph.replay()
    torch.cuda.synchronize()
    assert int(binding.plan.error_code) == 0
    ref = recurrent_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=cu.tolist(),
                        initial_state=x.initial_state, prefix_lengths=new_offsets.tolist(),
                        device=DEVICE)
    assert relative_error(ref.o, binding.out) <= OUTPUT_TOL
    assert relative_error(ref.final_state, pool[4:8]) <= STATE_TOL
    for m in range(4):
        for c in range(4):
            slot = int(binding.checkpoint_state_indices[m, c])
            assert relative_error(ref.prefix_states[m][c], pool[slot]) <= STATE_TOL


# Ranges of the chunk algorithm: 1,064 tokens in 72 chunk slots, an empty sequence and a
# one-token one among them; 2, 3 and 7 ranges put edges inside the first, third and last
# sequences, around a checkpoint and on both sides of it.
RANGE_LENGTHS = [300, 0, 513, 1, 250]
RANGE_OFFSETS = [[16, 150, 176, 299], [1, 1, 1, 1], [1, 176, 177, 512], [1, 1, 1, 1],
                 [15, 32, 200, 249]]
RANGE_SLOTS = [[10 + 4 * m + c if RANGE_LENGTHS[m] > 1 else -1 for c in range(4)]
               for m in range(5)]


def range_case():
    """Inputs, metadata (initial slots 0-4, final 5-9) and a pool for the ranges tests."""
    n = len(RANGE_LENGTHS)
    x = make_inputs(RANGE_LENGTHS, 4, 128, gate="softplus", seed=5, device=DEVICE)
    i32 = {"dtype": torch.int32, "device": DEVICE}
    tensors = {"cu_seqlens": x.cu_seqlens.to(**i32),
               "initial_state_indices": torch.arange(n, **i32),
               "final_state_indices": torch.arange(n, 2 * n, **i32),
               "checkpoint_offsets": torch.tensor(RANGE_OFFSETS, **i32),
               "checkpoint_state_indices": torch.tensor(RANGE_SLOTS, **i32)}
    pool = torch.full((10 + 4 * n, 4, 128, 128), SENTINEL, device=DEVICE)
    pool[:n] = x.initial_state
    assert expected_error_code(x.cu_seqlens.tolist(), n, list(range(n)),
                               list(range(n, 2 * n)), RANGE_OFFSETS, RANGE_SLOTS,
                               pool.shape[0], x.q.shape[0]) == 0
    return x, tensors, pool


def force_ranges(monkeypatch, count: int) -> None:
    """The chunk algorithm cuts the next calls' chunk slots into `count` ranges."""
    monkeypatch.setattr(cute_launch, "range_count", lambda *_: count)


def ranged_call(x, tensors: dict, pool: torch.Tensor, captured: bool, config: str):
    """One call of CONFIGS[config]; captured: eager once, then a CUDA graph of it replayed on
    the pool as it was."""
    binding = cute_binding(x, tensors, pool, CONFIGS[config])
    start = pool.clone()
    result = run(binding)
    if captured:
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            run(binding)
        pool.copy_(start)
        binding.out.zero_()
        graph.replay()
    torch.cuda.synchronize()
    assert int(binding.plan.error_code) == 0, result.message()
    return binding.out.clone()


@pytest.mark.parametrize("config", ["chunk-s4", "wgmma"])
@pytest.mark.parametrize("captured", [False, True])
@pytest.mark.parametrize("ranges", [2, 3, 7])
def test_chunk_ranges_equal_one_range_bit_for_bit(ranges, captured, config, monkeypatch):
    """Cut into ranges (each range's pass on the side stream, the state carried across each
    edge), the chunk algorithm's output, final states and checkpoints equal one range's bit
    for bit, eager and replayed, and match the float64 recurrence."""
    x, tensors, pool = range_case()
    outputs, pools = {}, {}
    for count in (1, ranges):
        force_ranges(monkeypatch, count)
        pools[count] = pool.clone()
        outputs[count] = ranged_call(x, tensors, pools[count], captured, config)
    assert torch.equal(outputs[1], outputs[ranges])
    assert torch.equal(pools[1], pools[ranges])
    assert_outputs_match_recurrence(x, outputs[ranges], pools[ranges], RANGE_OFFSETS,
                                    RANGE_SLOTS, CHUNK_STATE_TOL)


@pytest.mark.parametrize("config", ["chunk-s4", "wgmma"])
def test_chunk_ranges_fault_leaves_pool_untouched(config, monkeypatch):
    """A fault under three ranges: the error reported, the output NaN, the pool unchanged."""
    force_ranges(monkeypatch, 3)
    x, tensors, pool = range_case()
    tensors["final_state_indices"][1] = tensors["final_state_indices"][0]  # one slot twice
    before = pool.clone()
    result = cute_prefill(x, tensors, pool, CONFIGS[config])
    assert int(result.error_code) & int(MetadataFault.DUPLICATE_WRITE_SLOT)
    assert torch.equal(pool, before)
    assert torch.isnan(result.o).all()


def test_agrees_with_the_triton_backend():
    x, tensors, _, _, pool = prepared("K64-H4-sigmoid-fused-C2-i64")
    pools = {}
    outputs = {}
    for backend in ("triton", "cute"):
        pools[backend] = pool.clone()
        outputs[backend] = kda_prefill(x.q, x.k, x.v, x.g, x.beta, state_pool=pools[backend],
                                       backend=backend, **tensors, **x.gate_kwargs()).o
    assert relative_error(outputs["triton"], outputs["cute"]) <= 2 * OUTPUT_TOL
    assert relative_error(pools["triton"], pools["cute"]) <= 2 * STATE_TOL
