"""The chunked KDA algorithm in plain torch float32: what the Triton kernel computes, step by step.

Derivation (one head, state S as [K, V], a chunk of C tokens i = 0..C-1 starting from S0).
Write the recurrence as S_i = D_i S_{i-1} + k_i u_i^T with D_i = Diag(exp(g_i)) and
u_i = beta_i (v_i - (D_i S_{i-1})^T k_i). With G_i = g_0 + ... + g_i (cumulative log decay),
unrolling gives the "WY" form

    S_i = Diag(exp(G_i)) S0 + sum_{j<=i} Diag(exp(G_i - G_j)) k_j u_j^T.          (1)

Put (1) for S_{i-1}, times D_i, into u_i:

    u_i = beta_i (v_i - S0^T (k_i exp(G_i))) - beta_i sum_{j<i} <k_i exp(G_i), k_j exp(-G_j)> u_j

so with kg = k exp(G), kn = k exp(-G), A = strictly_lower(kg kn^T), M = beta[:, None] A and
R = beta[:, None] (v - kg S0), the corrections U = [u_i] solve (I + M) U = R: U = delta.
Outputs follow from (1): o_i = scale S_i^T q_i = scale (qg S0 + lower_inclusive(qg kn^T) delta)_i
with qg = q exp(G). The state after the chunk's first p tokens is (1) at i = p-1:

    S_p = exp(G_{p-1})[:, None] * S0 + (k_{j<p} exp(G_{p-1} - G_j))^T delta_{j<p};

p = C (kd = k exp(G_{C-1} - G)) is the state handed to the next chunk.

Numerics. G is not re-anchored inside the chunk, so exp(-G) grows as the decay accumulates:
with g >= -5 and C = 16, -G <= 80 and exp(80) ~ 5.5e34 stays below the float32 maximum
(3.4e38, i.e. exp(88.7)). chunk_size * |min g| must stay under ~88 or kn overflows to inf.
Products kg_i . kn_j recombine to exp(G_i - G_j) <= 1 for j <= i, each factor relatively exact.
Zero padding of the last chunk (q = k = v = 0, g = 0, beta = 0) leaves everything unchanged:
padded rows have M = 0 and R = 0, so their delta is 0 and they add nothing to any state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from .gates import prepare_inputs
from .recurrent import check_prefix_lengths


class MirrorResult(NamedTuple):
    """o: fp32 [T, H, V]; final_state: fp32 [N, H, V, K]; checkpoint_states: one fp32
    [len(checkpoint_offsets[n]), H, V, K] per sequence (empty when none asked)."""

    o: torch.Tensor
    final_state: torch.Tensor
    checkpoint_states: list[torch.Tensor]


def unit_lower_inverse(m: torch.Tensor) -> torch.Tensor:
    """(I + M)^-1 for strictly lower-triangular M [..., C, C], by forward substitution.

    (I + M) T = I gives T = I - M T; M is strictly lower, so row i of T needs only rows j < i:
    T[i] = e_i - sum_{j<i} M[i, j] T[j].
    """
    size = m.shape[-1]
    inverse = torch.zeros_like(m)
    for i in range(size):
        row = -(m[..., i, :i, None] * inverse[..., :i, :]).sum(dim=-2)
        row[..., i] = 1.0
        inverse[..., i, :] = row
    return inverse


class _Chunk(NamedTuple):
    """What one chunk leaves for the state updates: per head k [H,C,K], G [H,C,K], delta [H,C,V]."""

    k: torch.Tensor
    G: torch.Tensor
    delta: torch.Tensor


def _padded_chunk(t: torch.Tensor, start: int, stop: int, chunk_size: int) -> torch.Tensor:
    """Tokens start:stop of t [T, H, ...] as [H, chunk_size, ...], zero-padded at the end."""
    piece = t[start:stop].transpose(0, 1)
    padding = piece.new_zeros(piece.shape[0], chunk_size - (stop - start), *piece.shape[2:])
    return torch.cat([piece, padding], dim=1)


def _state_after(s0: torch.Tensor, chunk: _Chunk, p: int) -> torch.Tensor:
    """State [H, K, V] after the chunk's first p tokens (1 <= p <= C), from (1) at i = p-1."""
    g_p = chunk.G[:, p - 1 : p, :]  # [H, 1, K]
    k_decayed = chunk.k[:, :p] * torch.exp(g_p - chunk.G[:, :p])  # k_j exp(G_{p-1} - G_j), j < p
    return torch.exp(g_p).transpose(-1, -2) * s0 + k_decayed.transpose(-1, -2) @ chunk.delta[:, :p]


def _chunk_forward(
    s0: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, _Chunk]:
    """One chunk, all heads at once: q, k, g [H, C, K]; v [H, C, V]; beta [H, C]; s0 [H, K, V].

    Returns the chunk's output [H, C, V] and what `_state_after` needs.
    """
    G = g.cumsum(dim=1)  # cumulative log decay within the chunk, [H, C, K]
    kg = k * torch.exp(G)  # k_i decayed from the chunk start to token i
    kn = k * torch.exp(-G)  # k_j "un-decayed" back to the chunk start (large: up to exp(80))
    qg = q * torch.exp(G)
    # A[i, j] = <k_i, k_j exp(G_i - G_j)>, j < i: how u_j leaks into token i's prediction.
    A = (kg @ kn.transpose(-1, -2)).tril(-1)
    M = beta[..., None] * A
    T_inverse = unit_lower_inverse(M)  # (I + M)^-1
    # R: each token's error against the chunk-start state alone, times beta.
    R = beta[..., None] * (v - kg @ s0)
    delta = T_inverse @ R  # u_i, the rank-1 corrections of the delta rule
    A_qk = (qg @ kn.transpose(-1, -2)).tril()  # <q_i, k_j exp(G_i - G_j)>, j <= i
    o = scale * (qg @ s0 + A_qk @ delta)
    return o, _Chunk(k, G, delta)


def chunk_kda_mirror(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor | Sequence[int] | None = None,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    checkpoint_offsets: Sequence[Sequence[int]] | None = None,
    chunk_size: int = 16,
    gate: str = "precomputed",
    lower_bound: float = -5.0,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    qk_l2norm: bool = False,
    beta_sigmoid: bool = False,
) -> MirrorResult:
    """Chunked KDA in float32 on q's device, with interior checkpoints.

    Same inputs and conventions as `recurrent_kda` (V-first states, zeros when no initial
    state, scale = K**-0.5 by default); the gate, l2norm and beta sigmoid are applied in float32.
    checkpoint_offsets: None, or one list per sequence of offsets in 0..len_n (tokens from the
    sequence start); the state after that many tokens is returned, in the order given.
    """
    x = prepare_inputs(
        q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=initial_state, scale=scale,
        gate=gate, lower_bound=lower_bound, A_log=A_log, dt_bias=dt_bias,
        qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid, dtype=torch.float32,
    )  # fmt: skip
    num_tokens, num_heads, head_dim = x.q.shape
    value_dim = x.v.shape[-1]
    lengths = [eos - bos for bos, eos in x.bounds]
    offsets = check_prefix_lengths(checkpoint_offsets, lengths, "checkpoint_offsets")
    o = torch.zeros(num_tokens, num_heads, value_dim, dtype=torch.float32, device=x.q.device)

    final_states, checkpoint_states = [], []
    for n, (bos, eos) in enumerate(x.bounds):
        state = x.initial_state[n].transpose(-1, -2)  # [H, K, V], never written in place
        checkpoints: list[torch.Tensor | None] = [
            state.transpose(-1, -2).clone() if p == 0 else None for p in offsets[n]
        ]
        for start in range(bos, eos, chunk_size):
            stop = min(start + chunk_size, eos)
            o_chunk, chunk = _chunk_forward(
                state,
                *(_padded_chunk(t, start, stop, chunk_size) for t in (x.q, x.k, x.v, x.g, x.beta)),
                x.scale,
            )
            o[start:stop] = o_chunk[:, : stop - start].transpose(0, 1)
            chunk_offset = start - bos
            for i, p in enumerate(offsets[n]):
                if chunk_offset < p <= chunk_offset + chunk_size:
                    checkpoints[i] = _state_after(state, chunk, p - chunk_offset).transpose(-1, -2)
            state = _state_after(state, chunk, chunk_size)
        final_states.append(state.transpose(-1, -2))
        empty = x.q.new_zeros(0, num_heads, value_dim, head_dim)
        checkpoint_states.append(torch.stack(checkpoints) if checkpoints else empty)
    return MirrorResult(o, torch.stack(final_states).contiguous(), checkpoint_states)
