"""Seeded random KDA inputs for tests, the qualification matrix and the bench.

Everything is drawn on the CPU from one torch.Generator and then moved to the device, so a
seed gives the same numbers on every device. The distributions:

* q: N(0, 1/K) per element (norm ~1). k: N(0, 1) then L2-normalised per (token, head), so the
  delta rule is stable. With qk_l2norm=True both stay raw N(0, 1) (norm ~sqrt(K)): the kernel
  normalises them.
* v: N(0, 1). initial_state: N(0, 1) [N, H, V, K] (V-first).
* beta: sigmoid of N(0, 2^2) logits, so values reach near 0 and near 1; with beta_sigmoid=True
  the logits themselves.
* precomputed g (log decay in [lower_bound, 0)): each (head, key channel) gets a typical rate
  s = u^4, u ~ U(0.05, 1); each token scales it by w ~ U(0.5, 1.5):
  g = max(lower_bound * s * w, lower_bound). About half the channels decay slowly
  (|g| < 0.1 * |lower_bound|; the slowest near 3e-6 * |lower_bound| per token, i.e. memory over
  thousands of tokens), about a tenth reach the bound (stressing exp(-cumsum g) inside a chunk).
  This is the bench's "long-memory" gate regime; kdabench.bench.gates draws its other ones.
* raw gates for "sigmoid"/"softplus": N(0, 1) plus a per-(head, channel) offset ~ U(-6, 2), so
  the fused gates also span slow (g ~ -0.01) to fast (g ~ lower_bound) channels;
  A_log ~ N(0, 0.5^2) [H]; dt_bias ~ N(0, 0.5^2) [H, K].
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import torch

from kdabench.oracles.gates import GATE_MODES

EDGE_LENGTHS = (1, 15, 16, 17, 63, 64, 65, 200)


@dataclass
class KdaInputs:
    """One packed varlen batch of KDA inputs (see the module docstring for distributions).

    q, k: bf16 [T, H, K]; v: bf16 [T, H, V]; g: fp32 [T, H, K] (log decay, or raw gate);
    beta: fp32 [T, H] (probabilities, or logits); cu_seqlens: int32 [N+1];
    A_log: fp32 [H] and dt_bias: fp32 [H, K] (fused gate modes, else None);
    initial_state: fp32 [N, H, V, K] or None.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    cu_seqlens: torch.Tensor
    A_log: torch.Tensor | None
    dt_bias: torch.Tensor | None
    gate: str
    lower_bound: float
    qk_l2norm: bool
    beta_sigmoid: bool
    initial_state: torch.Tensor | None

    @property
    def lengths(self) -> list[int]:
        """Token count of each sequence."""
        offsets = self.cu_seqlens.tolist()
        return [b - a for a, b in itertools.pairwise(offsets)]

    def gate_kwargs(self) -> dict:
        """The keyword arguments every KDA entry point takes for the input transforms."""
        return {
            "gate": self.gate,
            "lower_bound": self.lower_bound,
            "A_log": self.A_log,
            "dt_bias": self.dt_bias,
            "qk_l2norm": self.qk_l2norm,
            "beta_sigmoid": self.beta_sigmoid,
        }


def make_inputs(
    lengths: list[int],
    num_heads: int,
    head_dim: int,
    *,
    gate: str = "precomputed",
    lower_bound: float = -5.0,
    qk_l2norm: bool = False,
    beta_sigmoid: bool = False,
    with_initial_state: bool = True,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> KdaInputs:
    """Random inputs for sequences of `lengths` tokens (K = V = head_dim), reproducible by seed."""
    if gate not in GATE_MODES:
        raise ValueError(f"unknown gate {gate!r}")
    if not lengths or any(n < 0 for n in lengths):
        raise ValueError(f"lengths must be a non-empty list of counts >= 0, got {lengths}")
    if lower_bound >= 0:
        raise ValueError(f"lower_bound must be negative, got {lower_bound}")
    gen = torch.Generator().manual_seed(seed)
    num_tokens, shape = sum(lengths), (sum(lengths), num_heads, head_dim)

    def normal(*size: int, std: float = 1.0) -> torch.Tensor:
        return torch.randn(size, generator=gen) * std

    def uniform(*size: int, low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(size, generator=gen)

    q, k = normal(*shape), normal(*shape)
    if not qk_l2norm:
        q = q * head_dim**-0.5
        k = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    v = normal(*shape)
    beta_logits = normal(num_tokens, num_heads, std=2.0)
    beta = beta_logits if beta_sigmoid else torch.sigmoid(beta_logits)

    A_log = dt_bias = None
    if gate == "precomputed":
        rate = uniform(num_heads, head_dim, low=0.05, high=1.0) ** 4
        jitter = uniform(*shape, low=0.5, high=1.5)
        g = torch.clamp(lower_bound * rate * jitter, min=lower_bound)
    else:
        g = normal(*shape) + uniform(num_heads, head_dim, low=-6.0, high=2.0)
        A_log = normal(num_heads, std=0.5)
        dt_bias = normal(num_heads, head_dim, std=0.5)
    initial_state = (
        normal(len(lengths), num_heads, head_dim, head_dim) if with_initial_state else None
    )
    cu_seqlens = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)

    def to_device(
        t: torch.Tensor | None, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor | None:
        return None if t is None else t.to(dtype).to(device)

    return KdaInputs(
        q=to_device(q, torch.bfloat16),
        k=to_device(k, torch.bfloat16),
        v=to_device(v, torch.bfloat16),
        g=to_device(g),
        beta=to_device(beta),
        cu_seqlens=cu_seqlens.to(device),
        A_log=to_device(A_log),
        dt_bias=to_device(dt_bias),
        gate=gate,
        lower_bound=float(lower_bound),
        qk_l2norm=qk_l2norm,
        beta_sigmoid=beta_sigmoid,
        initial_state=to_device(initial_state),
    )


def lengths_with_edges(rng: random.Random, num_seqs: int, max_len: int) -> list[int]:
    """num_seqs lengths, about half of them chunk edge cases from EDGE_LENGTHS (<= max_len)."""
    edges = [n for n in EDGE_LENGTHS if n <= max_len] or [1]
    return [
        rng.choice(edges) if rng.random() < 0.5 else rng.randint(1, max_len)
        for _ in range(num_seqs)
    ]
