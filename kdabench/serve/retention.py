"""Which recurrent states a prefill retains, as a serving engine's prefix cache keeps them.

A prompt's uncached part (from the cached prefix to the prompt's end) is prefilled in kernel
calls of at most `max_batched_tokens` tokens (vLLM's --max-num-batched-tokens, chunked
prefill). Each call can export up to `capacity` (the kernel's 4) states besides its final one.

With checkpoint export on, the block boundaries (multiples of `block_tokens`) kept are

* evenly spread: the multiples of `spacing` = block_tokens * ceil(blocks per call / capacity),
  so a call of 8,192 tokens with blocks of 1,024 keeps every 2,048th token (4 states); where
  no more than `capacity` block boundaries fit in a call, every one;
* the last block boundary before the prompt's end, always;
* at most `capacity` per call (the latest ones, where an unaligned call start lets more fall
  in).

A kept boundary that ends a call is that call's final state (no checkpoint slot); the others
are the call's interior checkpoints. With export off no boundary is kept: only the state at the
prompt's end is cached (final-states-only caching), which every plan leaves to its caller.
"""

from __future__ import annotations

from dataclasses import dataclass

CHECKPOINT_CAPACITY = 4  # states one kernel call exports besides its final one


@dataclass(frozen=True)
class PrefillCall:
    """Tokens start:stop of the prompt in one kernel call.

    checkpoints: kept block boundaries strictly inside the call (absolute positions);
    keep_end: whether the call's end is a kept block boundary (its final state is cached).
    """

    start: int
    stop: int
    checkpoints: tuple[int, ...] = ()
    keep_end: bool = False

    @property
    def retained(self) -> tuple[int, ...]:
        return (*self.checkpoints, self.stop) if self.keep_end else self.checkpoints


def spacing(block_tokens: int, max_batched_tokens: int, capacity: int) -> int:
    """Tokens between kept boundaries: every block where a call holds `capacity` or fewer."""
    blocks = max(max_batched_tokens // block_tokens, 1)
    return block_tokens * -(-blocks // capacity)


def plan_prefill_calls(
    start: int,
    stop: int,
    *,
    block_tokens: int,
    max_batched_tokens: int,
    checkpoint_export: bool,
    capacity: int = CHECKPOINT_CAPACITY,
) -> list[PrefillCall]:
    """Split the span start:stop (stop: the prompt's end) into calls with their kept states."""
    if not 0 <= start < stop:
        raise ValueError(f"empty or inverted prefill span {start}:{stop}")
    if block_tokens < 1 or max_batched_tokens < 1 or capacity < 1:
        raise ValueError("block_tokens, max_batched_tokens and capacity must be positive")
    last_boundary = (stop - 1) // block_tokens * block_tokens  # the last one before the end
    step = spacing(block_tokens, max_batched_tokens, capacity)
    calls = []
    for call_start in range(start, stop, max_batched_tokens):
        call_stop = min(call_start + max_batched_tokens, stop)
        kept: list[int] = []
        if checkpoint_export:
            first = (call_start // block_tokens + 1) * block_tokens
            kept = [
                b for b in range(first, min(call_stop, last_boundary) + 1, block_tokens)
                if b % step == 0 or b == last_boundary
            ][-capacity:]  # fmt: skip
        keep_end = bool(kept) and kept[-1] == call_stop
        interior = tuple(kept[:-1] if keep_end else kept)
        calls.append(PrefillCall(call_start, call_stop, interior, keep_end))
    return calls
