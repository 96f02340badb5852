"""Fault mutations: each edits a valid set in place the way one fault class says.

A mutation raises CannotBuild when the set has no room for it (one live sequence for a
two-sequence fault, no active checkpoint); the generator then draws another layout. Slot
values past the pool, below -1, and (int64 metadata) 2^32 away from a valid slot, which a
32-bit truncation would turn into a valid one, are all drawn.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from kdabench.fuzz.sets import FuzzSet
from kdabench.kernels.contract import NULL_SLOT
from kdabench.qualify.metadata import CannotBuild

INT32_MAX = 2**31 - 1


def _fresh(s: FuzzSet) -> int:
    """A slot no one names: the pool grows by one."""
    s.num_slots += 1
    return s.num_slots - 1


def _live(s: FuzzSet, rng: random.Random, need: int = 1) -> list[int]:
    if s.live < need:
        raise CannotBuild(f"needs {need} live sequence(s), the set has {s.live}")
    return rng.sample(range(s.live), need)


def _active(s: FuzzSet, rng: random.Random, need: int = 1) -> list[tuple[int, int]]:
    """`need` distinct live active entries as (sequence, position)."""
    entries = [(n, c) for n in range(s.live) for c in range(s.capacity)
               if s.slots[n][c] != NULL_SLOT]
    if len(entries) < need:
        raise CannotBuild(f"needs {need} active checkpoint(s), the set has {len(entries)}")
    return rng.sample(entries, need)


def _final_of(s: FuzzSet, n: int) -> int:
    if s.final[n] < 0:
        s.final[n] = _fresh(s)
    return s.final[n]


def _initial_of(s: FuzzSet, n: int) -> int:
    if s.initial[n] < 0:
        s.initial[n] = _fresh(s)
    return s.initial[n]


def _past_pool(s: FuzzSet, rng: random.Random) -> int:
    choices = [s.num_slots, s.num_slots, s.num_slots + 1, s.num_slots + rng.randint(2, 1000),
               INT32_MAX]
    if s.index_dtype == "int64":  # truncated to 32 bits it would be a valid slot
        choices += [2**32 + rng.randrange(s.num_slots), 2**40]
    return rng.choice(choices)


def _below_null(s: FuzzSet, rng: random.Random) -> int:
    choices = [-2, -2, -3, -rng.randint(4, 1000), -INT32_MAX - 1]
    if s.index_dtype == "int64":
        choices += [rng.randrange(s.num_slots) - 2**32, -(2**40)]
    return rng.choice(choices)


def _lengths_decreasing(s, rng):
    i = rng.randint(1, max(1, s.live))
    s.cu_seqlens[i] = s.cu_seqlens[i - 1] - rng.randint(1, 3)


def _lengths_nonzero_start(s, rng):
    s.cu_seqlens[0] = rng.choice((1, 2, -1))


def _lengths_past_capacity(s, rng):
    end = max(1, s.live)
    if s.cu_seqlens[end] > rng.randint(1, 3) and rng.random() < 0.5:
        s.tokens = rng.randint(1, s.cu_seqlens[end] - 1)  # fewer tokens bound than used
    else:
        s.cu_seqlens[end] = s.tokens + rng.randint(1, 3)


def _live_count_zero(s, rng):
    s.num_seqs = 0


def _live_count_over(s, rng):
    s.num_seqs = rng.choice((s.rows + 1, s.rows + rng.randint(2, 5), INT32_MAX))


def _slot_fault(target: str, value: Callable[[FuzzSet, random.Random], int]):
    def mutate(s: FuzzSet, rng: random.Random) -> None:
        if target == "checkpoint":
            (n, c), = _active(s, rng)
            s.slots[n][c] = value(s, rng)
        else:
            n, = _live(s, rng)
            getattr(s, target)[n] = value(s, rng)
    return mutate


def _duplicate_final(s, rng):
    i, j = _live(s, rng, 2)
    s.final[j] = _final_of(s, i)


def _checkpoint_equals_final(s, rng):
    (n, c), = _active(s, rng)
    j = rng.randrange(s.live)
    s.slots[n][c] = _final_of(s, j)


def _duplicate_checkpoint(s, rng):
    (n, c), (m, d) = _active(s, rng, 2)
    s.slots[m][d] = s.slots[n][c]


def _final_aliases_initial(s, rng):
    i, j = _live(s, rng, 2)
    s.final[j] = _initial_of(s, i)


def _checkpoint_aliases_initial(s, rng):
    (n, c), = _active(s, rng)
    others = [i for i in range(s.live) if i != n]
    if not others:
        raise CannotBuild("needs a second live sequence")
    s.slots[n][c] = _initial_of(s, rng.choice(others))


def _offset_fault(kind: str):
    def mutate(s: FuzzSet, rng: random.Random) -> None:
        n, = _live(s, rng)
        length = s.cu_seqlens[n + 1] - s.cu_seqlens[n]
        c = rng.randrange(s.capacity)
        if s.slots[n][c] == NULL_SLOT:
            s.slots[n][c] = _fresh(s)  # activate an inactive entry
        s.offsets[n][c] = {
            "zero": 0,
            "at-length": length,
            "past-length": length + rng.choice((1, 2, rng.randint(3, 100), INT32_MAX - length)),
        }[kind]
    return mutate


def _offset_order(kind: str):
    def mutate(s: FuzzSet, rng: random.Random) -> None:
        rows = [n for n, a in enumerate(s.actives()) if len(a) >= 2]
        if not rows:
            raise CannotBuild("no live sequence holds two active checkpoints")
        n = rng.choice(rows)
        first, second = sorted(rng.sample(
            [c for c in range(s.capacity) if s.slots[n][c] != NULL_SLOT], 2))
        row = s.offsets[n]
        if kind == "equal":
            row[second] = row[first]
        else:
            row[first], row[second] = row[second], row[first]
    return mutate


MUTATIONS: dict[str, Callable[[FuzzSet, random.Random], None]] = {
    "lengths-decreasing": _lengths_decreasing,
    "lengths-nonzero-start": _lengths_nonzero_start,
    "lengths-past-capacity": _lengths_past_capacity,
    "live-count-zero": _live_count_zero,
    "live-count-over-max": _live_count_over,
    "initial-past-pool": _slot_fault("initial", _past_pool),
    "final-past-pool": _slot_fault("final", _past_pool),
    "checkpoint-past-pool": _slot_fault("checkpoint", _past_pool),
    "initial-below-null": _slot_fault("initial", _below_null),
    "final-below-null": _slot_fault("final", _below_null),
    "checkpoint-below-null": _slot_fault("checkpoint", _below_null),
    "duplicate-final": _duplicate_final,
    "checkpoint-equals-final": _checkpoint_equals_final,
    "duplicate-checkpoint": _duplicate_checkpoint,
    "final-aliases-initial": _final_aliases_initial,
    "checkpoint-aliases-initial": _checkpoint_aliases_initial,
    "offset-zero": _offset_fault("zero"),
    "offset-at-length": _offset_fault("at-length"),
    "offset-past-length": _offset_fault("past-length"),
    "offset-not-increasing": _offset_order("not-increasing"),
    "offset-equal": _offset_order("equal"),
}
