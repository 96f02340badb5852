"""Input transforms shared by the oracles: gate modes, q/k L2 normalisation, beta sigmoid.

Every transform is elementwise per (token, head), so it can be applied to a whole packed
batch before any recurrence runs. The oracles call `prepare_inputs` in float64
(`recurrent_kda`) or float32 (`chunk_kda_mirror`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kdabench.kernels.contract import GATE_MODES  # the contract's names; the math is below

L2_NORM_EPS = 1e-6


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """Divide x by sqrt(sum over its last dim of x^2 + 1e-6), in x's dtype."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + L2_NORM_EPS)


def log_decay(
    g: torch.Tensor,
    gate: str,
    *,
    lower_bound: float = -5.0,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Per-key-channel log decay [T, H, K] in `dtype` from g as the gate mode reads it.

    * "precomputed": g is the log decay as given (no clamp).
    * "sigmoid":  lower_bound * sigmoid(exp(A_log[h]) * (g + dt_bias[h, kk]))
    * "softplus": max(-exp(A_log[h]) * softplus(g + dt_bias[h, kk]), lower_bound)

    A_log is [H]; dt_bias is [H, K] or flat [H * K]. Both are required by the fused modes.
    """
    if gate not in GATE_MODES:
        raise ValueError(f"unknown gate {gate!r}; expected one of {', '.join(GATE_MODES)}")
    g = g.to(dtype)
    if gate == "precomputed":
        return g
    if A_log is None or dt_bias is None:
        missing = [name for name, t in (("A_log", A_log), ("dt_bias", dt_bias)) if t is None]
        raise ValueError(f"gate={gate!r} needs A_log [H] and dt_bias [H, K]; missing {missing}")
    _, num_heads, head_dim = g.shape
    if A_log.shape != (num_heads,):
        raise ValueError(f"A_log must be [H]=[{num_heads}], got {list(A_log.shape)}")
    if dt_bias.numel() != num_heads * head_dim or dt_bias.dim() not in (1, 2):
        raise ValueError(
            f"dt_bias must be [H, K]=[{num_heads}, {head_dim}] or [H*K], got {list(dt_bias.shape)}"
        )
    rate = torch.exp(A_log.to(g.device, dtype))[:, None]  # [H, 1]
    x = g + dt_bias.to(g.device, dtype).reshape(num_heads, head_dim)
    if gate == "sigmoid":
        return lower_bound * torch.sigmoid(rate * x)
    softplus = torch.logaddexp(x, torch.zeros_like(x))  # exact, no large-x threshold
    return torch.clamp(-rate * softplus, min=lower_bound)


@dataclass(frozen=True)
class PreparedInputs:
    """Oracle inputs after every transform, in one dtype on one device.

    q, k: [T, H, K]; v: [T, H, V]; g: log decay [T, H, K]; beta: [T, H];
    bounds: (bos, eos) token range per sequence; initial_state: [N, H, V, K] (V-first).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    bounds: list[tuple[int, int]]
    initial_state: torch.Tensor
    scale: float


def sequence_bounds(
    cu_seqlens: torch.Tensor | Sequence[int] | None, num_tokens: int
) -> list[tuple[int, int]]:
    """(bos, eos) per sequence from cu_seqlens [N+1]; None means one sequence of all tokens."""
    if cu_seqlens is None:
        return [(0, num_tokens)]
    offsets = [int(x) for x in (cu_seqlens.tolist() if torch.is_tensor(cu_seqlens) else cu_seqlens)]
    if len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != num_tokens:
        raise ValueError(f"cu_seqlens must run from 0 to T={num_tokens}, got {offsets}")
    if any(b < a for a, b in itertools.pairwise(offsets)):
        raise ValueError(f"cu_seqlens must be non-decreasing, got {offsets}")
    return list(itertools.pairwise(offsets))


def prepare_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor | Sequence[int] | None = None,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    gate: str = "precomputed",
    lower_bound: float = -5.0,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    qk_l2norm: bool = False,
    beta_sigmoid: bool = False,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> PreparedInputs:
    """Check shapes, upcast to `dtype` on `device`, apply l2norm / beta sigmoid / gate."""
    device = q.device if device is None else torch.device(device)
    if q.dim() != 3 or k.shape != q.shape or g.shape != q.shape:
        raise ValueError(f"q, k, g must all be [T, H, K]; got {[list(t.shape) for t in (q, k, g)]}")
    num_tokens, num_heads, head_dim = q.shape
    if v.dim() != 3 or v.shape[:2] != (num_tokens, num_heads):
        raise ValueError(
            f"v must be [T, H, V] with T, H = {num_tokens}, {num_heads}; got {list(v.shape)}"
        )
    if beta.shape != (num_tokens, num_heads):
        raise ValueError(
            f"beta must be [T, H] = [{num_tokens}, {num_heads}]; got {list(beta.shape)}"
        )
    value_dim = v.shape[-1]
    bounds = sequence_bounds(cu_seqlens, num_tokens)
    state_shape = (len(bounds), num_heads, value_dim, head_dim)
    if initial_state is None:
        initial_state = torch.zeros(state_shape, dtype=dtype, device=device)
    elif initial_state.shape != state_shape:
        raise ValueError(
            f"initial_state must be [N, H, V, K] = {list(state_shape)}; got {list(initial_state.shape)}"
        )

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype)

    q, k, beta = cast(q), cast(k), cast(beta)
    if qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    if beta_sigmoid:
        beta = torch.sigmoid(beta)
    g = log_decay(
        g.to(device), gate, lower_bound=lower_bound, A_log=A_log, dt_bias=dt_bias, dtype=dtype
    )
    return PreparedInputs(
        q=q,
        k=k,
        v=cast(v),
        g=g,
        beta=beta,
        bounds=bounds,
        initial_state=cast(initial_state),
        scale=head_dim**-0.5 if scale is None else float(scale),
    )
