"""The metadata of one kernel call (slot indices, checkpoint offsets) and how valid metadata
is drawn for a case: distinct random slots, some null initial states, offsets by mode."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kdabench.oracles.metadata import expected_error_code

# "Aligned" offsets are multiples of 64 tokens: a chunk boundary for every chunk size the
# kernels use (16, 32, 64). Not imported from kdabench.kernels: importing the kernels here
# would compile them for the GPU before the CPU tier can select the interpreter.
CHUNK = 64


class CannotBuild(Exception):
    """The case's layout cannot carry what the scenario asks (e.g. no room for 4 offsets)."""


@dataclass
class Metadata:
    """Host-side metadata of one call: lists of ints, turned into tensors per call.

    offsets/slots hold C entries per sequence; slot -1 marks an inactive entry (its offset
    may be anything). num_seqs: the live count of a planned call (None: every sequence).
    """

    cu_seqlens: list[int]
    initial: list[int]
    final: list[int]
    offsets: list[list[int]]
    slots: list[list[int]]
    num_slots: int
    capacity: int
    num_seqs: int | None = None

    @property
    def lengths(self) -> list[int]:
        return [b - a for a, b in itertools.pairwise(self.cu_seqlens)]

    def actives(self) -> list[list[int]]:
        """Active offsets per sequence, in entry order (the oracle's prefix lengths)."""
        return [[o for o, s in zip(offs, slots, strict=True) if s >= 0]
                for offs, slots in zip(self.offsets, self.slots, strict=True)]

    def active_entries(self) -> list[tuple[int, int, int, int]]:
        """(sequence, position among its actives, offset, slot) of every active entry."""
        entries = []
        for n, (offs, slots) in enumerate(zip(self.offsets, self.slots, strict=True)):
            live = [(o, s) for o, s in zip(offs, slots, strict=True) if s >= 0]
            entries += [(n, i, o, s) for i, (o, s) in enumerate(live)]
        return entries

    def write_slots(self) -> set[int]:
        return {s for s in self.final if s >= 0} | {s for _, _, _, s in self.active_entries()}

    def expected_code(self, token_capacity: int) -> int:
        """The error code kdabench.oracles.metadata expects for this metadata."""
        num_seqs = len(self.initial) if self.num_seqs is None else self.num_seqs
        offsets = self.offsets if self.capacity > 1 else [row[0] for row in self.offsets]
        slots = self.slots if self.capacity > 1 else [row[0] for row in self.slots]
        return expected_error_code(self.cu_seqlens, num_seqs, self.initial, self.final,
                                   offsets, slots, self.num_slots, token_capacity)

    def tensors(self, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        def tensor(values) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        offsets, slots = tensor(self.offsets), tensor(self.slots)
        if self.capacity == 1:
            offsets, slots = offsets[:, 0].contiguous(), slots[:, 0].contiguous()
        return {"cu_seqlens": tensor(self.cu_seqlens),
                "initial_state_indices": tensor(self.initial),
                "final_state_indices": tensor(self.final),
                "checkpoint_offsets": offsets, "checkpoint_state_indices": slots}


def choose_offsets(length: int, capacity: int, mode: str, rng: random.Random) -> list[int]:
    """Up to `capacity` increasing checkpoint offsets in 1..length-1 placed as `mode` says."""
    candidates = range(1, length)
    if not candidates:
        return []
    if mode == "aligned":
        pool = [p for p in candidates if p % CHUNK == 0]
    elif mode == "unaligned":
        pool = [p for p in candidates if p % CHUNK]
    elif mode in ("first", "last"):
        forced = 1 if mode == "first" else length - 1
        rest = [p for p in candidates if p != forced]
        return sorted([forced, *rng.sample(rest, min(capacity - 1, len(rest)))])
    else:
        raise ValueError(f"unknown offsets mode {mode!r}")
    return sorted(rng.sample(pool, min(capacity, len(pool))))


def build_metadata(
    lengths: Sequence[int], capacity: int, mode: str, rng: random.Random, *,
    num_slots: int | None = None, initial_share: float = 0.75, scatter: bool = False,
) -> Metadata:
    """Valid metadata: distinct random slots, some null initial states, offsets per `mode`.

    scatter: spread the active entries among the inactive ones (keeping their order).
    """
    offsets, slots_needed = [], 0
    initial_wanted = [n == 0 or rng.random() < initial_share for n in range(len(lengths))]
    for length in lengths:
        active = choose_offsets(length, capacity, mode, rng)
        positions = sorted(rng.sample(range(capacity), len(active))) if scatter else \
            list(range(len(active)))
        row = [0] * capacity
        for position, offset in zip(positions, active, strict=True):
            row[position] = offset
        offsets.append((row, positions))
        slots_needed += len(active) + 1
    slots_needed += sum(initial_wanted)
    if num_slots is None:
        num_slots = slots_needed + 3
    if num_slots < slots_needed:
        raise CannotBuild(f"{slots_needed} slots needed, the pool has {num_slots}")
    free = iter(rng.sample(range(num_slots), slots_needed))
    initial = [next(free) if wanted else -1 for wanted in initial_wanted]
    final = [next(free) for _ in lengths]
    slot_rows = []
    for _, positions in offsets:
        row = [-1] * capacity
        for position in positions:
            row[position] = next(free)
        slot_rows.append(row)
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    return Metadata(cu, initial, final, [row for row, _ in offsets], slot_rows, num_slots,
                    capacity)
