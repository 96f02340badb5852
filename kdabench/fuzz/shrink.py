"""Greedy shrinking of a failing set: drop rows, shorten lengths, clear checkpoints and slots,
compact slot numbers and the pool, while the same check still fails."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from kdabench.fuzz.sets import FuzzSet
from kdabench.kernels.contract import NULL_SLOT

MAX_TRIES = 200
INT32 = range(-(2**31), 2**31)


def _drop_row(s: FuzzSet, n: int) -> FuzzSet:
    c = s.copy()
    step = c.cu_seqlens[n + 1] - c.cu_seqlens[n]
    c.cu_seqlens = c.cu_seqlens[: n + 1] + [v - step for v in c.cu_seqlens[n + 2:]]
    for name in ("initial", "final", "offsets", "slots"):
        getattr(c, name).pop(n)
    if n < c.num_seqs:
        c.num_seqs -= 1
    c.tokens = max(1, c.tokens - max(step, 0))
    return c


def _shorten(s: FuzzSet, n: int, new: int) -> FuzzSet:
    c = s.copy()
    delta = (c.cu_seqlens[n + 1] - c.cu_seqlens[n]) - new
    c.cu_seqlens = c.cu_seqlens[: n + 1] + [v - delta for v in c.cu_seqlens[n + 1:]]
    c.tokens = max(1, c.tokens - delta)
    return c


def _compact(s: FuzzSet) -> FuzzSet:
    """Slots in range renumbered from slot_base up, relations kept; the pool shrunk to fit."""
    c = s.copy()
    named = c.initial + c.final + [v for row in c.slots for v in row]
    used = sorted({v for v in named if c.slot_base <= v < c.num_slots})
    new_slots = c.slot_base + max(len(used), 1)
    mapping = {v: c.slot_base + i for i, v in enumerate(used)}

    def move(v: int) -> int:
        if v in mapping:
            return mapping[v]
        return v - c.num_slots + new_slots if v >= c.num_slots else v

    c.initial, c.final = [move(v) for v in c.initial], [move(v) for v in c.final]
    c.slots = [[move(v) for v in row] for row in c.slots]
    c.num_slots = new_slots
    return c


def candidates(s: FuzzSet) -> Iterator[FuzzSet]:
    """Smaller sets, the boldest first."""
    if s.rows > max(s.num_seqs, 1):
        c = s.copy()
        keep = max(s.num_seqs, 1)
        c.cu_seqlens, c.initial, c.final = c.cu_seqlens[: keep + 1], c.initial[:keep], \
            c.final[:keep]
        c.offsets, c.slots = c.offsets[:keep], c.slots[:keep]
        yield c
    for n in range(s.rows - 1, -1, -1):
        if s.rows > 1:
            yield _drop_row(s, n)
    for n in range(s.live):
        length = s.cu_seqlens[n + 1] - s.cu_seqlens[n]
        for new in (1, length // 2, length - 1):
            if 0 < new < length:
                yield _shorten(s, n, new)
    if s.live and s.tokens > max(s.cu_seqlens[s.live], 1):
        c = s.copy()
        c.tokens = max(s.cu_seqlens[s.live], 1)
        yield c
    for n in range(s.rows):
        for k in range(s.capacity):
            if s.slots[n][k] != NULL_SLOT:
                c = s.copy()
                c.slots[n][k] = NULL_SLOT
                yield c
        for name in ("initial", "final"):
            if getattr(s, name)[n] != NULL_SLOT:
                c = s.copy()
                getattr(c, name)[n] = NULL_SLOT
                yield c
    compact = _compact(s)
    if compact != s:
        yield compact
    values = s.cu_seqlens + s.initial + s.final + [v for r in s.offsets + s.slots for v in r]
    if s.index_dtype == "int64" and all(v in INT32 for v in values):
        c = s.copy()
        c.index_dtype = "int32"
        yield c


def shrink(fset: FuzzSet, still_fails: Callable[[FuzzSet], bool],
           max_tries: int = MAX_TRIES) -> tuple[FuzzSet, int]:
    """The smallest set greedy steps reach that still fails; returns it and the tries made."""
    best, tries, progress = fset, 0, True
    while progress and tries < max_tries:
        progress = False
        for candidate in candidates(best):
            if candidate.shape_problems():
                continue
            tries += 1
            if still_fails(candidate):
                best, progress = candidate, True
                break
            if tries >= max_tries:
                break
    return best, tries
