"""Medians with seeded bootstrap confidence intervals, for the sweep's raw samples.

numpy is imported where it is used, so that loading the sweep (and `kdabench --help`)
stays light.
"""

from __future__ import annotations

from collections.abc import Sequence

BOOTSTRAP_RESAMPLES = 2000


def median(samples: Sequence[float]) -> float | None:
    """The median of ``samples``; None when there are none."""
    if len(samples) == 0:
        return None
    import numpy as np

    return float(np.median(np.asarray(samples, dtype=np.float64)))


def bootstrap_ci(
    samples: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap confidence interval of the median of ``samples``.

    Draws ``resamples`` resamples with replacement from a generator seeded with ``seed``,
    so the same samples always give the same interval. One sample gives the degenerate
    interval (x, x); none gives None. ``confidence`` is in (0, 1).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    import numpy as np

    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0:
        return None
    if values.size == 1:
        return float(values[0]), float(values[0])
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, values.size, size=(resamples, values.size))
    medians = np.median(values[picks], axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(medians, [tail, 1.0 - tail])
    return float(low), float(high)


def summarize_samples(samples: Sequence[float], *, seed: int = 0) -> dict[str, object]:
    """{"n", "median", "ci95": [low, high] | None, "min", "max"} of ``samples``."""
    ci = bootstrap_ci(samples, seed=seed)
    return {
        "n": len(samples),
        "median": median(samples),
        "ci95": None if ci is None else [ci[0], ci[1]],
        "min": float(min(samples)) if len(samples) else None,
        "max": float(max(samples)) if len(samples) else None,
    }
