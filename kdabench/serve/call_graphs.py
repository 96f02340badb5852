"""A prefill call replayed as a CUDA graph, one graph per token bucket.

Eager, the host queues every layer's operations for every call: on an H100 the
kimi-linear-tp4 server's host took 15 to 23 ms to queue a call's 20 layers whatever its
length, so a call of 4,096 tokens (about 14 ms of device work) waited on its host. A graph
replay queues the same work in one launch.

A call of T tokens replays the graph of the smallest bucket B >= T (powers of two from
MIN_BUCKET, the last one the engine's max_tokens). The bucket's token buffer holds the call's
tokens and, past T, whatever an earlier call left there; the call's kernel metadata ends its
one sequence at T, so the kernel reads and writes no row past it (bound rows, not live ones),
and every other operation of a layer works row by row, so no padding row reaches a live one.
The residual of the last live row is picked on the device. Metadata, tokens and that row
index are copied into the graph's own buffers before each replay, which makes a replay as
safe as an eager call: the kernel validates the metadata on the device every time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

MIN_BUCKET = 512


def buckets(max_tokens: int) -> list[int]:
    """The token buckets for calls of up to `max_tokens` tokens."""
    sizes, size = [], MIN_BUCKET
    while size < max_tokens:
        sizes.append(size)
        size *= 2
    return [*sizes, max_tokens]


def bucket_for(tokens: int, max_tokens: int) -> int:
    """The smallest bucket that holds a call of `tokens` tokens (ValueError past max_tokens)."""
    if not 1 <= tokens <= max_tokens:
        raise ValueError(f"a call of {tokens} tokens: the buckets hold 1 to {max_tokens}")
    return next(size for size in buckets(max_tokens) if size >= tokens)


# (tokens [B], metadata row, last-row index [1]) -> residual of that row [1, D]
PaddedCall = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor  # int64 [B]
    meta: torch.Tensor  # int32 [META_WIDTH]
    last: torch.Tensor  # int64 [1]
    out: torch.Tensor  # [1, D], rewritten by every replay


class CallGraphs:
    """The graphs of one engine on one state pool, captured on first use of each bucket.

    call: the engine's padded call (see the module docstring) on that pool; warmup_row: the
    metadata row of a call of so many tokens whose sequence starts from zeros and writes only
    a scratch slot, for the runs of each capture.
    """

    def __init__(self, call: PaddedCall, max_tokens: int, warmup_row: Callable[[int], list[int]],
                 device: torch.device):
        self._call = call
        self.max_tokens = max_tokens
        self._warmup_row = warmup_row
        self._device = device
        self._graphs: dict[int, _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle()  # one memory pool: replays never overlap

    @property
    def captured(self) -> list[int]:
        return sorted(self._graphs)

    def capture_all(self) -> None:
        for size in buckets(self.max_tokens):
            self._graph(size)

    def run(self, tokens: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
        """Replay the call for `tokens` (int64 [T] on the device) with its metadata row; the
        residual of the last token [1, D], valid until the next replay."""
        count = tokens.shape[0]
        graph = self._graph(bucket_for(count, self.max_tokens))
        graph.tokens[:count].copy_(tokens)
        graph.meta.copy_(meta)
        graph.last.fill_(count - 1)
        graph.graph.replay()
        return graph.out

    def _graph(self, bucket: int) -> _Graph:
        if bucket not in self._graphs:
            self._graphs[bucket] = self._capture(bucket)
        return self._graphs[bucket]

    def _capture(self, bucket: int) -> _Graph:
        """Run the call once on a side stream (compiles the kernels, and the allocator learns
        its sizes), then capture it."""
        tokens = torch.zeros(bucket, dtype=torch.int64, device=self._device)
        meta = torch.tensor(self._warmup_row(bucket), dtype=torch.int32, device=self._device)
        last = torch.full((1,), bucket - 1, dtype=torch.int64, device=self._device)
        side = torch.cuda.Stream(self._device)
        side.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(side):
            self._call(tokens, meta, last)
        torch.cuda.current_stream(self._device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._call(tokens, meta, last)
        return _Graph(graph, tokens, meta, last, out)
