"""Medians and seeded bootstrap intervals of kdabench.sweep.stats."""

from __future__ import annotations

import pytest

from kdabench.sweep.stats import bootstrap_ci, median, summarize_samples


def test_median_of_odd_even_and_empty() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert median([]) is None


def test_bootstrap_is_seeded_and_brackets_the_median() -> None:
    samples = [10.0, 12.0, 11.0, 30.0, 10.5, 11.5, 12.5]
    first = bootstrap_ci(samples, seed=7)
    assert first == bootstrap_ci(samples, seed=7)
    low, high = first
    assert min(samples) <= low <= median(samples) <= high <= max(samples)


def test_bootstrap_degenerate_cases() -> None:
    assert bootstrap_ci([]) is None
    assert bootstrap_ci([5.0]) == (5.0, 5.0)
    assert bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)


@pytest.mark.parametrize("kwargs", [{"confidence": 1.0}, {"confidence": 0.0}, {"resamples": 0}])
def test_bootstrap_refuses_bad_arguments(kwargs) -> None:
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, 2.0], **kwargs)


def test_summarize_samples_fields() -> None:
    summary = summarize_samples([1.0, 2.0, 3.0], seed=1)
    assert summary["n"] == 3 and summary["median"] == 2.0
    assert summary["min"] == 1.0 and summary["max"] == 3.0
    assert len(summary["ci95"]) == 2
    assert summarize_samples([])["ci95"] is None
