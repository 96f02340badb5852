"""kdabench.stats: medians, seeded percentile-bootstrap intervals, the Mann-Whitney test."""

from __future__ import annotations

import inspect
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats

from kdabench.stats import bootstrap_ci, bootstrap_ratio_ci, mann_whitney_p, median


def reference_percentile_bootstrap(sides, statistic, *, resamples, confidence, seed):
    """The percentile bootstrap written out: each side resampled with replacement, in order,
    from one generator; the statistic of each resample; the two tail quantiles."""
    rng = np.random.default_rng(seed)
    draws = [np.asarray(side)[rng.integers(0, len(side), (resamples, len(side)))]
             for side in sides]
    values = statistic(*[np.median(d, axis=1) for d in draws])
    tail = (1 - confidence) / 2
    return tuple(float(q) for q in np.quantile(values, [tail, 1 - tail]))


# --------------------------------------------------------------------------- median


def test_median_of_odd_even_and_empty() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert median([]) is None


# --------------------------------------------------------------------------- median interval


def test_bootstrap_is_seeded_and_brackets_the_median() -> None:
    samples = [10.0, 12.0, 11.0, 30.0, 10.5, 11.5, 12.5]
    first = bootstrap_ci(samples, seed=7)
    assert first == bootstrap_ci(samples, seed=7)
    low, high = first
    assert min(samples) <= low <= median(samples) <= high <= max(samples)


def test_the_interval_is_the_percentile_bootstrap() -> None:
    samples = [float(x) for x in np.random.default_rng(3).lognormal(0.0, 0.5, 25)]
    expected = reference_percentile_bootstrap([samples], lambda m: m, resamples=2000,
                                              confidence=0.95, seed=11)
    assert bootstrap_ci(samples, seed=11) == pytest.approx(expected, rel=1e-12)


def test_a_known_case_gives_the_percentile_interval_not_the_basic_one() -> None:
    # Resamples of [1, 2, 10] have median 1 with probability 7/27, 2 with 13/27, 10 with
    # 7/27: the 5% and 95% quantiles are 1 and 10. The basic interval would be (-6, 3).
    assert bootstrap_ci([1.0, 2.0, 10.0], confidence=0.9, resamples=20000) == (1.0, 10.0)


def test_the_interval_covers_the_true_median_about_as_often_as_it_says() -> None:
    rng = np.random.default_rng(5)
    intervals = [bootstrap_ci(list(rng.normal(5.0, 1.0, 40)), seed=i) for i in range(200)]
    covered = sum(low < 5.0 < high for low, high in intervals) / len(intervals)
    assert 0.88 <= covered <= 0.99


def test_the_interval_narrows_as_the_samples_grow() -> None:
    rng = np.random.default_rng(6)
    widths = []
    for count in (20, 200, 2000):
        low, high = bootstrap_ci(list(rng.normal(5.0, 1.0, count)))
        widths.append(high - low)
    assert widths[0] > 2 * widths[1] > 4 * widths[2]


def test_bootstrap_degenerate_cases() -> None:
    assert bootstrap_ci([]) is None
    assert bootstrap_ci([5.0]) == (5.0, 5.0)
    assert bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)


@pytest.mark.parametrize("kwargs", [{"confidence": 1.0}, {"confidence": 0.0}, {"resamples": 0}])
def test_bootstrap_refuses_bad_arguments(kwargs) -> None:
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, 2.0], **kwargs)
    with pytest.raises(ValueError):
        bootstrap_ratio_ci([1.0, 2.0], [1.0, 2.0], **kwargs)


def test_scipy_before_rng_is_given_random_state(monkeypatch) -> None:
    """scipy 1.11 to 1.14 name the generator random_state: the same interval comes back."""
    real = scipy.stats.bootstrap
    assert "rng" in inspect.signature(real).parameters  # the scipy in hand is the newer one
    calls = []

    def older(data, statistic, *, n_resamples, vectorized, paired, confidence_level, method,
              random_state):
        calls.append(random_state)
        return real(data, statistic, n_resamples=n_resamples, vectorized=vectorized,
                    paired=paired, confidence_level=confidence_level, method=method,
                    rng=random_state)

    samples = [1.0, 4.0, 2.0, 8.0, 5.0, 7.0]
    expected = bootstrap_ci(samples, seed=2)
    monkeypatch.setattr(scipy.stats, "bootstrap", older)
    assert bootstrap_ci(samples, seed=2) == expected
    assert len(calls) == 1 and isinstance(calls[0], np.random.Generator)


# --------------------------------------------------------------------------- ratio interval


def test_the_ratio_interval_is_seeded_and_contains_the_ratio_of_medians() -> None:
    rng = np.random.default_rng(14)
    base, head = list(1.0 + 0.05 * rng.standard_normal(20)), list(1.5 + 0.05 *
                                                                 rng.standard_normal(17))
    first = bootstrap_ratio_ci(base, head, seed=[0, 1])
    assert first == bootstrap_ratio_ci(base, head, seed=[0, 1])
    assert first != bootstrap_ratio_ci(base, head, seed=[0, 2])
    assert first[0] < median(head) / median(base) < first[1]
    expected = reference_percentile_bootstrap([base, head], lambda b, h: h / b,
                                              resamples=2000, confidence=0.95, seed=[0, 1])
    assert first == pytest.approx(expected, rel=1e-12)


def test_ratio_interval_degenerate_cases() -> None:
    assert bootstrap_ratio_ci([], [1.0]) is None
    assert bootstrap_ratio_ci([1.0], []) is None
    assert bootstrap_ratio_ci([2.0], [3.0]) == (1.5, 1.5)
    assert bootstrap_ratio_ci([0.0], [3.0]) is None
    # a base whose resamples can have a median of zero or below has no ratio interval
    assert bootstrap_ratio_ci([-1.0, 2.0, 3.0], [2.0, 3.0, 4.0]) is None
    # one sample on a side is that value in every resample
    low, high = bootstrap_ratio_ci([2.0], [2.0, 4.0, 6.0, 8.0, 10.0], seed=4)
    assert (low, high) == pytest.approx(tuple(x / 2.0 for x in bootstrap_ci(
        [2.0, 4.0, 6.0, 8.0, 10.0], seed=4)))


# --------------------------------------------------------------------------- significance


def test_mann_whitney_handles_constant_and_missing_samples() -> None:
    assert mann_whitney_p([1.0, 1.0], [1.0, 1.0]) == 1.0
    assert mann_whitney_p([], [1.0]) is None


def test_mann_whitney_separates_shifted_samples_only() -> None:
    rng = np.random.default_rng(8)
    base = list(rng.normal(1.0, 0.05, 30))
    assert mann_whitney_p(base, list(rng.normal(1.2, 0.05, 30))) < 1e-6
    assert mann_whitney_p(base, list(rng.normal(1.0, 0.05, 30))) > 0.05


def test_importing_the_module_imports_neither_numpy_nor_scipy() -> None:
    code = ("import sys, kdabench.stats; "
            "print(sorted({'numpy', 'scipy'} & {m.split('.')[0] for m in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
