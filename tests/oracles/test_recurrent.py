"""recurrent_kda against a plainer loop; the gate transforms; the comparison helper."""

from __future__ import annotations

import math

import pytest
import torch

from kdabench.inputs import make_inputs
from kdabench.oracles import (
    assert_close,
    l2_normalize,
    log_decay,
    recurrent_kda,
    relative_error,
)

TOL = 1e-12  # float64 against float64: only summation order differs


def naive_kda(q, k, v, g, beta, cu_seqlens, initial_state, scale):
    """Per sequence, per head, per token: S = (I - b k k^T) Diag(exp(g)) S + b k v^T, S as [K, V].

    Inputs already transformed (g is the log decay, beta a probability). Returns o [T, H, V]
    and final states [N, H, V, K], float64.
    """
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    num_heads, head_dim, value_dim = q.shape[1], q.shape[2], v.shape[2]
    o = torch.zeros(q.shape[0], num_heads, value_dim, dtype=torch.float64)
    offsets = [int(x) for x in cu_seqlens]
    finals = torch.zeros(len(offsets) - 1, num_heads, value_dim, head_dim, dtype=torch.float64)
    eye = torch.eye(head_dim, dtype=torch.float64)
    for n in range(len(offsets) - 1):
        for h in range(num_heads):
            state = initial_state[n, h].double().T.clone()
            for t in range(offsets[n], offsets[n + 1]):
                kt, b = k[t, h][:, None], beta[t, h]
                state = (eye - b * kt @ kt.T) @ torch.diag(torch.exp(g[t, h])) @ state
                state = state + b * kt @ v[t, h][None, :]
                o[t, h] = scale * state.T @ q[t, h]
            finals[n, h] = state.T
    return o, finals


def run_both(x, **options):
    """recurrent_kda and naive_kda on precomputed-gate inputs x."""
    ref_o, ref_state = naive_kda(
        x.q, x.k, x.v, x.g, x.beta, x.cu_seqlens, x.initial_state, x.q.shape[-1] ** -0.5
    )
    out = recurrent_kda(
        x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens, initial_state=x.initial_state,
        **options,
    )  # fmt: skip
    return ref_o, ref_state, out


@pytest.mark.parametrize(
    "lengths, num_heads, head_dim",
    [([5], 1, 4), ([1, 7, 3], 2, 8), ([16, 17], 3, 6), ([9, 0, 4], 2, 5)],
    ids=["L5-H1-K4", "L1-7-3-H2-K8", "L16-17-H3-K6", "L9-0-4-H2-K5"],
)
def test_recurrent_matches_naive_loop(lengths, num_heads, head_dim):
    x = make_inputs(lengths, num_heads, head_dim, seed=3)
    ref_o, ref_state, out = run_both(x)
    assert out.o.dtype == torch.float64 and out.final_state.dtype == torch.float64
    assert out.final_state.shape == (len(lengths), num_heads, head_dim, head_dim)
    assert_close("o", ref_o, out.o, TOL)
    assert_close("final_state", ref_state, out.final_state, TOL)


def test_rectangular_state_v_first():
    """K != V: the returned state is [N, H, V, K] and agrees with the naive [K, V] state, transposed."""
    x = make_inputs([6, 3], 2, 4, seed=5)
    v = torch.randn(9, 2, 7, generator=torch.Generator().manual_seed(0))
    h0 = torch.randn(2, 2, 7, 4, generator=torch.Generator().manual_seed(1))
    ref_o, ref_state = naive_kda(x.q, x.k, v, x.g, x.beta, x.cu_seqlens, h0, 0.3)
    out = recurrent_kda(
        x.q, x.k, v, x.g, x.beta, cu_seqlens=x.cu_seqlens, initial_state=h0, scale=0.3
    )
    assert out.final_state.shape == (2, 2, 7, 4)
    assert_close("o", ref_o, out.o, TOL)
    assert_close("final_state", ref_state, out.final_state, TOL)


def test_transforms_match_hand_applied_ones():
    """qk_l2norm, beta_sigmoid and a fused gate equal applying them by hand first."""
    x = make_inputs([4, 11], 2, 8, gate="softplus", qk_l2norm=True, beta_sigmoid=True, seed=7)
    q, k = (
        t.double() / torch.sqrt((t.double() ** 2).sum(-1, keepdim=True) + 1e-6) for t in (x.q, x.k)
    )
    g = log_decay(x.g, "softplus", A_log=x.A_log, dt_bias=x.dt_bias)
    ref_o, ref_state = naive_kda(
        q, k, x.v, g, torch.sigmoid(x.beta.double()), x.cu_seqlens, x.initial_state, 8**-0.5
    )
    out = recurrent_kda(
        x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens, initial_state=x.initial_state,
        **x.gate_kwargs(),
    )  # fmt: skip
    assert_close("o", ref_o, out.o, TOL)
    assert_close("final_state", ref_state, out.final_state, TOL)


def test_zero_length_sequence_keeps_initial_state():
    x = make_inputs([3, 0, 2, 0], 2, 4, seed=11)
    out = recurrent_kda(
        x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens, initial_state=x.initial_state
    )
    assert torch.equal(out.final_state[1], x.initial_state[1].double())
    assert torch.equal(out.final_state[3], x.initial_state[3].double())
    assert not torch.equal(out.final_state[0], x.initial_state[0].double())


def test_initial_state_is_used_and_none_means_zeros():
    x = make_inputs([12], 2, 8, seed=13)
    zeros = torch.zeros_like(x.initial_state)
    with_none = recurrent_kda(x.q, x.k, x.v, x.g, x.beta)
    with_zeros = recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=zeros)
    with_state = recurrent_kda(x.q, x.k, x.v, x.g, x.beta, initial_state=x.initial_state)
    assert torch.equal(with_none.o, with_zeros.o)
    assert relative_error(with_state.o, with_none.o) > 1e-2


def test_prefix_states_at_zero_and_full_length():
    x = make_inputs([5, 9], 2, 4, seed=17)
    out = recurrent_kda(
        x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens, initial_state=x.initial_state,
        prefix_lengths=[[0, 5], [9, 0, 4]],
    )  # fmt: skip
    assert [p.shape[0] for p in out.prefix_states] == [2, 3]
    assert torch.equal(out.prefix_states[0][0], x.initial_state[0].double())
    assert torch.equal(out.prefix_states[0][1], out.final_state[0])
    assert torch.equal(out.prefix_states[1][0], out.final_state[1])
    assert torch.equal(out.prefix_states[1][1], x.initial_state[1].double())
    shorter = recurrent_kda(
        x.q[5:9], x.k[5:9], x.v[5:9], x.g[5:9], x.beta[5:9], initial_state=x.initial_state[1:]
    )
    assert_close("prefix 4 of sequence 1", shorter.final_state[0], out.prefix_states[1][2], TOL)


def test_no_prefix_lengths_gives_empty_lists():
    x = make_inputs([3, 2], 1, 4, seed=19)
    out = recurrent_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens)
    assert [p.shape for p in out.prefix_states] == [(0, 1, 4, 4), (0, 1, 4, 4)]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prefix_lengths": [[6]]}, "outside 0..5"),
        ({"prefix_lengths": [[1], [2]]}, "one list per sequence"),
        ({"cu_seqlens": [0, 3]}, "cu_seqlens must run from 0"),
        ({"cu_seqlens": [0, 4, 2, 5]}, "non-decreasing"),
        ({"initial_state": torch.zeros(1, 1, 4, 3)}, "initial_state must be"),
    ],
    ids=["prefix-past-end", "prefix-list-count", "cu-short", "cu-decreasing", "state-shape"],
)
def test_bad_arguments_are_refused(kwargs, message):
    x = make_inputs([5], 1, 4, seed=23)
    with pytest.raises(ValueError, match=message):
        recurrent_kda(x.q, x.k, x.v, x.g, x.beta, **kwargs)


def test_a_changed_beta_is_caught():
    """The comparison can fail: one beta nudged by 0.05 moves o and the state far beyond TOL."""
    x = make_inputs([7, 9], 2, 8, seed=29)
    ref_o, ref_state, _ = run_both(x)
    x.beta[10, 1] += 0.05
    _, _, out = run_both(x)
    assert relative_error(ref_o, out.o) > 1e3 * TOL
    assert relative_error(ref_state, out.final_state) > 1e3 * TOL


# ---- gates -------------------------------------------------------------------------------

A_LOG = torch.tensor([0.0, math.log(2.0)])
DT_BIAS = torch.tensor([[0.5, -1.0], [0.0, 2.0]])
RAW = torch.tensor([[[-0.5, 1.0], [-1.0, 10.0]]])  # [T=1, H=2, K=2]


def hand_gate(gate: str, lower_bound: float) -> list[float]:
    """The gate formulas written out with scalar math, for RAW / A_LOG / DT_BIAS."""
    values = []
    for h in range(2):
        rate = math.exp(A_LOG[h].item())
        for kk in range(2):
            x = RAW[0, h, kk].item() + DT_BIAS[h, kk].item()
            if gate == "sigmoid":
                values.append(lower_bound / (1.0 + math.exp(-rate * x)))
            else:
                values.append(max(-rate * math.log1p(math.exp(x)), lower_bound))
    return values


@pytest.mark.parametrize("gate", ["sigmoid", "softplus"])
@pytest.mark.parametrize("lower_bound", [-5.0, -2.0])
def test_fused_gates_match_hand_values(gate, lower_bound):
    out = log_decay(RAW, gate, lower_bound=lower_bound, A_log=A_LOG, dt_bias=DT_BIAS)
    assert out.dtype == torch.float64 and out.shape == (1, 2, 2)
    assert out.flatten().tolist() == pytest.approx(hand_gate(gate, lower_bound), rel=1e-14)
    flat = log_decay(RAW, gate, lower_bound=lower_bound, A_log=A_LOG, dt_bias=DT_BIAS.flatten())
    assert torch.equal(out, flat)


def test_gate_literal_values():
    """A few values worked out on paper: raw + dt_bias = 0 gives lb/2 and -log 2 * exp(A_log)."""
    out_sigmoid = log_decay(RAW, "sigmoid", A_log=A_LOG, dt_bias=DT_BIAS)
    out_softplus = log_decay(RAW, "softplus", A_log=A_LOG, dt_bias=DT_BIAS)
    assert out_sigmoid[0, 0, 0].item() == pytest.approx(-2.5, rel=1e-15)  # -0.5 + 0.5 = 0
    assert out_softplus[0, 0, 0].item() == pytest.approx(-math.log(2.0), rel=1e-15)
    # head 1, channel 1: 2 * softplus(12) ~ 24 > 5, so the clamp holds it at the lower bound
    assert out_softplus[0, 1, 1].item() == -5.0
    assert out_sigmoid[0, 1, 1].item() == pytest.approx(-5.0 / (1 + math.exp(-24.0)), rel=1e-15)


def test_precomputed_gate_passes_through():
    g = torch.tensor([[[-7.0, -0.25]]])
    assert log_decay(g, "precomputed").tolist() == [[[-7.0, -0.25]]]


@pytest.mark.parametrize(
    "gate, kwargs, message",
    [
        ("tanh", {}, "unknown gate 'tanh'"),
        ("sigmoid", {"dt_bias": DT_BIAS}, r"missing \['A_log'\]"),
        ("softplus", {"A_log": A_LOG}, r"missing \['dt_bias'\]"),
        ("sigmoid", {"A_log": A_LOG[:1], "dt_bias": DT_BIAS}, "A_log must be"),
        ("softplus", {"A_log": A_LOG, "dt_bias": DT_BIAS[:1]}, "dt_bias must be"),
    ],
    ids=["unknown", "no-A_log", "no-dt_bias", "A_log-shape", "dt_bias-shape"],
)
def test_gate_errors(gate, kwargs, message):
    with pytest.raises(ValueError, match=message):
        log_decay(RAW, gate, **kwargs)


def test_l2_normalize():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float64)
    out = l2_normalize(x)
    assert out[0].tolist() == pytest.approx(
        [3 / math.sqrt(25 + 1e-6), 4 / math.sqrt(25 + 1e-6)], rel=1e-15
    )
    assert out[1].tolist() == [0.0, 0.0]


# ---- metrics -----------------------------------------------------------------------------


def test_relative_error_cases():
    ref = torch.tensor([3.0, 4.0])
    assert relative_error(ref, torch.tensor([3.0, 4.5])) == pytest.approx(0.1)
    assert relative_error(ref, torch.tensor([float("nan"), 4.0])) == float("inf")
    assert relative_error(ref, torch.tensor([float("inf"), 4.0])) == float("inf")
    assert relative_error(torch.zeros(2), torch.tensor([0.0, 2.0])) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="shape mismatch"):
        relative_error(ref, torch.zeros(3))


def test_assert_close_names_the_tensor_and_error():
    ref = torch.tensor([3.0, 4.0])
    assert assert_close("o", ref, ref, 0.0) == 0.0
    with pytest.raises(AssertionError, match=r"final_state: relative error 1\.000e-01 exceeds"):
        assert_close("final_state", ref, torch.tensor([3.0, 4.5]), 1e-2)
