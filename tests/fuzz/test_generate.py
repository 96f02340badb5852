"""The generator: every fault class drawn and raising its bit, valid layouts accepted by the
oracle and covering the edges, the stream fixed by its seed."""

from __future__ import annotations

import itertools
from collections import Counter

from kdabench.fuzz import CPU_LIMITS, FAULT_CLASSES, generate
from kdabench.fuzz.sets import FuzzSet
from kdabench.kernels.contract import MetadataFault

SETS = list(itertools.islice(generate(CPU_LIMITS, 11), 1500))


def test_every_fault_class_is_drawn_and_raises_its_bit_alone():
    drawn = Counter(name for s in SETS for name in s.faults)
    assert set(drawn) == set(FAULT_CLASSES)
    assert min(drawn.values()) >= 50
    for s in SETS:
        if len(s.faults) == 1:
            assert s.expected_code() & FAULT_CLASSES[s.faults[0]].bit, s
        if s.faults:
            assert s.expected_code() != 0, s


def test_every_error_bit_and_combinations_are_drawn():
    codes = [s.expected_code() for s in SETS]
    for bit in MetadataFault:
        assert any(code & bit for code in codes)
    assert any(len(s.faults) >= 2 for s in SETS)
    assert any(code.bit_count() >= 2 for code in codes)


def test_valid_sets_are_accepted_and_cover_the_layouts():
    valid = [s for s in SETS if not s.faults]
    assert valid and all(s.expected_code() == 0 for s in valid)
    lengths = [n for s in valid for n in s.lengths()]
    offsets = [(o, n) for s in valid for o, n in
               ((o, s.lengths()[n]) for n, _, o, _ in s.active_entries())]
    assert 1 in lengths and 0 in lengths and any(n < 16 for n in lengths)
    assert any(o == 1 for o, _ in offsets) and any(o == n - 1 > 1 for o, n in offsets)
    assert {s.capacity for s in valid} == {1, 2, 4}
    assert any(s.live < s.rows for s in valid)
    assert any(-1 in s.initial[: s.live] for s in valid)
    assert any(-1 in s.final[: s.live] for s in valid)
    assert any(-1 in row for s in valid if s.capacity > 1 for row in s.slots[: s.live])
    assert {s.index_dtype for s in valid} == {"int32", "int64"}


def test_the_stream_is_fixed_by_its_seed():
    again = list(itertools.islice(generate(CPU_LIMITS, 11), 200))
    other = list(itertools.islice(generate(CPU_LIMITS, 12), 200))
    assert [s.to_dict() for s in again] == [s.to_dict() for s in SETS[:200]]
    assert [s.to_dict() for s in other] != [s.to_dict() for s in SETS[:200]]


def test_a_set_survives_json_and_rebasing_keeps_its_code():
    for s in SETS[:300]:
        assert FuzzSet.from_dict(s.to_dict()) == s
        assert s.rebased(1000).expected_code() == s.expected_code()
