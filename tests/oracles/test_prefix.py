"""The prefix-state oracle: a prefix's own run ends in the state the long run passes through."""

from __future__ import annotations

import pytest
import torch

from kdabench.inputs import make_inputs
from kdabench.oracles import (
    assert_close,
    chunk_kda_mirror,
    expected_prefix_states,
    prefix_batch,
    recurrent_kda,
    relative_error,
)

TOL = 1e-12  # float64 both ways; the same operations up to summation order


def test_prefix_batch_layout():
    batch = prefix_batch(torch.tensor([0, 5, 5, 9], dtype=torch.int32), [[2, 5], [], [0, 3]])
    assert batch.token_index.tolist() == [0, 1, 0, 1, 2, 3, 4, 5, 6, 7]
    assert batch.cu_seqlens.tolist() == [0, 2, 7, 7, 10]
    assert batch.cu_seqlens.dtype == torch.int32
    assert batch.owners == [(0, 2), (0, 5), (2, 0), (2, 3)]
    assert batch.sequence_index.tolist() == [0, 0, 2, 2]


def test_prefix_batch_refuses_offsets_past_the_end():
    with pytest.raises(ValueError, match="outside 0..4"):
        prefix_batch([0, 4], [[5]])


@pytest.mark.parametrize(
    "lengths, offsets, gate, l2",
    [
        ([40], [[1, 16, 17, 39]], "precomputed", False),
        ([1, 15, 16, 17], [[1], [0, 7], [15, 16], [16, 17]], "sigmoid", True),
        ([63, 0, 65], [[1, 32, 62, 63], [0], [64, 65]], "softplus", False),
    ],
    ids=["L40-precomputed", "L1-15-16-17-sigmoid-l2", "L63-0-65-softplus"],
)
def test_prefix_runs_equal_recurrent_prefix_states(lengths, offsets, gate, l2):
    x = make_inputs(lengths, 2, 16, gate=gate, qk_l2norm=l2, beta_sigmoid=l2, seed=59)
    common = dict(cu_seqlens=x.cu_seqlens, initial_state=x.initial_state, **x.gate_kwargs())
    ref = recurrent_kda(x.q, x.k, x.v, x.g, x.beta, prefix_lengths=offsets, **common)
    got = expected_prefix_states(x.q, x.k, x.v, x.g, x.beta, prefix_lengths=offsets, **common)
    assert [t.shape for t in got] == [t.shape for t in ref.prefix_states]
    for n, (expected, states) in enumerate(zip(ref.prefix_states, got)):
        assert_close(f"prefix states of sequence {n}", expected, states, TOL)


def test_no_prefix_at_all():
    x = make_inputs([4, 3], 1, 8, seed=61)
    got = expected_prefix_states(x.q, x.k, x.v, x.g, x.beta, prefix_lengths=[[], []],
                                 cu_seqlens=x.cu_seqlens)  # fmt: skip
    assert [t.shape for t in got] == [(0, 1, 8, 8), (0, 1, 8, 8)]


def test_mirror_checkpoints_equal_mirror_prefix_runs():
    """Implementation against itself: bitwise on chunk boundaries, fp32-close elsewhere."""
    x = make_inputs([48, 40], 2, 32, seed=67)
    offsets = [[16, 32, 48, 7], [16, 23]]
    out = chunk_kda_mirror(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens,
                           initial_state=x.initial_state, checkpoint_offsets=offsets)  # fmt: skip
    batch = prefix_batch(x.cu_seqlens, offsets)
    idx = batch.token_index
    prefix_run = chunk_kda_mirror(
        x.q[idx], x.k[idx], x.v[idx], x.g[idx], x.beta[idx],
        cu_seqlens=batch.cu_seqlens, initial_state=x.initial_state[batch.sequence_index],
    )  # fmt: skip
    checkpoints = torch.cat(out.checkpoint_states)
    for i, (n, offset) in enumerate(batch.owners):
        if offset % 16 == 0:
            assert torch.equal(checkpoints[i], prefix_run.final_state[i]), (n, offset)
        else:
            assert_close(
                f"sequence {n} offset {offset}", prefix_run.final_state[i], checkpoints[i], 1e-6
            )


def test_prefix_state_depends_on_the_prefix_only():
    """The comparison can fail: a token inside the prefix moves the state, one after it does not."""
    x = make_inputs([30], 2, 16, seed=71)
    before = expected_prefix_states(x.q, x.k, x.v, x.g, x.beta, prefix_lengths=[[20]])[0]
    x.beta[25, 0] += 0.05
    after_late = expected_prefix_states(x.q, x.k, x.v, x.g, x.beta, prefix_lengths=[[20]])[0]
    assert torch.equal(before, after_late)
    x.beta[12, 0] += 0.05
    after_early = expected_prefix_states(x.q, x.k, x.v, x.g, x.beta, prefix_lengths=[[20]])[0]
    assert relative_error(before, after_early) > 1e6 * TOL
