"""Prefix-state oracle: the state after a prefix is the final state of a run over that prefix alone.

How to use it, with any implementation `run(q, k, v, g, beta, cu_seqlens, initial_state)`
that returns final states [N, H, V, K] (the kernel, `recurrent_kda`, the chunk mirror):

    batch = prefix_batch(cu_seqlens, checkpoint_offsets)   # one list of offsets per sequence
    idx = batch.token_index
    final = run(q[idx], k[idx], v[idx], g[idx], beta[idx],
                cu_seqlens=batch.cu_seqlens,
                initial_state=initial_state[batch.sequence_index])   # if there is one
    # final[i] is the expected state after the first batch.owners[i][1] tokens of
    # sequence batch.owners[i][0]; prefixes are in sequence order, then in offset order.

The gates are elementwise per token, so raw gates (and A_log / dt_bias, which are per head)
carry over unchanged. `expected_prefix_states` does all of this with `recurrent_kda`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from .gates import sequence_bounds
from .recurrent import check_prefix_lengths, recurrent_kda


class PrefixBatch(NamedTuple):
    """A packed batch with one sequence per requested prefix.

    token_index: int64 [sum of offsets], rows of the original batch to gather;
    cu_seqlens: int32 [P+1] of the prefix batch; owners: (sequence, offset) per prefix.
    """

    token_index: torch.Tensor
    cu_seqlens: torch.Tensor
    owners: list[tuple[int, int]]

    @property
    def sequence_index(self) -> torch.Tensor:
        """int64 [P]: the original sequence of each prefix (to gather initial states)."""
        return torch.tensor(
            [n for n, _ in self.owners], dtype=torch.int64, device=self.token_index.device
        )


def prefix_batch(
    cu_seqlens: torch.Tensor | Sequence[int], offsets_per_seq: Sequence[Sequence[int]]
) -> PrefixBatch:
    """Build the prefix batch for offsets (0..len_n each; 0 = an empty prefix) per sequence."""
    device = cu_seqlens.device if torch.is_tensor(cu_seqlens) else torch.device("cpu")
    offsets_list = cu_seqlens.tolist() if torch.is_tensor(cu_seqlens) else list(cu_seqlens)
    bounds = sequence_bounds(offsets_list, int(offsets_list[-1]) if offsets_list else 0)
    offsets = check_prefix_lengths(offsets_per_seq, [e - b for b, e in bounds], "offsets_per_seq")
    pieces, starts, owners = [], [0], []
    for n, ((bos, _), seq_offsets) in enumerate(zip(bounds, offsets)):
        for offset in seq_offsets:
            pieces.append(torch.arange(bos, bos + offset, dtype=torch.int64))
            starts.append(starts[-1] + offset)
            owners.append((n, offset))
    token_index = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)
    return PrefixBatch(
        token_index.to(device), torch.tensor(starts, dtype=torch.int32, device=device), owners
    )


def expected_prefix_states(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    prefix_lengths: Sequence[Sequence[int]],
    cu_seqlens: torch.Tensor | Sequence[int] | None = None,
    initial_state: torch.Tensor | None = None,
    **options,
) -> list[torch.Tensor]:
    """Float64 states after each prefix, via `prefix_batch` + `recurrent_kda` over the prefixes.

    Returns one [len(prefix_lengths[n]), H, V, K] tensor per sequence, like
    `recurrent_kda(..., prefix_lengths=...).prefix_states`. `options` go to `recurrent_kda`
    (gate, lower_bound, A_log, dt_bias, qk_l2norm, beta_sigmoid, device).
    """
    if cu_seqlens is None:
        cu_seqlens = [0, q.shape[0]]
    batch = prefix_batch(cu_seqlens, prefix_lengths)
    if not batch.owners:
        empty = q.new_zeros(0, q.shape[1], v.shape[2], q.shape[2], dtype=torch.float64)
        return [empty for _ in prefix_lengths]
    idx = batch.token_index.to(q.device)
    if initial_state is not None:
        initial_state = initial_state[batch.sequence_index.to(initial_state.device)]
    result = recurrent_kda(
        q[idx], k[idx], v[idx], g[idx], beta[idx],
        cu_seqlens=batch.cu_seqlens, initial_state=initial_state, **options,
    )  # fmt: skip
    counts = [len(offsets) for offsets in prefix_lengths]
    return list(result.final_state.split(counts))
