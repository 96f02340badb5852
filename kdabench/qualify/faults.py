"""Fault mutations: edit valid metadata in place so that exactly one rule breaks.

FAULT_BITS and FOURTH_BITS name the error bit each fault must raise. RANDOM_MUTATIONS (the
fuzz scenario's) may or may not break a rule; the metadata oracle decides.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from kdabench.kernels.contract import MetadataFault
from kdabench.matrix import FAULT_VARIANTS
from kdabench.qualify.metadata import CannotBuild, Metadata

DUPLICATE = int(MetadataFault.DUPLICATE_WRITE_SLOT)
MALFORMED = int(MetadataFault.MALFORMED_LENGTHS)
OUT_OF_RANGE = int(MetadataFault.SLOT_OUT_OF_RANGE)
BAD_OFFSET = int(MetadataFault.BAD_CHECKPOINT_OFFSET)
FAULT_BITS = {
    "duplicate-final": DUPLICATE, "duplicate-final-checkpoint": DUPLICATE,
    "duplicate-checkpoint": DUPLICATE, "write-aliases-initial": DUPLICATE,
    "lengths-decreasing": MALFORMED, "lengths-nonzero-start": MALFORMED,
    "lengths-past-capacity": MALFORMED, "live-count-zero": MALFORMED,
    "live-count-over-capacity": MALFORMED,
    "slot-range-initial": OUT_OF_RANGE, "slot-range-final": OUT_OF_RANGE,
    "slot-range-checkpoint": OUT_OF_RANGE, "slot-negative": OUT_OF_RANGE,
    "offset-zero": BAD_OFFSET, "offset-at-length": BAD_OFFSET, "offset-past-length": BAD_OFFSET,
    "offset-not-increasing": BAD_OFFSET, "offset-equal": BAD_OFFSET,
}
FOURTH_BITS = {"out-of-range": OUT_OF_RANGE, "negative": OUT_OF_RANGE,
               "duplicate-final": DUPLICATE, "duplicate-checkpoint": DUPLICATE,
               "aliases-initial": DUPLICATE}


def _longest(meta: Metadata, min_active: int = 1) -> int:
    candidates = [n for n, a in enumerate(meta.actives()) if len(a) >= min_active]
    if not candidates:
        raise CannotBuild(f"no sequence of this layout holds {min_active} active checkpoint(s)")
    return max(candidates, key=lambda n: meta.lengths[n])


def _active_positions(meta: Metadata, n: int) -> list[int]:
    return [c for c, s in enumerate(meta.slots[n]) if s >= 0]


def _no_checkpoints(meta: Metadata) -> None:
    meta.slots = [[-1] * meta.capacity for _ in meta.slots]


def _fault_duplicate_final(meta, rng):
    meta.final[1] = meta.final[0]


def _fault_duplicate_final_checkpoint(meta, rng):
    n = _longest(meta)
    meta.slots[n][_active_positions(meta, n)[0]] = meta.final[n]


def _fault_duplicate_checkpoint(meta, rng):
    n = _longest(meta, 2)
    first, second = _active_positions(meta, n)[:2]
    meta.slots[n][second] = meta.slots[n][first]


def _fault_write_aliases_initial(meta, rng):
    if meta.initial[0] < 0:
        raise CannotBuild("sequence 0 has no initial slot")
    meta.final[1] = meta.initial[0]


def _fault_lengths_decreasing(meta, rng):
    _no_checkpoints(meta)
    cu = meta.cu_seqlens
    if len(cu) > 2:
        cu[1] = cu[2] + 1
    else:
        cu[1] = -1


def _fault_lengths_nonzero_start(meta, rng):
    _no_checkpoints(meta)
    meta.cu_seqlens[0] = 1


def _fault_lengths_past_capacity(meta, rng):
    _no_checkpoints(meta)
    meta.cu_seqlens[-1] += 1


def _fault_live_count_zero(meta, rng):
    meta.num_seqs = 0


def _fault_live_count_over(meta, rng):
    meta.num_seqs = len(meta.initial) + 1


def _fault_slot_range_initial(meta, rng):
    meta.initial[0] = meta.num_slots


def _fault_slot_range_final(meta, rng):
    meta.final[-1] = meta.num_slots + 7


def _fault_slot_range_checkpoint(meta, rng):
    n = _longest(meta)
    meta.slots[n][_active_positions(meta, n)[-1]] = meta.num_slots


def _fault_slot_negative(meta, rng):
    meta.final[0] = -2


def _offset_fault(kind: str):
    def mutate(meta, rng):
        n = _longest(meta, 2 if kind in ("not-increasing", "equal") else 1)
        positions = _active_positions(meta, n)
        row = meta.offsets[n]
        if kind == "zero":
            row[positions[0]] = 0
        elif kind == "at-length":
            row[positions[-1]] = meta.lengths[n]
        elif kind == "past-length":
            row[positions[-1]] = meta.lengths[n] + 5
        elif kind == "not-increasing":
            row[positions[0]], row[positions[1]] = row[positions[1]], row[positions[0]]
        else:
            row[positions[1]] = row[positions[0]]
    return mutate


FAULTS: dict[str, Callable[[Metadata, random.Random], None]] = {
    "duplicate-final": _fault_duplicate_final,
    "duplicate-final-checkpoint": _fault_duplicate_final_checkpoint,
    "duplicate-checkpoint": _fault_duplicate_checkpoint,
    "write-aliases-initial": _fault_write_aliases_initial,
    "lengths-decreasing": _fault_lengths_decreasing,
    "lengths-nonzero-start": _fault_lengths_nonzero_start,
    "lengths-past-capacity": _fault_lengths_past_capacity,
    "live-count-zero": _fault_live_count_zero,
    "live-count-over-capacity": _fault_live_count_over,
    "slot-range-initial": _fault_slot_range_initial,
    "slot-range-final": _fault_slot_range_final,
    "slot-range-checkpoint": _fault_slot_range_checkpoint,
    "slot-negative": _fault_slot_negative,
    "offset-zero": _offset_fault("zero"),
    "offset-at-length": _offset_fault("at-length"),
    "offset-past-length": _offset_fault("past-length"),
    "offset-not-increasing": _offset_fault("not-increasing"),
    "offset-equal": _offset_fault("equal"),
}
assert set(FAULTS) == set(FAULT_VARIANTS) == set(FAULT_BITS)


def _random_slot(meta: Metadata, rng: random.Random) -> None:
    """Any slot set to a value in [-3, num_slots + 2]: valid or not, the oracle decides."""
    value = rng.randint(-3, meta.num_slots + 2)
    n = rng.randrange(len(meta.initial))
    target = rng.choice(("initial", "final", "checkpoint"))
    if target == "checkpoint":
        meta.slots[n][rng.randrange(meta.capacity)] = value
    else:
        getattr(meta, target)[n] = value


def _random_offset(meta: Metadata, rng: random.Random) -> None:
    """Any checkpoint offset set to a value in [-2, len + 2]."""
    n = rng.randrange(len(meta.initial))
    meta.offsets[n][rng.randrange(meta.capacity)] = rng.randint(-2, meta.lengths[n] + 2)


def _random_lengths(meta: Metadata, rng: random.Random) -> None:
    """One cu_seqlens entry moved by 1 or 2 either way."""
    position = rng.randrange(len(meta.cu_seqlens))
    meta.cu_seqlens[position] += rng.choice((-2, -1, 1, 2))


RANDOM_MUTATIONS = {"random-slot": _random_slot, "random-offset": _random_offset,
                    "random-lengths": _random_lengths}
