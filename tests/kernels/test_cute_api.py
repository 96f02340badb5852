"""The cute backend behind kdabench.kernels on a machine without a GPU: clear refusals, and
its fixed config resolved by the policy (the GPU behaviour: test_prefill_cute_gpu.py)."""

from __future__ import annotations

import cute_chunk_edges
import pytest
import torch

from kdabench.kernels import Caps, KdaConfigError, kda_prefill, plan, resolve_config
from kdabench.kernels.config import CuteConfig
from kdabench.kernels.cute import launch as cute_launch
from kdabench.oracles.metadata import expected_error_code

CUTE_ON_CPU = Caps(device="cpu", num_heads=2, head_dim=64, max_tokens=16, max_seqs=1,
                   max_state_slots=4, backend="cute")


def test_plan_on_cpu_says_cuda_only():
    with pytest.raises(KdaConfigError, match="cute backend runs on CUDA devices only"):
        plan(CUTE_ON_CPU)


def test_functional_call_on_cpu_is_refused_before_any_write():
    q = torch.zeros(16, 2, 64, dtype=torch.bfloat16)
    pool = torch.full((4, 2, 64, 64), 0.5)
    with pytest.raises(KdaConfigError, match="CUDA devices only"):
        kda_prefill(q, q, q, torch.zeros(16, 2, 64), torch.zeros(16, 2), state_pool=pool,
                    cu_seqlens=torch.tensor([0, 16], dtype=torch.int32),
                    initial_state_indices=torch.tensor([0], dtype=torch.int32),
                    final_state_indices=torch.tensor([1], dtype=torch.int32), backend="cute")
    assert torch.equal(pool, torch.full((4, 2, 64, 64), 0.5))


def test_policy_resolves_the_fixed_cute_config_whatever_the_mode():
    for mode in ("AUTO", "HEURISTIC_ONLY", "PREPLANNED_ONLY"):
        resolved = resolve_config(CUTE_ON_CPU, mode=mode)
        assert resolved.config == CuteConfig()
        assert resolved.source.startswith("cute backend")


def test_an_unknown_cute_algorithm_is_named():
    from kdabench.kernels.cute.launch import config_problems

    assert config_problems(CuteConfig(), 128) == []
    assert config_problems(CuteConfig(algorithm="recurrence"), 64) == []
    assert config_problems(CuteConfig(algorithm="wgmma"), 64) == []
    (problem,) = config_problems(CuteConfig(algorithm="tcgen05"), 128)
    assert "algorithm 'tcgen05' must be one of ('chunk', 'recurrence', 'wgmma')" in problem


def test_an_unknown_key_split_is_named():
    from kdabench.kernels.cute.launch import config_problems
    from kdabench.kernels.cute.variants import key_split_divides

    assert [config_problems(CuteConfig(key_split=s), 128) for s in (1, 2, 4, 8)] == [[]] * 4
    (problem,) = config_problems(CuteConfig(key_split=3), 128)
    assert "key_split 3 must be one of (1, 2, 4, 8)" in problem
    (problem,) = config_problems(CuteConfig(key_split=8), 64)
    assert "key_split 8 does not divide the 4 key steps of 16 at head_dim 64" in problem
    assert [key_split_divides(8, 64), key_split_divides(8, 128)] == [False, True]


@pytest.mark.parametrize("lengths", [[1], [16], [17], [15, 1, 0, 33], [16] * 9, [0, 0, 1]])
def test_chunk_workspaces_hold_every_chunk_of_any_batch(lengths):
    """chunk_slots bounds sum(ceil(len / 16)) for the batch's token and sequence counts; the
    chunk workspaces hold that many (chunk, head) units."""
    from kdabench.kernels.cute.launch import CHUNK, allocate_workspaces, chunk_slots

    chunks = sum(-(-length // CHUNK) for length in lengths)
    assert chunk_slots(sum(lengths), len(lengths)) >= chunks
    caps = Caps(device="cpu", num_heads=3, head_dim=64, max_tokens=max(sum(lengths), 1),
                max_seqs=len(lengths), max_state_slots=1, backend="cute")
    ws = allocate_workspaces(caps, CuteConfig(), torch.device("cpu"))
    units = chunk_slots(caps.max_tokens, caps.max_seqs) * 3
    assert ws["chunk_U"].numel() == ws["chunk_W"].numel() == units * CHUNK * 64
    assert ws["chunk_index"].numel() == len(lengths) + 1
    # each interior checkpoint's key records: one [16, K] unit per (sequence, checkpoint, head)
    assert ws["checkpoint_K"].numel() == len(lengths) * caps.max_checkpoints * 3 * CHUNK * 64
    assert "wq" not in ws  # the chunk preparation reads the raw inputs
    recurrence = allocate_workspaces(caps, CuteConfig(algorithm="recurrence"),
                                     torch.device("cpu"))
    assert "chunk_W" not in recurrence and "wq" in recurrence


def test_chunk_edge_metadata_is_accepted():
    """The chunk-edge GPU test's hand-written metadata passes validation (error code 0), so that
    test checks checkpoints, not the validator."""
    lengths = cute_chunk_edges.LENGTHS
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    n = len(lengths)
    code = expected_error_code(cu, n, list(range(n)), list(range(n, 2 * n)),
                               cute_chunk_edges.OFFSETS, cute_chunk_edges.SLOTS,
                               cute_chunk_edges.NUM_SLOTS, cu[-1])
    assert code == 0


def test_chunk_ranges_follow_the_measured_policy():
    """Two ranges only under capture with one long sequence per slot (kernels/NOTES.md, cute
    v7): 8192 tokens in one sequence, not four of 2048, nor 64 of 512, nor eager."""
    assert cute_launch.range_count(cute_launch.chunk_slots(8192, 1), 1, True) == 2
    assert cute_launch.range_count(cute_launch.chunk_slots(65536, 1), 1, True) == 2
    assert cute_launch.range_count(cute_launch.chunk_slots(8192, 4), 4, True) == 1
    assert cute_launch.range_count(cute_launch.chunk_slots(32768, 64), 64, True) == 1
    assert cute_launch.range_count(cute_launch.chunk_slots(65536, 1), 1, False) == 1
