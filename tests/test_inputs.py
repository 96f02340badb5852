"""The seeded input generator: shapes, dtypes, ranges, reproducibility."""

from __future__ import annotations

import random

import pytest
import torch

from kdabench.inputs import EDGE_LENGTHS, lengths_with_edges, make_inputs
from kdabench.oracles import log_decay


def test_shapes_and_dtypes():
    x = make_inputs([3, 0, 5], 2, 16)
    assert x.q.shape == x.k.shape == x.v.shape == x.g.shape == (8, 2, 16)
    assert (x.q.dtype, x.k.dtype, x.v.dtype) == (torch.bfloat16,) * 3
    assert x.g.dtype == x.beta.dtype == x.initial_state.dtype == torch.float32
    assert x.beta.shape == (8, 2)
    assert x.cu_seqlens.dtype == torch.int32 and x.cu_seqlens.tolist() == [0, 3, 3, 8]
    assert x.lengths == [3, 0, 5]
    assert x.initial_state.shape == (3, 2, 16, 16)
    assert x.A_log is None and x.dt_bias is None


def test_same_seed_same_numbers_other_seed_other_numbers():
    a, b, c = (make_inputs([7, 9], 2, 8, gate="sigmoid", seed=s) for s in (5, 5, 6))
    for name in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert not torch.equal(getattr(a, name), getattr(c, name)), name


def test_precomputed_ranges():
    x = make_inputs([200, 64], 4, 64, lower_bound=-5.0, seed=1)
    assert x.g.min() >= -5.0 and x.g.max() < 0
    assert (x.g == -5.0).any(), "some channels should reach the bound"
    assert (x.g > -0.05).float().mean() > 0.2, "a share of slow channels should keep memory"
    assert (x.beta > 0).all() and (x.beta < 1).all()
    norms = torch.linalg.vector_norm(x.k.float(), dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-2)
    assert 0.5 < torch.linalg.vector_norm(x.q.float(), dim=-1).mean() < 1.5
    for t in (x.q, x.k, x.v, x.initial_state):
        assert (t != 0).any()


@pytest.mark.parametrize("gate", ["sigmoid", "softplus"])
def test_fused_modes(gate):
    x = make_inputs([50], 2, 32, gate=gate, qk_l2norm=True, beta_sigmoid=True, seed=2)
    assert x.A_log.shape == (2,) and x.dt_bias.shape == (2, 32)
    assert (x.beta < 0).any() and (x.beta > 1).any(), "beta_sigmoid: logits"
    assert torch.linalg.vector_norm(x.k.float(), dim=-1).mean() > 2, "qk_l2norm: raw k"
    g = log_decay(x.g, gate, lower_bound=x.lower_bound, A_log=x.A_log, dt_bias=x.dt_bias)
    assert g.min() >= -5.0 and g.max() < 0
    assert g.max() > -0.05 and g.min() < -3.0, "fused gates span slow and fast channels"
    assert x.gate_kwargs()["gate"] == gate


def test_no_initial_state():
    assert make_inputs([4], 1, 8, with_initial_state=False).initial_state is None


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown gate"):
        make_inputs([4], 1, 8, gate="relu")
    with pytest.raises(ValueError, match="lengths"):
        make_inputs([], 1, 8)


def test_lengths_with_edges():
    rng = random.Random(0)
    mixed = lengths_with_edges(rng, 200, 100)
    assert set(mixed) >= {n for n in EDGE_LENGTHS if n <= 100}
    assert max(mixed) <= 100
    assert lengths_with_edges(random.Random(3), 9, 300) == lengths_with_edges(
        random.Random(3), 9, 300
    )
