"""The float32 chunk mirror against the float64 recurrence: outputs, final states, checkpoints."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from kdabench.inputs import EDGE_LENGTHS, lengths_with_edges, make_inputs
from kdabench.oracles import (
    assert_close,
    chunk_kda_mirror,
    chunk_mirror,
    recurrent_kda,
    relative_error,
)

# fp32 mirror vs float64 recurrence on the same bf16 inputs measures ~1e-7; a wrong formula
# (a mask off by one, a missing decay, no intra-chunk solve) gives 1e-2 or more.
TOL = 2e-5

FIXED_LAYOUTS = [
    [1, 15, 16, 17],
    [63, 64, 65],
    [200],
    list(EDGE_LENGTHS),
    [1],
    [16],
    [17, 0, 5],
    [32, 48, 1],
]


def mirror_cases() -> list[pytest.param]:
    """Layouts (fixed edge cases, then seeded random ones) crossed with every input mode in turn."""
    rng = random.Random(20240611)
    layouts = FIXED_LAYOUTS + [lengths_with_edges(rng, rng.randint(1, 4), 200) for _ in range(16)]
    modes = itertools.cycle(
        itertools.product(("precomputed", "sigmoid", "softplus"), (False, True), (False, True))
    )
    cases = []
    for i, (lengths, (gate, l2, bsig)) in enumerate(zip(layouts, modes)):
        num_heads, head_dim = (1 + i % 3, 32 if i % 4 == 3 else 64)
        offsets = [
            sorted(rng.sample(range(1, n), min(rng.randint(1, 4), n - 1))) if n > 1 else []
            for n in lengths
        ]
        case_id = "-".join(
            [
                "L" + "-".join(map(str, lengths)),
                f"H{num_heads}",
                f"K{head_dim}",
                gate,
                *(["l2"] if l2 else []),
                *(["bsig"] if bsig else []),
            ]
        )
        cases.append(
            pytest.param(lengths, num_heads, head_dim, gate, l2, bsig, offsets, i, id=case_id)
        )
    return cases


def run_both(x, offsets, **mirror_options):
    """(recurrent_kda, chunk_kda_mirror) results on inputs x with checkpoints at offsets."""
    common = dict(cu_seqlens=x.cu_seqlens, initial_state=x.initial_state, **x.gate_kwargs())
    ref = recurrent_kda(x.q, x.k, x.v, x.g, x.beta, prefix_lengths=offsets, **common)
    out = chunk_kda_mirror(
        x.q, x.k, x.v, x.g, x.beta, checkpoint_offsets=offsets, **common, **mirror_options
    )
    return ref, out


def assert_mirror_matches(ref, out, tol: float = TOL) -> None:
    assert_close("o", ref.o, out.o, tol)
    assert_close("final_state", ref.final_state, out.final_state, tol)
    for n, (expected, got) in enumerate(zip(ref.prefix_states, out.checkpoint_states)):
        assert got.shape == expected.shape
        if expected.numel():
            assert_close(f"checkpoints of sequence {n}", expected, got, tol)


@pytest.mark.parametrize(
    "lengths, num_heads, head_dim, gate, l2, bsig, offsets, seed", mirror_cases()
)
def test_mirror_matches_recurrence(lengths, num_heads, head_dim, gate, l2, bsig, offsets, seed):
    x = make_inputs(
        lengths, num_heads, head_dim, gate=gate, qk_l2norm=l2, beta_sigmoid=bsig, seed=seed
    )
    ref, out = run_both(x, offsets)
    assert out.o.dtype == torch.float32 and out.final_state.dtype == torch.float32
    assert out.final_state.shape == (len(lengths), num_heads, head_dim, head_dim)
    assert_mirror_matches(ref, out)


@pytest.mark.parametrize("chunk_size", [1, 4, 8, 16], ids=lambda c: f"C{c}")
def test_other_chunk_sizes(chunk_size):
    x = make_inputs([1, 15, 16, 17, 40], 2, 32, seed=31)
    ref, out = run_both(x, [[], [7], [8, 16], [16, 1], [33]], chunk_size=chunk_size)
    assert_mirror_matches(ref, out)


def test_checkpoints_at_start_end_and_chunk_edges():
    """Offsets 0 (the initial state) and len (the final state), repeated, out of order."""
    x = make_inputs([33, 16, 5], 2, 32, seed=37)
    offsets = [[33, 0, 16, 32], [16, 16], [0, 5]]
    ref, out = run_both(x, offsets)
    assert_mirror_matches(ref, out)
    assert torch.equal(out.checkpoint_states[0][1], x.initial_state[0])
    assert torch.equal(out.checkpoint_states[2][0], x.initial_state[2])
    assert torch.equal(out.checkpoint_states[1][0], out.final_state[1])  # aligned: same ops


def test_no_initial_state_and_zero_length():
    x = make_inputs([0, 20, 0], 1, 32, with_initial_state=False, seed=41)
    ref, out = run_both(x, None)
    assert_mirror_matches(ref, out)
    assert not out.final_state[0].any() and not out.final_state[2].any()
    assert [c.shape[0] for c in out.checkpoint_states] == [0, 0, 0]


def test_unit_lower_inverse():
    m = torch.randn(3, 16, 16, generator=torch.Generator().manual_seed(0)).tril(-1) * 0.3
    inverse = chunk_mirror.unit_lower_inverse(m)
    eye = torch.eye(16).expand(3, 16, 16)
    assert_close("(I + M) @ inverse", eye, (eye + m) @ inverse, 1e-5)


# ---- the comparison can fail ------------------------------------------------------------


def test_a_changed_beta_is_caught():
    x = make_inputs([40, 17], 2, 32, seed=43)
    offsets = [[20], [9]]
    ref, _ = run_both(x, offsets)
    x.beta[5, 0] += 0.05  # sequence 0, before its checkpoint
    _, out = run_both(x, offsets)
    assert relative_error(ref.o, out.o) > 100 * TOL
    assert relative_error(ref.final_state, out.final_state) > 100 * TOL
    assert relative_error(ref.prefix_states[0], out.checkpoint_states[0]) > 100 * TOL


def test_checkpoint_one_token_off_is_caught():
    x = make_inputs([40], 2, 32, seed=47)
    ref = recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.initial_state,
                        prefix_lengths=[[16, 21]])  # fmt: skip
    out = chunk_kda_mirror(x.q, x.k, x.v, x.g, x.beta, initial_state=x.initial_state,
                           checkpoint_offsets=[[17, 20]])  # fmt: skip
    for i in range(2):
        assert relative_error(ref.prefix_states[0][i], out.checkpoint_states[0][i]) > 100 * TOL


def _first_order_inverse(m: torch.Tensor) -> torch.Tensor:
    return torch.eye(m.shape[-1]) - m


def _dropped_chunk_decay(s0, chunk, p):
    g_p = chunk.G[:, p - 1 : p, :]
    k_decayed = chunk.k[:, :p] * torch.exp(g_p - chunk.G[:, :p])
    return s0 + k_decayed.transpose(-1, -2) @ chunk.delta[:, :p]


@pytest.mark.parametrize(
    "name, replacement",
    [("unit_lower_inverse", _first_order_inverse), ("_state_after", _dropped_chunk_decay)],
    ids=["first-order-solve", "no-state-decay"],
)
def test_a_wrong_formula_is_caught(monkeypatch, name, replacement):
    x = make_inputs([40, 17], 2, 32, seed=53)
    monkeypatch.setattr(chunk_mirror, name, replacement)
    ref, out = run_both(x, [[20], [9]])
    with pytest.raises(AssertionError, match="relative error"):
        assert_mirror_matches(ref, out)
