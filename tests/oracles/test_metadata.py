"""The metadata oracle (`expected_error_code`) on its own, in plain Python: each rule at its
boundaries (the last valid value and the first invalid one), the bits adding up independently,
the entries past the live count ignored, and the two checkpoint layouts read alike.

tests/kernels/test_validation_interp.py checks the device validator against this oracle; the
cases here pin the oracle itself to the contract (docs/DESIGN.md §2), so that a change in it
cannot pass unnoticed by moving the device's expectation along with it.
"""

from __future__ import annotations

import pytest

from kdabench.kernels.contract import MetadataFault
from kdabench.oracles import expected_error_code

DUP = int(MetadataFault.DUPLICATE_WRITE_SLOT)
LENGTHS = int(MetadataFault.MALFORMED_LENGTHS)
RANGE = int(MetadataFault.SLOT_OUT_OF_RANGE)
OFFSET = int(MetadataFault.BAD_CHECKPOINT_OFFSET)
SLOTS = 16
TOKENS = 42


def valid() -> dict:
    """Three sequences (lengths 20, 17, 5), capacity 2: initial slots 0-2, finals 3-5,
    checkpoints 6-8 and one inactive entry."""
    return {"cu_seqlens": [0, 20, 37, 42], "num_seqs": 3, "initial": [0, 1, 2],
            "final": [3, 4, 5], "ck_offsets": [[1, 19], [8, 16], [4, 0]],
            "ck_indices": [[6, 7], [8, -1], [9, -1]], "num_slots": SLOTS,
            "token_capacity": TOKENS}


def code(**changes) -> int:
    """The oracle's code for the valid set with `changes` applied."""
    return expected_error_code(**{**valid(), **changes})


def with_entry(key: str, row: int, column: int | None, value: int) -> dict:
    """{key: the valid set's entries with [row] (or [row][column]) set to value}."""
    entries = [list(e) if isinstance(e, list) else e for e in valid()[key]]
    if column is None:
        entries[row] = value
    else:
        entries[row][column] = value
    return {key: entries}


def test_the_valid_set_is_accepted():
    assert code() == 0


# ---- bit 1: malformed lengths -----------------------------------------------------------------


@pytest.mark.parametrize("num_seqs, expected", [
    (0, LENGTHS), (-1, LENGTHS), (4, LENGTHS), (1, 0), (2, 0), (3, 0),
])
def test_live_count_must_lie_in_one_to_capacity(num_seqs, expected):
    assert code(num_seqs=num_seqs) == expected


def test_a_live_count_outside_capacity_examines_nothing_else():
    """Slots, offsets and lengths are all wrong too, yet only the lengths bit is set."""
    bad = {"cu_seqlens": [5, 1, 99, 0], "initial": [-7, 99, 3], "final": [3, 3, 3],
           "ck_offsets": [[0, 0]] * 3, "ck_indices": [[3, 99]] * 3}
    assert code(num_seqs=0, **bad) == LENGTHS
    assert code(num_seqs=4, **bad) == LENGTHS


@pytest.mark.parametrize("cu_seqlens, token_capacity, expected", [
    ([1, 20, 37, 42], TOKENS, LENGTHS),  # not starting at 0
    ([-1, 20, 37, 42], TOKENS, LENGTHS),
    ([0, 20, 37, 42], TOKENS - 1, LENGTHS),  # one token past the bound
    ([0, 20, 37, 42], TOKENS, 0),  # ending exactly at the bound
    ([0, 20, 20, 25], TOKENS, 0),  # an empty sequence is no decrease
])
def test_cu_seqlens_start_and_end(cu_seqlens, token_capacity, expected):
    changes = {"ck_indices": [[-1, -1]] * 3}  # no checkpoint to judge against the lengths
    assert code(cu_seqlens=cu_seqlens, token_capacity=token_capacity, **changes) == expected


@pytest.mark.parametrize("cu_seqlens", [[0, 20, 19, 42], [0, 20, 37, 36]],
                         ids=["middle", "last"])
def test_a_decreasing_step(cu_seqlens):
    assert code(cu_seqlens=cu_seqlens, ck_indices=[[-1, -1]] * 3) == LENGTHS


def test_a_decreasing_step_with_an_active_checkpoint_sets_the_offset_bit_too():
    """Sequence 1 has length -1: no offset of it lies in 1..len - 1."""
    assert code(cu_seqlens=[0, 20, 19, 42]) == LENGTHS | OFFSET


def test_entries_past_the_live_count_are_not_examined():
    """Sequence 2 is dead: its decreasing end, its token count past the bound, its slots and
    offsets are never looked at."""
    dead = {"cu_seqlens": [0, 20, 37, 99], "initial": [0, 1, -9], "final": [3, 4, 3],
            "ck_offsets": [[1, 19], [8, 16], [0, 0]], "ck_indices": [[6, 7], [8, -1], [99, 6]]}
    assert code(num_seqs=2, **dead) == 0
    # the control: the live sequences' end past the bound is seen
    assert code(num_seqs=2, **{**dead, "cu_seqlens": [0, 20, TOKENS + 1, 5]}) == LENGTHS


# ---- bit 2: slot out of range -----------------------------------------------------------------


@pytest.mark.parametrize("key, column", [("initial", None), ("final", None), ("ck_indices", 0)])
@pytest.mark.parametrize("value, expected", [
    (-2, RANGE), (-1, 0), (0, 0), (SLOTS - 1, 0), (SLOTS, RANGE), (10**12, RANGE),
])
def test_slot_range(key, column, value, expected):
    """Each kind of slot of sequence 2: the null index and 0..num_slots - 1 pass, nothing else
    (sequence 0 reads no slot here, so that slots 0 and num_slots - 1 are both spare)."""
    meta = valid()
    meta["initial"][0] = -1
    if column is None:
        meta[key][2] = value
    else:
        meta[key][2][column] = value
    assert expected_error_code(**meta) == expected


def test_an_out_of_range_slot_written_twice_sets_both_bits():
    assert code(final=[3, SLOTS, SLOTS]) == RANGE | DUP


# Mutation testing (.ci/mutation): `not 0 <= s < num_slots` in the range rule survives as
# `not -1 <= s < num_slots`, an equivalent mutant: the rule reads s only after `s != NULL_SLOT`,
# and -1 is the only int on which the two bounds differ.
def test_a_negative_slot_written_twice_is_out_of_range_only():
    """Only non-negative indices are write destinations: -2 twice is no duplicate."""
    assert code(final=[3, -2, -2]) == RANGE


# ---- bit 3: bad checkpoint offsets ------------------------------------------------------------


@pytest.mark.parametrize("offset, expected", [
    (-1, OFFSET), (0, OFFSET), (1, 0), (4, 0), (5, OFFSET), (6, OFFSET),
])
def test_offset_inside_one_to_length_minus_one(offset, expected):
    """Sequence 2 has 5 tokens: its only active offset may be 1..4."""
    assert code(**with_entry("ck_offsets", 2, 0, offset)) == expected


@pytest.mark.parametrize("second, expected", [(19, 0), (2, 0), (1, OFFSET), (0, OFFSET)])
def test_active_offsets_strictly_increasing(second, expected):
    """Sequence 0: offsets [1, second]."""
    assert code(**with_entry("ck_offsets", 0, 1, second)) == expected


@pytest.mark.parametrize("offset, expected", [(0, RANGE | OFFSET), (1, RANGE)])
def test_only_the_null_index_makes_a_checkpoint_inactive(offset, expected):
    """Sequence 2's checkpoint in slot -2: out of range, and still active, so its offset is
    judged (as the device validator does: active = slot != -1)."""
    changes = {**with_entry("ck_indices", 2, 0, -2), **with_entry("ck_offsets", 2, 0, offset)}
    assert code(**changes) == expected


def test_inactive_entries_are_skipped_whatever_their_offsets():
    """Capacity 4: [5, x, 3, 9] with x inactive; then the inactive entry between two active ones
    does not break the order, and only the active ones count as increasing."""
    meta = {"ck_offsets": [[5, 0, 7, 19], [8, 99, 99, 99], [4, -3, -3, -3]],
            "ck_indices": [[6, -1, 7, 10], [8, -1, -1, -1], [9, -1, -1, -1]]}
    assert code(**meta) == 0
    meta["ck_offsets"][0][2] = 5  # equal to the active one before the gap
    assert code(**meta) == OFFSET
    meta["ck_offsets"][0][2] = 4  # below it
    assert code(**meta) == OFFSET


def test_an_offset_fault_in_any_sequence_sets_the_bit():
    """Two sequences with bad offsets (the bit is set once, not toggled per sequence)."""
    bad = {"ck_offsets": [[0, 19], [8, 17], [4, 0]]}
    assert code(**bad) == OFFSET
    assert code(ck_offsets=[[1, 19], [8, 16], [5, 0]]) == OFFSET  # the last sequence alone


# ---- bit 0: duplicate or conflicting writes ---------------------------------------------------


@pytest.mark.parametrize("changes", [
    {"final": [3, 3, 5]},
    {"final": [0, 1, 0]},  # slot 0: a final twice, also sequence 0's own initial slot
    {"ck_indices": [[6, 7], [8, -1], [3, -1]]},  # a checkpoint on another sequence's final
    {"ck_indices": [[6, 3], [8, -1], [9, -1]]},  # a checkpoint on its own sequence's final
    {"ck_indices": [[6, 6], [8, -1], [9, -1]]},  # two checkpoints of one sequence
    {"ck_indices": [[6, 7], [6, -1], [9, -1]]},  # checkpoints of two sequences
], ids=["final-final", "final-final-slot0", "checkpoint-other-final", "checkpoint-own-final",
        "checkpoints-one-sequence", "checkpoints-two-sequences"])
def test_a_slot_written_twice(changes):
    assert code(**changes) == DUP


@pytest.mark.parametrize("changes, expected", [
    ({"final": [3, 0, 5]}, DUP),  # sequence 1 writes sequence 0's initial slot
    ({"ck_indices": [[6, 2], [8, -1], [9, -1]]}, DUP),  # a checkpoint on sequence 2's initial
    ({"ck_indices": [[6, 7], [0, -1], [9, -1]]}, DUP),  # ... on slot 0, sequence 0's initial
    ({"final": [0, 1, 2]}, 0),  # each sequence writes its own initial slot
    ({"ck_indices": [[0, 7], [8, -1], [9, -1]]}, 0),  # a checkpoint on its own initial slot
    ({"initial": [0, 0, 2]}, 0),  # two sequences read one slot: no write, no conflict
    ({"initial": [0, 0, 2], "final": [0, 4, 5]}, DUP),  # ... which one of them then writes
    ({"initial": [-1, -1, 2], "final": [3, 4, 5]}, 0),  # null initial slots alias nothing
], ids=["final-on-other-initial", "checkpoint-on-other-initial",
        "checkpoint-on-other-initial-slot0", "final-on-own-initial",
        "checkpoint-on-own-initial", "shared-initial-read", "shared-initial-written",
        "null-initials"])
def test_a_write_on_an_initial_slot(changes, expected):
    assert code(**changes) == expected


# Mutation testing (.ci/mutation): `count > 1` in the duplicate rule survives as `count != 1`,
# an equivalent mutant: a Counter holds only counts of at least 1.
def test_null_write_slots_are_no_duplicates():
    assert code(final=[-1, -1, -1], ck_indices=[[-1, -1]] * 3) == 0


def test_both_duplicate_rules_at_once_set_the_bit():
    """A slot written twice and a write on another's initial slot: the bit stays set."""
    assert code(final=[3, 3, 0]) == DUP


# ---- the bits add up; the two checkpoint layouts ----------------------------------------------


def test_every_rule_adds_its_own_bit():
    every = {"cu_seqlens": [1, 20, 37, 42], "final": [3, 3, SLOTS],
             "ck_offsets": [[0, 19], [8, 16], [4, 0]]}
    assert code(**every) == DUP | LENGTHS | RANGE | OFFSET


def test_vector_metadata_reads_as_capacity_one():
    """Capacity 1 as [N] ints and as [N, 1] lists: the same codes."""
    for offsets, slots, expected in [([1, 8, 4], [6, 7, 8], 0), ([1, 0, 4], [6, 7, 8], OFFSET),
                                     ([1, 8, 4], [6, 6, 8], DUP), ([1, 8, 4], [6, SLOTS, 8],
                                                                   RANGE),
                                     ([1, 0, 4], [6, -1, 8], 0)]:
        vector = code(ck_offsets=offsets, ck_indices=slots)
        matrix = code(ck_offsets=[[o] for o in offsets], ck_indices=[[s] for s in slots])
        assert vector == matrix == expected, (offsets, slots)


def test_tuples_read_as_lists():
    assert code(ck_offsets=[(1, 19), (8, 16), (4, 0)], ck_indices=[(6, 7), (8, -1), (9, -1)]) == 0
    assert code(ck_offsets=[(1, 1), (8, 16), (4, 0)], ck_indices=[(6, 7), (8, -1), (9, -1)]) \
        == OFFSET
