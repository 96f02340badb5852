"""Host-side reference of the prefill's metadata validation: the exact error code to expect.

Plain Python over lists of ints, written from the contract (docs/DESIGN.md §2), not from the
device validator, so the two can be checked against each other. The rules, for the live
sequences n < num_seqs:

* bit 1 (2), malformed lengths: num_seqs outside 1..capacity (capacity = len(cu_seqlens) - 1;
  then nothing else is examined, there being no live set to examine), cu_seqlens[0] != 0,
  a decreasing step, or cu_seqlens[num_seqs] beyond the token capacity;
* bit 2 (4), slot out of range: an initial, final or checkpoint slot that is neither the null
  index -1 nor in [0, num_slots);
* bit 3 (8), bad checkpoint offset: an active entry (slot != -1) whose offset lies outside
  1..len_n - 1, or active offsets of one sequence not strictly increasing in entry order
  (inactive entries in between are skipped, whatever their offsets);
* bit 0 (1), duplicate or conflicting write: two write destinations (active finals and active
  checkpoints, over all live sequences) naming the same non-negative index, or a write
  destination equal to the initial slot of another sequence (a sequence's own initial slot
  may be its final or checkpoint slot).

The bits are independent: every rule is checked and each failing rule adds its bit (an
out-of-range index repeated twice sets both bit 2 and bit 0; the lengths of a decreasing
cu_seqlens are negative, so any active offset of that sequence is also bad).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

# Constants only: the rules below are written here, independently of the kernels' validators.
from kdabench.kernels.contract import NULL_SLOT, MetadataFault


def _rows(entries: Sequence, count: int) -> list[list[int]]:
    """Checkpoint metadata as one list per sequence: [N] (capacity 1) or [N, C] both accepted."""
    rows = []
    for entry in list(entries)[:count]:
        if isinstance(entry, (list, tuple)):
            rows.append([int(x) for x in entry])
        else:
            rows.append([int(entry)])
    return rows


def expected_error_code(
    cu_seqlens: Sequence[int],
    num_seqs: int,
    initial: Sequence[int],
    final: Sequence[int],
    ck_offsets: Sequence,
    ck_indices: Sequence,
    num_slots: int,
    token_capacity: int,
) -> int:
    """The error code the device validator must write for this metadata (0 = accepted).

    cu_seqlens: [M + 1] ints (M = the metadata capacity); num_seqs: the live sequence count;
    initial, final: [M] slot indices; ck_offsets, ck_indices: [M] ints (capacity 1) or [M]
    lists of C ints; num_slots: slots in the pool; token_capacity: tokens bound (q.shape[0]).
    """
    cu = [int(x) for x in cu_seqlens]
    capacity = len(cu) - 1
    if not 1 <= num_seqs <= capacity:
        return int(MetadataFault.MALFORMED_LENGTHS)
    cu = cu[: num_seqs + 1]
    lengths = [end - start for start, end in itertools.pairwise(cu)]
    initial = [int(x) for x in initial[:num_seqs]]
    final = [int(x) for x in final[:num_seqs]]
    offsets = _rows(ck_offsets, num_seqs)
    slots = _rows(ck_indices, num_seqs)

    code = 0
    if cu[0] != 0 or any(length < 0 for length in lengths) or cu[-1] > token_capacity:
        code |= MetadataFault.MALFORMED_LENGTHS

    every_slot = initial + final + [s for row in slots for s in row]
    if any(s != NULL_SLOT and not 0 <= s < num_slots for s in every_slot):
        code |= MetadataFault.SLOT_OUT_OF_RANGE

    for length, row_offsets, row_slots in zip(lengths, offsets, slots):
        active = [off for off, slot in zip(row_offsets, row_slots) if slot != NULL_SLOT]
        inside = all(1 <= off <= length - 1 for off in active)
        increasing = all(a < b for a, b in itertools.pairwise(active))
        if not (inside and increasing):
            code |= MetadataFault.BAD_CHECKPOINT_OFFSET

    writes = [(n, s) for n, s in enumerate(final) if s >= 0]
    writes += [(n, s) for n, row in enumerate(slots) for s in row if s >= 0]
    if any(count > 1 for count in Counter(s for _, s in writes).values()):
        code |= MetadataFault.DUPLICATE_WRITE_SLOT
    owners_of_initial: dict[int, set[int]] = {}
    for n, s in enumerate(initial):
        owners_of_initial.setdefault(s, set()).add(n)
    if any(owners_of_initial.get(s, set()) - {n} for n, s in writes):
        code |= MetadataFault.DUPLICATE_WRITE_SLOT
    return int(code)
