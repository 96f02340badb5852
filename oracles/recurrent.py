"""The float64 token-by-token KDA recurrence: the independent reference for everything.

Per sequence and head, with the state S as [K, V]:

    S' = exp(g_t)[:, None] * S_{t-1}
    S_t = S' + beta_t * k_t (v_t - S'^T k_t)^T      == (I - b k k^T) Diag(exp(g)) S + b k v^T
    o_t = scale * S_t^T q_t

Only the heads are batched; tokens run one after another, so it is obviously right.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from .gates import prepare_inputs


class RecurrentResult(NamedTuple):
    """o: float64 [T, H, V]; final_state: float64 [N, H, V, K]; prefix_states: one
    float64 [len(prefix_lengths[n]), H, V, K] per sequence (empty when none asked)."""

    o: torch.Tensor
    final_state: torch.Tensor
    prefix_states: list[torch.Tensor]


def check_prefix_lengths(
    prefix_lengths: Sequence[Sequence[int]] | None, lengths: Sequence[int], what: str
) -> list[list[int]]:
    """Validate one list of offsets (0..len_n) per sequence; None means none anywhere."""
    if prefix_lengths is None:
        return [[] for _ in lengths]
    if len(prefix_lengths) != len(lengths):
        raise ValueError(
            f"{what} needs one list per sequence ({len(lengths)}), got {len(prefix_lengths)}"
        )
    checked = []
    for n, (offsets, length) in enumerate(zip(prefix_lengths, lengths)):
        offsets = [int(p) for p in offsets]
        bad = [p for p in offsets if not 0 <= p <= length]
        if bad:
            raise ValueError(f"{what}[{n}] = {bad} outside 0..{length} (sequence {n}'s length)")
        checked.append(offsets)
    return checked


def recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor | Sequence[int] | None = None,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    prefix_lengths: Sequence[Sequence[int]] | None = None,
    gate: str = "precomputed",
    lower_bound: float = -5.0,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    qk_l2norm: bool = False,
    beta_sigmoid: bool = False,
    device: torch.device | str | None = None,
) -> RecurrentResult:
    """Run the KDA recurrence in float64, token by token, over a packed varlen batch.

    Args:
        q, k: [T, H, K]; v: [T, H, V]; any float dtype (upcast to float64).
        g: [T, H, K] log decay ("precomputed") or raw gate ("sigmoid" / "softplus",
            which need A_log [H] and dt_bias [H, K] or [H*K]; see `gates.log_decay`).
        beta: [T, H]; probabilities, or logits with beta_sigmoid=True.
        cu_seqlens: [N+1] token offsets (zero-length sequences allowed); None = one sequence.
        initial_state: [N, H, V, K] (V-first pool layout); None = zeros.
        scale: output scale; None = K**-0.5.
        prefix_lengths: None, or one list per sequence of token counts in 0..len_n; the
            state after that many tokens of sequence n is returned (0 = initial state).
        qk_l2norm: L2-normalise q and k per (token, head) first.
        device: where to compute; None = q.device. Runs on CUDA as well.

    Returns:
        RecurrentResult(o, final_state, prefix_states), all float64 on `device`.
    """
    x = prepare_inputs(
        q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_state=initial_state, scale=scale,
        gate=gate, lower_bound=lower_bound, A_log=A_log, dt_bias=dt_bias,
        qk_l2norm=qk_l2norm, beta_sigmoid=beta_sigmoid, dtype=torch.float64, device=device,
    )  # fmt: skip
    num_tokens, num_heads, head_dim = x.q.shape
    value_dim = x.v.shape[-1]
    prefixes = check_prefix_lengths(prefix_lengths, [e - b for b, e in x.bounds], "prefix_lengths")

    # Per-token views shaped for batched matmuls over heads: rows [H, 1, D], columns [H, K, 1].
    decay = torch.exp(x.g).unsqueeze(-1)  # [T, H, K, 1]
    k_row, k_col = x.k.unsqueeze(-2), x.k.unsqueeze(-1)
    q_row, v_row = x.q.unsqueeze(-2), x.v.unsqueeze(-2)
    beta = x.beta[:, :, None, None]  # [T, H, 1, 1]
    o = torch.zeros(num_tokens, num_heads, 1, value_dim, dtype=torch.float64, device=x.q.device)

    final_states, prefix_states = [], []
    for n, (bos, eos) in enumerate(x.bounds):
        initial = x.initial_state[n]  # [H, V, K]
        state = initial.transpose(-1, -2).clone(memory_format=torch.contiguous_format)
        # positions in prefixes[n] of each requested length (a length may be asked twice)
        wanted: dict[int, list[int]] = {}
        for i, p in enumerate(prefixes[n]):
            wanted.setdefault(p, []).append(i)
        snapshots = [initial.clone() for _ in prefixes[n]]  # what length 0 asks for
        for t in range(bos, eos):
            state.mul_(decay[t])  # S' = Diag(exp(g_t)) S
            error = v_row[t] - torch.bmm(k_row[t], state)  # v_t - S'^T k_t, as [H, 1, V]
            state.baddbmm_(k_col[t], beta[t] * error)  # S_t = S' + k_t (beta_t * error)^T
            torch.bmm(q_row[t], state, out=o[t])  # S_t^T q_t (scaled below)
            for i in wanted.get(t + 1 - bos, ()):
                snapshots[i] = state.transpose(-1, -2).clone()  # [H, V, K]
        final_states.append(state.transpose(-1, -2))
        empty = x.q.new_zeros(0, num_heads, value_dim, head_dim)
        prefix_states.append(torch.stack(snapshots) if snapshots else empty)

    final_state = torch.stack(final_states).contiguous()
    return RecurrentResult(o.squeeze(-2).mul_(x.scale), final_state, prefix_states)
