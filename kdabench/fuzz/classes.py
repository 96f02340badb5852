"""The fault classes the fuzzer draws: each a way a scheduler gets the metadata wrong, with
the error bit it must raise on its own, and the smallest checkpoint capacity it needs."""

from __future__ import annotations

from dataclasses import dataclass

from kdabench.kernels.contract import MetadataFault


@dataclass(frozen=True)
class FaultClass:
    """One fault class: its name, the bit it raises alone, the capacity it needs."""

    name: str
    bit: MetadataFault
    min_capacity: int
    what: str


_DUP, _LEN = MetadataFault.DUPLICATE_WRITE_SLOT, MetadataFault.MALFORMED_LENGTHS
_RANGE, _OFF = MetadataFault.SLOT_OUT_OF_RANGE, MetadataFault.BAD_CHECKPOINT_OFFSET

FAULT_CLASSES: dict[str, FaultClass] = {c.name: c for c in (
    FaultClass("lengths-decreasing", _LEN, 1, "a cu_seqlens step goes down"),
    FaultClass("lengths-nonzero-start", _LEN, 1, "cu_seqlens[0] != 0"),
    FaultClass("lengths-past-capacity", _LEN, 1, "the live tokens end past the bound tokens"),
    FaultClass("live-count-zero", _LEN, 1, "the live sequence count is 0"),
    FaultClass("live-count-over-max", _LEN, 1, "the live count exceeds the bound rows"),
    FaultClass("initial-past-pool", _RANGE, 1, "an initial slot >= the pool's slots"),
    FaultClass("final-past-pool", _RANGE, 1, "a final slot >= the pool's slots"),
    FaultClass("checkpoint-past-pool", _RANGE, 1, "an active checkpoint slot >= the pool's slots"),
    FaultClass("initial-below-null", _RANGE, 1, "an initial slot below -1"),
    FaultClass("final-below-null", _RANGE, 1, "a final slot below -1"),
    FaultClass("checkpoint-below-null", _RANGE, 1, "a checkpoint slot below -1"),
    FaultClass("duplicate-final", _DUP, 1, "two sequences write one final slot"),
    FaultClass("checkpoint-equals-final", _DUP, 1, "a checkpoint slot is a final slot"),
    FaultClass("duplicate-checkpoint", _DUP, 1, "two active checkpoints share a slot"),
    FaultClass("final-aliases-initial", _DUP, 1,
               "a final slot is another sequence's initial slot"),
    FaultClass("checkpoint-aliases-initial", _DUP, 1,
               "a checkpoint slot is another sequence's initial slot"),
    FaultClass("offset-zero", _OFF, 1, "an active checkpoint at offset 0"),
    FaultClass("offset-at-length", _OFF, 1, "an active checkpoint at offset len"),
    FaultClass("offset-past-length", _OFF, 1, "an active checkpoint past its sequence"),
    FaultClass("offset-not-increasing", _OFF, 2, "active offsets of a sequence go down"),
    FaultClass("offset-equal", _OFF, 2, "two active offsets of a sequence are equal"),
)}

#: The order faults of one set are applied in: slot-allocating faults first, lengths next, then
#: out-of-range slots (so that no later fresh slot brings one into range), the live count last
#: (the others pick among the live sequences).
PHASES = ("duplicate", "offset", "lengths", "initial", "final", "checkpoint", "live")


def phase(name: str) -> int:
    """Where a fault class comes in the order of PHASES (by its first word)."""
    head = name.split("-")[0]
    if name in ("checkpoint-equals-final", "checkpoint-aliases-initial",
                "final-aliases-initial"):
        head = "duplicate"
    return PHASES.index(head)
