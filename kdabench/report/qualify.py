"""The section of a qualify receipt (written by :mod:`kdabench.qualify`).

Fields read: ``scenario``, ``params`` (the matrix axes: capacity, heads, head_dim, layout,
offsets, gate, ...), ``errors`` (``output``; the state errors ``final_state``,
``checkpoint``, ``prefix_unaligned``), ``tolerances`` (``output``, ``state``),
``shape.tokens`` (or ``shape.max_tokens`` for graph cases) as T, ``median_ms``,
``samples_ms``, ``message``. Rendered: a summary by scenario and by axis, every case with its
verdict and errors, and a plot of median kernel time against T per head count for the
``accuracy`` cases.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdabench import stats
from kdabench.receipts import LoadedReceipt
from kdabench.report.fields import finite_numbers, get_field, to_number, worst
from kdabench.report.markdown import (
    device_name,
    fmt_case_id,
    fmt_count,
    fmt_err,
    fmt_ms,
    fmt_verdict,
    md_table,
)
from kdabench.report.plotting import log_axes, new_figure, quartiles, save_png

STATE_ERRORS = ("final_state", "checkpoint", "prefix_unaligned")
AXIS_SKIP = frozenset({"seed", "variant"})  # not axes worth a summary row


def _state_error(case: Mapping[str, Any]) -> float | None:
    errors = case.get("errors") if isinstance(case.get("errors"), dict) else {}
    return worst(to_number(errors.get(name)) for name in STATE_ERRORS)


def _output_error(case: Mapping[str, Any]) -> float | None:
    return to_number(get_field(case, "errors.output"))


def _tolerance(case: Mapping[str, Any], name: str) -> float | None:
    return to_number(get_field(case, f"tolerances.{name}"))


def _tokens(case: Mapping[str, Any]) -> float | None:
    return to_number(get_field(case, "shape.tokens", "shape.max_tokens", "T", "tokens"))


@dataclass
class _Tally:
    cases: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    output: list[tuple[float, float | None]] = field(default_factory=list)
    state: list[tuple[float, float | None]] = field(default_factory=list)
    medians: list[float] = field(default_factory=list)

    def add(self, case: Mapping[str, Any]) -> None:
        self.cases += 1
        verdict = str(case.get("verdict"))
        self.verdicts[verdict] = self.verdicts.get(verdict, 0) + 1
        for errors, value, tolerance in (
            (self.output, _output_error(case), _tolerance(case, "output")),
            (self.state, _state_error(case), _tolerance(case, "state")),
        ):
            if value is not None:
                errors.append((value, tolerance))
        median = to_number(case.get("median_ms"))
        if median is not None and math.isfinite(median):
            self.medians.append(median)

    @staticmethod
    def _worst_of(errors: list[tuple[float, float | None]]) -> str:
        """The error nearest its tolerance (largest share), as "err (share%)"."""
        if not errors:
            return "-"

        def share(item: tuple[float, float | None]) -> float:
            value, tolerance = item
            if math.isnan(value):
                return math.inf
            return value / tolerance if tolerance else value

        value, tolerance = max(errors, key=share)
        return fmt_err(value, tolerance)

    def row(self, *label: Any) -> list[Any]:
        counts = [self.verdicts.get(v, 0) for v in ("pass", "fail", "error", "skip")]
        median = stats.median(self.medians)
        return [*label, self.cases, *counts, self._worst_of(self.output),
                self._worst_of(self.state), fmt_ms(median)]


_TALLY_HEADERS = ["cases", "pass", "fail", "error", "skip", "worst output error (% of tol)",
                  "worst state error (% of tol)", "median of medians (ms)"]


def qualify_by_scenario(cases: Sequence[Mapping[str, Any]]) -> dict[str, _Tally]:
    table: dict[str, _Tally] = {}
    for case in cases:
        table.setdefault(str(case.get("scenario", "-")), _Tally()).add(case)
    return table


def qualify_by_axis(cases: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], _Tally]:
    """Per (axis, value) of every matrix axis that takes more than one value."""
    values: dict[str, set[str]] = {}
    for case in cases:
        for axis, value in (case.get("params") or {}).items():
            if axis not in AXIS_SKIP:
                values.setdefault(axis, set()).add(str(value))
    axes = [axis for axis, seen in values.items() if len(seen) > 1]
    table: dict[tuple[str, str], _Tally] = {}
    for axis in axes:
        for case in cases:
            params = case.get("params") or {}
            if axis in params:
                table.setdefault((axis, str(params[axis])), _Tally()).add(case)

    def order(key: tuple[str, str]) -> tuple[int, float, list[Any]]:
        axis, value = key
        number = to_number(_try_float(value))
        return (axes.index(axis), number if number is not None else math.inf,
                _natural_key(value))

    return dict(sorted(table.items(), key=lambda item: order(item[0])))


def _try_float(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def _natural_key(text: str) -> list[Any]:
    """Sort key that orders "L2048x1" before "L16384x1" (digit runs compare as numbers)."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", text) if part]


_CAPACITY_MARKERS = {1: "o", 2: "s", 4: "^"}


def plot_qualify_times(cases: Sequence[Mapping[str, Any]], path: Path, device: str) -> bool:
    """Median kernel time against T per head count (one panel per head_dim, marker per
    capacity); False when no accuracy case is timed (the CPU tier)."""
    from matplotlib.lines import Line2D

    points: dict[tuple[int, int], list[tuple[float, float, tuple[float, float], int]]] = {}
    for case in cases:
        if case.get("scenario") != "accuracy":
            continue
        tokens, median = _tokens(case), to_number(case.get("median_ms"))
        if tokens is None or median is None or not math.isfinite(median) or median <= 0:
            continue
        heads = int(to_number(get_field(case, "params.heads", "shape.heads")) or 0)
        head_dim = int(to_number(get_field(case, "params.head_dim")) or 0)
        capacity = int(to_number(get_field(case, "params.capacity")) or 0)
        spread = quartiles(finite_numbers(case.get("samples_ms")), median)
        points.setdefault((head_dim, heads), []).append((tokens, median, spread, capacity))
    if not points:
        return False
    head_dims = sorted({head_dim for head_dim, _ in points})
    all_heads = sorted({heads for _, heads in points})
    capacities = sorted({p[3] for series in points.values() for p in series})
    figure, panels = new_figure(6.5 * len(head_dims) if len(head_dims) > 1 else 10.0, 6.0,
                                ncols=len(head_dims))
    colors = {h: f"C{i % 10}" for i, h in enumerate(all_heads)}
    # Cases of one T and several head counts would hide each other: spread them a little.
    dodge = {h: 2 ** (0.025 * (i - (len(all_heads) - 1) / 2)) for i, h in enumerate(all_heads)}
    for panel, head_dim in zip(panels, head_dims, strict=True):
        xs_all = []
        for heads in all_heads:
            series = sorted(points.get((head_dim, heads), []))
            if not series:
                continue
            for tokens, median, spread, capacity in series:
                panel.errorbar([tokens * dodge[heads]], [median],
                               yerr=[[spread[0]], [spread[1]]], color=colors[heads],
                               marker=_CAPACITY_MARKERS.get(capacity, "D"), markersize=5,
                               alpha=0.7, capsize=2, elinewidth=0.8, linestyle="none")
            by_tokens: dict[float, list[float]] = {}
            for tokens, median, _, _ in series:
                by_tokens.setdefault(tokens, []).append(median)
            line_x = sorted(by_tokens)
            xs_all += line_x
            panel.plot([t * dodge[heads] for t in line_x],
                       [stats.median(by_tokens[t]) for t in line_x], "-",
                       color=colors[heads], linewidth=1.4)
        log_axes(panel, "total tokens T (log scale)", "median kernel time (ms, log scale)",
                 xs_all)
        panel.set_title(f"head dim K = V = {head_dim}" if head_dim else "head dim unknown")
        handles = [Line2D([], [], color=colors[h], label=f"H = {h}") for h in all_heads
                   if points.get((head_dim, h))]
        handles += [Line2D([], [], color="0.3", linestyle="none",
                           marker=_CAPACITY_MARKERS.get(c, "D"), label=f"capacity {c}")
                    for c in capacities]
        panel.legend(handles=handles, fontsize="small", loc="upper left")
    figure.suptitle(f"KDA prefill kernel time against T, accuracy cases · {device}\n"
                    "lines: median per T and head count; bars: interquartile range of "
                    "each case's samples")
    save_png(figure, path)
    return True


def qualify_section(receipt: LoadedReceipt, plot_path: Path) -> tuple[list[str], list[Path]]:
    cases = receipt.cases
    config = receipt.doc.get("config") if isinstance(receipt.doc.get("config"), dict) else {}
    lines = []
    facts = [f"{key} `{config[key]}`" for key in ("tier", "backend", "matrix_name")
             if config.get(key) is not None]
    if isinstance(config.get("matrix_sha256"), str):
        facts.append(f"matrix sha256 `{config['matrix_sha256'][:12]}`")
    if isinstance(config.get("timing"), dict):
        facts.append("timing " + ", ".join(f"{k} {v}" for k, v in config["timing"].items()))
    if facts:
        lines += ["Configuration: " + " · ".join(facts) + ".", ""]

    lines += ["#### Summary by scenario", "",
              md_table(["scenario", *_TALLY_HEADERS],
                       [tally.row(name) for name, tally in qualify_by_scenario(cases).items()]),
              ""]
    by_axis = qualify_by_axis(cases)
    if by_axis:
        lines += ["#### Summary by axis", "",
                  ("Every matrix axis that takes more than one value; a case counts once per "
                  "axis."), "",
                  md_table(["axis", "value", *_TALLY_HEADERS],
                           [tally.row(axis, value) for (axis, value), tally in by_axis.items()]),
                  ""]

    plots = []
    lines += ["#### Kernel time against T", ""]
    if plot_qualify_times(cases, plot_path, device_name(receipt.doc)):
        plots.append(plot_path)
        lines += [f"![kernel time against T]({plot_path.name})", ""]
    else:
        lines += ["No timed accuracy case in this receipt (the CPU tier does not time).", ""]

    lines += ["#### Cases", "",
              ("Errors are relative Frobenius errors against the float64 oracle, with their "
              "share of the case's tolerance; the state error is the worst of the final "
              "state, checkpoint and unaligned-prefix errors."), "",
              md_table(["#", "case", "scenario", "verdict", "T", "output error",
                        "state error", "median (ms)", "message"],
                       [[i + 1, fmt_case_id(case), case.get("scenario"),
                         fmt_verdict(case.get("verdict")), fmt_count(_tokens(case)),
                         fmt_err(_output_error(case), _tolerance(case, "output")),
                         fmt_err(_state_error(case), _tolerance(case, "state")),
                         fmt_ms(to_number(case.get("median_ms"))), case.get("message")]
                        for i, case in enumerate(cases)]),
              ""]
    return lines, plots
