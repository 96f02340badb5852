"""One fuzz set: the metadata of one kernel call as lists of ints, and what the oracle expects.

Rows: `rows` = len(initial) metadata rows are bound (the metadata capacity); the first
`num_seqs` are live, the rest are junk the kernel must ignore. `tokens` is the bound token
count (q.shape[0]), `num_slots` the bound pool's slots. `slot_base` > 0 marks a set rebased
onto slots past the 2^31-element line of a large pool.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

from kdabench.kernels.contract import NULL_SLOT
from kdabench.oracles.metadata import expected_error_code

INDEX_DTYPE_NAMES = ("int32", "int64")


@dataclass
class FuzzSet:
    """The metadata of one call; `faults`: the fault classes applied (empty: a valid set)."""

    capacity: int
    cu_seqlens: list[int]
    num_seqs: int
    initial: list[int]
    final: list[int]
    offsets: list[list[int]]
    slots: list[list[int]]
    num_slots: int
    tokens: int
    index_dtype: str = "int32"
    faults: list[str] = field(default_factory=list)
    slot_base: int = 0

    @property
    def rows(self) -> int:
        return len(self.initial)

    @property
    def live(self) -> int:
        """Live sequences the checks read: num_seqs clipped to the bound rows."""
        return max(0, min(self.num_seqs, self.rows))

    def lengths(self) -> list[int]:
        """Lengths of the live sequences."""
        return [b - a for a, b in itertools.pairwise(self.cu_seqlens[: self.live + 1])]

    def actives(self) -> list[list[int]]:
        """Active offsets per live sequence, in entry order."""
        return [[o for o, s in zip(self.offsets[n], self.slots[n], strict=True) if s != NULL_SLOT]
                for n in range(self.live)]

    def active_entries(self) -> list[tuple[int, int, int, int]]:
        """(sequence, position among its actives, offset, slot) of each live active entry."""
        entries = []
        for n in range(self.live):
            live = [(o, s) for o, s in zip(self.offsets[n], self.slots[n], strict=True)
                    if s != NULL_SLOT]
            entries += [(n, i, o, s) for i, (o, s) in enumerate(live)]
        return entries

    def write_slots(self) -> set[int]:
        """Slots a valid call writes: live finals and active checkpoints."""
        finals = {s for s in self.final[: self.live] if s >= 0}
        return finals | {s for _, _, _, s in self.active_entries() if s >= 0}

    def expected_code(self) -> int:
        """The error code kdabench.oracles.metadata expects (0 = accepted)."""
        squeeze = self.capacity == 1
        offsets = [row[0] for row in self.offsets] if squeeze else self.offsets
        slots = [row[0] for row in self.slots] if squeeze else self.slots
        return expected_error_code(self.cu_seqlens, self.num_seqs, self.initial, self.final,
                                   offsets, slots, self.num_slots, self.tokens)

    def copy(self) -> FuzzSet:
        return FuzzSet.from_dict(self.to_dict())

    def rebased(self, base: int) -> FuzzSet:
        """The same set with every slot >= 0 (and the pool) moved up by `base` slots."""
        def move(s: int) -> int:
            return s + base if s >= 0 else s

        return dataclasses.replace(
            self.copy(), initial=[move(s) for s in self.initial],
            final=[move(s) for s in self.final],
            slots=[[move(s) for s in row] for row in self.slots],
            num_slots=self.num_slots + base, slot_base=self.slot_base + base)

    def to_dict(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "cu_seqlens": list(self.cu_seqlens),
                "num_seqs": self.num_seqs, "initial": list(self.initial),
                "final": list(self.final), "offsets": [list(r) for r in self.offsets],
                "slots": [list(r) for r in self.slots], "num_slots": self.num_slots,
                "tokens": self.tokens, "index_dtype": self.index_dtype,
                "faults": list(self.faults), "slot_base": self.slot_base}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FuzzSet:
        """Read a set back from to_dict(); raises ValueError on a malformed one."""
        try:
            made = cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a fuzz set: {exc}") from exc
        problems = made.shape_problems()
        if problems:
            raise ValueError("malformed fuzz set: " + "; ".join(problems))
        return made

    def shape_problems(self) -> list[str]:
        """What makes the lists inconsistent with each other (empty when they fit)."""
        problems = []
        m = self.rows
        if m < 1:
            problems.append("no metadata rows")
        if len(self.cu_seqlens) != m + 1 or len(self.final) != m:
            problems.append(f"cu_seqlens needs {m + 1} entries and final {m}")
        for name in ("offsets", "slots"):
            rows = getattr(self, name)
            if len(rows) != m or any(len(r) != self.capacity for r in rows):
                problems.append(f"{name} must be {m} rows of {self.capacity}")
        if self.index_dtype not in INDEX_DTYPE_NAMES:
            problems.append(f"index_dtype {self.index_dtype!r} not in {INDEX_DTYPE_NAMES}")
        if self.tokens < 1 or self.num_slots < 1:
            problems.append("tokens and num_slots must be >= 1")
        return problems
