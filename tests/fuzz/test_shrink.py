"""The shrinker, with predicates that need no kernel."""

from __future__ import annotations

import itertools

from kdabench.fuzz import CPU_LIMITS, generate, shrink
from kdabench.fuzz.shrink import _compact, candidates
from kdabench.kernels.contract import MetadataFault

DUP = MetadataFault.DUPLICATE_WRITE_SLOT


def test_a_duplicate_write_shrinks_to_at_most_two_short_sequences():
    sets = [s for s in itertools.islice(generate(CPU_LIMITS, 5), 400)
            if s.expected_code() & DUP and s.rows >= 3]
    assert sets
    for fset in sets[:5]:
        small, tries = shrink(fset, lambda c: bool(c.expected_code() & DUP))
        assert small.expected_code() & DUP
        assert small.rows <= 2 and tries > 0
        assert all(n <= 1 for n in small.lengths())
        assert small.num_slots <= 2


def test_shrinking_keeps_a_set_that_nothing_smaller_fails():
    fset = next(iter(generate(CPU_LIMITS, 1)))
    small, _ = shrink(fset, lambda c: c == fset)
    assert small == fset


def test_compaction_keeps_the_expected_code():
    for s in itertools.islice(generate(CPU_LIMITS, 9), 300):
        for c in candidates(s):
            assert not c.shape_problems()
        compact = _compact(s)
        assert compact.num_slots <= s.num_slots
        assert compact.expected_code() == s.expected_code()
