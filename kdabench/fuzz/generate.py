"""The seeded generator of fuzz sets: valid layouts, and faulty ones made from them.

Valid layouts cover ragged batches, sequences shorter than a chunk, of length 1 and 0, at
and around chunk edges; offsets at 1, at len - 1 and between; null initial and final slots;
a final or checkpoint slot equal to its own sequence's initial slot; sequences sharing an
initial slot; inactive checkpoint entries (their offsets junk) scattered among the active
ones; bound rows past the live count holding junk; spare tokens and slots; int32 and int64
metadata. Faulty sets take their fault classes from a shuffled deck, so every class is drawn
about equally often; a share of them carry two or three faults. The oracle, not this module,
says what each set's error code must be.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from kdabench.fuzz.classes import FAULT_CLASSES, phase
from kdabench.fuzz.mutations import MUTATIONS
from kdabench.fuzz.sets import INDEX_DTYPE_NAMES, FuzzSet
from kdabench.kernels.contract import CAPACITIES, NULL_SLOT
from kdabench.qualify.metadata import CannotBuild

EDGES = (15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129)
FRESH_SLOTS = 8  # room for the slots fault mutations add to a pool
LAYOUT_TRIES = 100


@dataclass(frozen=True)
class Limits:
    """Shape of the sets: heads, head dim, at most max_seqs rows of at most max_len tokens.

    valid_share: the share of valid sets; multi_share: of faulty sets, the share with two or
    three faults; high_share: the share of sets rebased onto slots past the 2^31-element
    line (drawn by the runner, on the GPU).
    """

    heads: int
    head_dim: int
    max_seqs: int
    max_len: int
    valid_share: float
    multi_share: float = 0.25
    high_share: float = 0.0
    spare_slots: int = 3
    spare_tokens: int = 8

    @property
    def max_tokens(self) -> int:
        return self.max_seqs * self.max_len + self.spare_tokens

    def max_slots(self, capacity: int) -> int:
        """Slots a set of this capacity can name in range (the rig's pool)."""
        return self.max_seqs * (2 + capacity) + self.spare_slots + FRESH_SLOTS

    def to_dict(self) -> dict:
        return {"heads": self.heads, "head_dim": self.head_dim, "max_seqs": self.max_seqs,
                "max_len": self.max_len, "valid_share": self.valid_share,
                "multi_share": self.multi_share, "high_share": self.high_share,
                "spare_slots": self.spare_slots, "spare_tokens": self.spare_tokens}


def _length(limits: Limits, rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.03:
        return 0
    if roll < 0.18:
        return 1
    if roll < 0.40:
        return rng.randint(2, min(15, limits.max_len))
    edges = [e for e in EDGES if e <= limits.max_len]
    if roll < 0.60 and edges:
        return rng.choice(edges)
    return rng.randint(1, limits.max_len)


def _offsets(length: int, capacity: int, rng: random.Random) -> list[int]:
    """0..capacity increasing offsets in 1..length-1, often at 1 and at length - 1."""
    room = list(range(1, length))
    count = rng.randint(0, min(capacity, len(room)))
    forced = {p for p, wanted in ((1, rng.random() < 0.4), (length - 1, rng.random() < 0.4))
              if wanted and p in room}
    chosen = set(list(forced)[:count])
    chosen |= set(rng.sample([p for p in room if p not in chosen], count - len(chosen)))
    return sorted(chosen)


def valid_set(limits: Limits, capacity: int, rng: random.Random) -> FuzzSet:
    """One valid layout of the given checkpoint capacity (see the module docstring)."""
    rows = rng.randint(1, limits.max_seqs)
    live = rows if rng.random() < 0.6 else rng.randint(1, rows)
    lengths = [_length(limits, rng) for _ in range(live)]
    if sum(lengths) == 0:
        lengths[0] = 1
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    tokens = cu[-1] + (rng.randint(1, limits.spare_tokens) if rng.random() < 0.3 else 0)

    entries = []  # per live sequence: the positions of its actives and the full offset row
    for length in lengths:
        active = _offsets(length, capacity, rng)
        positions = sorted(rng.sample(range(capacity), len(active)))
        row = [rng.randint(-3, length + 3) for _ in range(capacity)]  # inactive: junk
        for position, offset in zip(positions, active, strict=True):
            row[position] = offset
        entries.append((positions, row))

    has_initial = [rng.random() < 0.7 for _ in range(live)]
    has_final = [rng.random() < 0.85 for _ in range(live)]
    needed = sum(has_initial) + sum(has_final) + sum(len(p) for p, _ in entries)
    num_slots = needed + rng.randint(0, limits.spare_slots)
    free = iter(rng.sample(range(num_slots), needed))
    initial = [next(free) if wanted else NULL_SLOT for wanted in has_initial]
    final = [next(free) if wanted else NULL_SLOT for wanted in has_final]
    slots = []
    for positions, _ in entries:
        row = [NULL_SLOT] * capacity
        for position in positions:
            row[position] = next(free)
        slots.append(row)
    for n in range(live):  # in-place updates: a write into the sequence's own initial slot
        if initial[n] >= 0 and rng.random() < 0.15:
            final[n] = initial[n]
        elif initial[n] >= 0 and slots[n][0] >= 0 and rng.random() < 0.05:
            slots[n][0] = initial[n]
    written = set(final) | {s for row in slots for s in row}
    readable = [s for s in initial if s >= 0 and s not in written]
    if live > 1 and readable and rng.random() < 0.1:  # two sequences read one initial slot
        n = rng.randrange(live)
        if initial[n] not in final and initial[n] not in slots[n]:
            initial[n] = rng.choice(readable)

    def junk_slot() -> int:
        return rng.randint(-3, num_slots + 3)

    for _ in range(rows - live):  # bound rows past the live count: junk the kernel ignores
        cu.append(rng.randint(-5, tokens + 5))
        initial.append(junk_slot())
        final.append(junk_slot())
        entries.append(([], [rng.randint(-3, 40) for _ in range(capacity)]))
        slots.append([junk_slot() for _ in range(capacity)])
    return FuzzSet(capacity=capacity, cu_seqlens=cu, num_seqs=live, initial=initial,
                   final=final, offsets=[row for _, row in entries], slots=slots,
                   num_slots=max(num_slots, 1), tokens=max(tokens, 1),
                   index_dtype=rng.choice(INDEX_DTYPE_NAMES))


def faulty_set(limits: Limits, names: list[str], rng: random.Random) -> FuzzSet:
    """A set carrying the fault classes `names` (the first must apply; others where they can)."""
    primary = names[0]
    needs = max(FAULT_CLASSES[name].min_capacity for name in names)
    capacities = [c for c in CAPACITIES if c >= needs]
    for _ in range(LAYOUT_TRIES):
        fset = valid_set(limits, rng.choice(capacities), rng)
        applied = []
        for name in sorted(names, key=phase):
            try:
                MUTATIONS[name](fset, rng)
            except CannotBuild:
                if name == primary:
                    break
                continue
            applied.append(name)
        if primary in applied:
            fset.faults = applied
            return fset
    raise RuntimeError(f"no layout of {limits} carries fault {primary!r}")


def generate(limits: Limits, seed: int) -> Iterator[FuzzSet]:
    """An endless, seed-determined stream of valid and faulty sets."""
    rng = random.Random(seed)
    deck: list[str] = []
    while True:
        if rng.random() < limits.valid_share:
            yield valid_set(limits, rng.choice(CAPACITIES), rng)
            continue
        if not deck:
            deck = sorted(FAULT_CLASSES)
            rng.shuffle(deck)
        names = [deck.pop()]
        if rng.random() < limits.multi_share:
            others = [name for name in FAULT_CLASSES if name != names[0]]
            names += rng.sample(others, rng.choice((1, 1, 2)))
        yield faulty_set(limits, names, rng)
