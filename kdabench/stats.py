"""The statistics of every timing kdabench records, reports or compares: medians, seeded
percentile-bootstrap intervals (of a median, of a ratio of two medians) and the two-sided
Mann-Whitney U test.

The intervals are :func:`scipy.stats.bootstrap` with ``method="percentile"``, resampling
with replacement from a generator seeded with ``seed`` (an int or a sequence of ints, as
:func:`numpy.random.default_rng` takes), so the same samples and seed always give the same
interval. numpy and scipy are imported inside the functions, so that importing this module
(and ``kdabench --help``) stays light.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95

Seed = int | Sequence[int]


def median(samples: Sequence[float]) -> float | None:
    """The median of ``samples``; None when there are none."""
    if len(samples) == 0:
        return None
    import numpy as np

    return float(np.median(np.asarray(samples, dtype=np.float64)))


def _check(confidence: float, resamples: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")


def _percentile_bootstrap(
    samples: Sequence[Any], statistic: Callable[..., Any], *, confidence: float,
    resamples: int, seed: Seed,
) -> tuple[tuple[float, float], Any]:
    """scipy's percentile bootstrap of ``statistic`` over independent ``samples`` (each of
    two or more values): ((low, high), the bootstrap distribution)."""
    import inspect

    import numpy as np
    from scipy.stats import bootstrap

    # scipy 1.15 renamed random_state to rng; both take a numpy Generator.
    keyword = "rng" if "rng" in inspect.signature(bootstrap).parameters else "random_state"
    result = bootstrap(
        tuple(np.asarray(s, dtype=np.float64) for s in samples), statistic,
        n_resamples=resamples, vectorized=True, paired=False, confidence_level=confidence,
        method="percentile", **{keyword: np.random.default_rng(seed)},
    )
    interval = result.confidence_interval
    return (float(interval.low), float(interval.high)), result.bootstrap_distribution


def bootstrap_ci(
    samples: Sequence[float], *, confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES, seed: Seed = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the median of ``samples``, seeded.

    One sample gives the degenerate interval (x, x); none gives None. Raises ValueError
    for ``confidence`` outside (0, 1) or fewer than one resample.
    """
    _check(confidence, resamples)
    if len(samples) == 0:
        return None
    if len(samples) == 1:
        return float(samples[0]), float(samples[0])
    import numpy as np

    interval, _ = _percentile_bootstrap(
        [samples], lambda x, axis: np.median(x, axis=axis), confidence=confidence,
        resamples=resamples, seed=seed)
    return interval


def bootstrap_ratio_ci(
    base: Sequence[float], head: Sequence[float], *, confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES, seed: Seed = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of median(head) / median(base), each side resampled
    independently, seeded.

    None without samples on both sides, or when a resample of BASE has a median that is not
    positive. A side of one sample is that value in every resample; one sample on each side
    gives the degenerate interval (r, r).
    """
    _check(confidence, resamples)
    if len(base) == 0 or len(head) == 0:
        return None
    import numpy as np

    def ratio(base_medians: Any, head_medians: Any) -> Any:
        base_medians, head_medians = np.broadcast_arrays(base_medians, head_medians)
        return np.divide(head_medians, base_medians, out=np.full(base_medians.shape, np.nan),
                         where=base_medians > 0)

    constant = {name: float(side[0]) for name, side in (("base", base), ("head", head))
                if len(side) == 1}
    if len(constant) == 2:
        value = float(ratio(np.float64(constant["base"]), np.float64(constant["head"])))
        return None if math.isnan(value) else (value, value)
    resampled = [side for side in (base, head) if len(side) > 1]

    def statistic(*arrays: Any, axis: int) -> Any:
        medians = iter(np.median(a, axis=axis) for a in arrays)
        base_medians = constant["base"] if "base" in constant else next(medians)
        head_medians = constant["head"] if "head" in constant else next(medians)
        return ratio(base_medians, head_medians)

    import warnings

    from scipy.stats import DegenerateDataWarning

    with warnings.catch_warnings():  # a non-positive BASE median is answered below
        warnings.simplefilter("ignore", DegenerateDataWarning)
        interval, distribution = _percentile_bootstrap(
            resampled, statistic, confidence=confidence, resamples=resamples, seed=seed)
    if np.isnan(distribution).any():
        return None
    return interval


def mann_whitney_p(base: Sequence[float], head: Sequence[float]) -> float | None:
    """Two-sided Mann-Whitney U p-value of ``head`` against ``base``; None without samples on
    both sides. Samples that are all one value on both sides give 1.0."""
    if len(base) == 0 or len(head) == 0:
        return None
    from scipy.stats import mannwhitneyu  # half a second to import: only when a test runs

    p_value = float(mannwhitneyu(head, base, alternative="two-sided").pvalue)
    return 1.0 if math.isnan(p_value) else p_value
