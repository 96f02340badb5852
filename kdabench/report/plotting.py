"""Plotting primitives shared by the sections: figures, PNG files, log-log axes.

Plots are drawn on :class:`matplotlib.figure.Figure` objects with the Agg canvas, never
through pyplot, so no display and no global backend state are touched.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_DPI = 120


def new_figure(width: float = 10.0, height: float = 5.6, ncols: int = 1):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    axes = figure.subplots(1, ncols, squeeze=False)[0]
    return figure, list(axes)


def save_png(figure, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    figure.savefig(path, format="png", dpi=_DPI)
    return path


def _token_label(value: float, _position: Any = None) -> str:
    """A token count for an axis: 2048 -> "2K", 65536 -> "64K", 300 -> "300"."""
    if value >= 1024 and value % 512 == 0:
        return f"{value / 1024:g}K"
    return f"{value:g}"


def log_axes(axes, xlabel: str, ylabel: str, xs: Sequence[float]) -> None:
    """Log-log axes: T on powers of two labelled "2K", time labelled as plain numbers."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    low, high = min(xs), max(xs)
    axes.set_xlim(low / 1.3, high * 1.3)
    narrow = math.log2(high / low) < 3  # fewer than three octaves: label 1.5x steps too
    axes.xaxis.set_major_locator(LogLocator(base=2, subs=(1.0, 1.5) if narrow else (1.0,)))
    axes.xaxis.set_major_formatter(FuncFormatter(_token_label))
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axes.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axes.yaxis.set_minor_formatter(NullFormatter())
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, which="major", alpha=0.4)
    axes.grid(True, which="minor", alpha=0.12)


def quartiles(samples: Sequence[float], median: float) -> tuple[float, float]:
    if len(samples) < 2:
        return 0.0, 0.0
    low, _, high = statistics.quantiles(samples, n=4)
    return max(median - low, 0.0), max(high - median, 0.0)
