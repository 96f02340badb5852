"""The section of a bench receipt (written by ``kdabench bench``; read defensively, as older
receipts lack fields).

Fields read: one case per kernel and shape: ``kernel`` ("kdabench", "fla", ...; default
"kdabench"), ``median_ms``, ``samples_ms``; or one case per shape with per-kernel medians,
either ``kernels`` = {name: {"median_ms": ms, "samples_ms": [...]} or ms} or ``median_ms`` =
{name: ms}. Shape: ``T`` (or ``tokens``, ``shape.T``, ``shape.tokens``), ``H`` (or
``heads``, ``shape.H``, ``shape.heads``, ``params.heads``), ``seqs`` (or ``num_seqs``,
``shape.seqs``, ``shape.num_seqs``), ``shape`` as a label ("8192x8x1") or
``shape.label``; optional ``floor_ms`` (or ``floor.ms``), the time the shape's bytes
and FLOPs need at the measured rates; optional ``primary_mode`` (the mode ``kernels``
holds), ``export_overhead`` = {mode: fraction} and ``breakdown`` = {kernel: {"gpu_us",
"kernels_us"}} (``kdabench bench --breakdown``). Rendered: a table per shape (medians,
fla/kdabench, distance to the floor, export overhead), a plot of time against T per kernel,
with the floor, and where each kernel's GPU time goes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdabench import stats
from kdabench.receipts import LoadedReceipt
from kdabench.report.breakdown import breakdown_line
from kdabench.report.fields import finite_numbers, get_field, to_number
from kdabench.report.markdown import (
    device_name,
    fmt_case_id,
    fmt_count,
    fmt_ms,
    fmt_verdict,
    md_table,
)
from kdabench.report.plotting import log_axes, new_figure, quartiles, save_png

KERNEL_ORDER = ("kdabench", "fla")
MODE_NAMES = {"graph": "CUDA-graph replay", "eager": "eager calls"}


@dataclass
class BenchPoint:
    """One kernel's time at one shape of a bench receipt."""

    case_id: str
    kernel: str
    shape: str
    tokens: float | None
    heads: float | None
    seqs: Any
    median_ms: float | None
    samples: list[float]
    floor_ms: float | None
    gates: str | None = None  # the gate regime the case drew (a receipt without: None)


def bench_points(case: Mapping[str, Any]) -> list[BenchPoint]:
    """The (kernel, time) points of one bench case, in either layout the docstring names."""
    tokens = to_number(get_field(case, "T", "tokens", "shape.T", "shape.tokens"))
    heads = to_number(get_field(case, "H", "heads", "shape.H", "shape.heads", "params.heads"))
    seqs = get_field(case, "seqs", "num_seqs", "shape.seqs", "shape.num_seqs")
    label = get_field(case, "shape.label", "shape_label")
    if isinstance(case.get("shape"), str):
        label = case["shape"]
    if label is None:
        parts = [fmt_count(tokens), fmt_count(heads), "-" if seqs is None else str(seqs)]
        label = "x".join(parts)
    floor = to_number(get_field(case, "floor_ms", "floor.ms"))
    gates = get_field(case, "gates.name")
    per_kernel: dict[str, Any] = {}
    if isinstance(case.get("kernels"), Mapping):
        per_kernel = dict(case["kernels"])
    elif isinstance(case.get("median_ms"), Mapping):
        per_kernel = dict(case["median_ms"])
    else:
        per_kernel = {str(case.get("kernel") or "kdabench"): case}
    points = []
    for kernel, entry in per_kernel.items():
        if isinstance(entry, Mapping):
            median = to_number(entry.get("median_ms"))
            samples = finite_numbers(entry.get("samples_ms"))
        else:
            median, samples = to_number(entry), []
        if median is None and samples:
            median = stats.median(samples)
        points.append(BenchPoint(str(case.get("id")), str(kernel), str(label), tokens, heads,
                                 seqs, median, samples, floor,
                                 None if gates is None else str(gates)))
    return points


def _kernel_order(kernels: Iterable[str]) -> list[str]:
    names = set(kernels)
    return [k for k in KERNEL_ORDER if k in names] + sorted(names - set(KERNEL_ORDER))


_HEAD_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def plot_bench(points: Sequence[BenchPoint], path: Path, device: str) -> bool:
    """Time against T: colour per kernel, marker per head count, a line per (kernel, heads,
    sequences), the floor in black, and fla/kdabench beside each kdabench point. False when
    no point has both T and a time."""
    from matplotlib.lines import Line2D

    usable = [p for p in points if p.tokens and p.median_ms and math.isfinite(p.median_ms)]
    if not usable:
        return False
    figure, (panel,) = new_figure(11.5, 6.2)
    kernels = _kernel_order(p.kernel for p in usable)
    colors = {k: f"C{i % 10}" for i, k in enumerate(kernels)}
    head_counts = sorted({p.heads for p in usable}, key=lambda h: (h is None, h or 0))
    markers = {h: _HEAD_MARKERS[i % len(_HEAD_MARKERS)] for i, h in enumerate(head_counts)}
    series: dict[tuple[str, Any, str], list[BenchPoint]] = {}
    for point in usable:
        series.setdefault((point.kernel, point.heads, str(point.seqs)), []).append(point)
    for (kernel, heads, _), members in series.items():
        members.sort(key=lambda p: p.tokens)
        spread = [quartiles(p.samples, p.median_ms) for p in members]
        panel.errorbar([p.tokens for p in members], [p.median_ms for p in members],
                       yerr=[[s[0] for s in spread], [s[1] for s in spread]],
                       color=colors[kernel], marker=markers[heads], markersize=6, capsize=3,
                       linewidth=1.3)
    floors = {}
    for point in usable:
        if point.floor_ms:
            floors.setdefault((point.heads, str(point.seqs)), {})[point.tokens] = point.floor_ms
    for (heads, _), by_tokens in floors.items():
        xs = sorted(by_tokens)
        panel.plot(xs, [by_tokens[t] for t in xs], color="black", linestyle="--",
                   marker=markers[heads], markerfacecolor="none", markersize=6, alpha=0.6)
    by_shape: dict[str, dict[str, BenchPoint]] = {}
    for point in usable:
        by_shape.setdefault(point.shape, {})[point.kernel] = point
    for kernel_points in by_shape.values():
        ours, fla = kernel_points.get("kdabench"), kernel_points.get("fla")
        if ours and fla:
            panel.annotate(f"{fla.median_ms / ours.median_ms:.1f}x", (ours.tokens, ours.median_ms),
                           textcoords="offset points", xytext=(7, -4), fontsize="small",
                           color=colors["kdabench"])
    log_axes(panel, "total tokens T (log scale)", "median time (ms, log scale)",
             [p.tokens for p in usable])
    handles = [Line2D([], [], color=colors[k], label=k) for k in kernels]
    handles += [Line2D([], [], color="0.3", marker=markers[h], linestyle="none",
                       label="H unknown" if h is None else f"H = {h:.0f}")
                for h in head_counts]
    if floors:
        handles.append(Line2D([], [], color="black", linestyle="--", alpha=0.6,
                              label="floor: bytes and FLOPs\nat the measured rates"))
    panel.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                 fontsize="small", title="kernel · heads")
    panel.set_title("labels: fla time / kdabench time at that shape; bars: interquartile range "
                    "of the samples", fontsize="medium")
    figure.suptitle(f"KDA prefill time against T per kernel · {device}")
    save_png(figure, path)
    return True


def bench_section(receipt: LoadedReceipt, plot_path: Path) -> tuple[list[str], list[Path]]:
    cases = receipt.cases
    points = [point for case in cases for point in bench_points(case)]
    kernels = _kernel_order(p.kernel for p in points)
    regimes = list(dict.fromkeys(point.gates for point in points))
    with_gates = regimes != [None]
    shapes: dict[tuple[str | None, str, Any, Any], dict[str, BenchPoint]] = {}
    for point in points:
        key = (point.gates, point.shape, point.tokens, point.heads)
        shapes.setdefault(key, {})[point.kernel] = point
    overheads = {key: value for key, value in (_export_overhead(c) for c in cases)
                 if value is not None}
    rows = []
    for (gates, label, tokens, heads), by_kernel in shapes.items():
        ours, fla = by_kernel.get("kdabench"), by_kernel.get("fla")
        floor = next((p.floor_ms for p in by_kernel.values() if p.floor_ms), None)
        ratio = (f"{fla.median_ms / ours.median_ms:.2f}x" if ours and fla and ours.median_ms
                 and fla.median_ms else "-")
        to_floor = (f"{ours.median_ms / floor:.2f}x" if ours and ours.median_ms and floor
                    else "-")
        row = [*([gates or "-"] if with_gates else []), label, fmt_count(tokens),
               fmt_count(heads),
               *[fmt_ms(by_kernel[k].median_ms) if k in by_kernel else "-" for k in kernels],
               ratio, fmt_ms(floor), to_floor]
        if overheads:
            key = (gates, label)
            row.append(f"{overheads[key] * 100:+.1f}%" if key in overheads else "-")
        rows.append(row)
    modes = sorted({str(c["primary_mode"]) for c in cases if c.get("primary_mode")})
    mode_sentence = (f"Medians of {', '.join(MODE_NAMES.get(m, m) for m in modes)} "
                     "(the receipt has every mode's samples). " if modes else "")
    overhead_sentence = (" Export overhead: kdabench at capacity 4 with four checkpoints "
                         "against capacity 1, minus 1." if overheads else "")
    lines = ["#### Time per shape", "",
             (f"{mode_sentence}fla / kdabench above 1 means kdabench is faster; kdabench / "
              "floor is how far kdabench is from the time the shape's bytes and FLOPs need."
              f"{overhead_sentence}"), "",
             md_table([*(["gates"] if with_gates else []), "shape", "T", "H",
                       *[f"{k} (ms)" for k in kernels], "fla / kdabench",
                       "floor (ms)", "kdabench / floor",
                       *(["export overhead"] if overheads else [])], rows), ""]
    lines += _breakdown_lines(cases)
    plots = []
    lines += ["#### Time against T", ""]
    for gates in regimes:  # one plot per gate regime: their times must not share a line
        path = plot_path if gates is None else plot_path.with_name(
            f"{plot_path.stem}-{gates}{plot_path.suffix}")
        title = "time against T" + ("" if gates is None else f", {gates} gates")
        if plot_bench([p for p in points if p.gates == gates], path, device_name(receipt.doc)):
            plots.append(path)
            lines += [f"![{title}]({path.name})", ""]
    if not plots:
        lines += ["No case carries both T and a median time.", ""]
    lines += ["#### Cases", "",
              md_table(["#", "case", "verdict", "shape", "T", "kernels (median ms)",
                        "floor (ms)", "message"],
                       [[i + 1, fmt_case_id(case), fmt_verdict(case.get("verdict")),
                         pts[0].shape if pts else "-",
                         fmt_count(pts[0].tokens) if pts else "-",
                         ", ".join(f"{p.kernel} {fmt_ms(p.median_ms)}" for p in pts),
                         fmt_ms(pts[0].floor_ms) if pts else "-", case.get("message")]
                        for i, (case, pts) in enumerate((c, bench_points(c)) for c in cases)]),
              ""]
    return lines, plots


def _shape_label(case: Mapping[str, Any]) -> str:
    """The label the time table uses for the case's shape (its id when it has no points)."""
    points = bench_points(case)
    return points[0].shape if points else str(case.get("id"))


def _export_overhead(case: Mapping[str, Any]
                     ) -> tuple[tuple[str | None, str], float | None]:
    """((gate regime, shape label), export overhead in the case's primary mode, None where
    absent)."""
    gates = get_field(case, "gates.name")
    key = (None if gates is None else str(gates), _shape_label(case))
    overhead = case.get("export_overhead")
    if not isinstance(overhead, Mapping):
        return key, None
    return key, to_number(overhead.get(case.get("primary_mode")))


def _breakdown_lines(cases: Sequence[Mapping[str, Any]]) -> list[str]:
    """'Where the GPU time goes': per shape and bench kernel, the GPU time of one eager call
    and its largest GPU kernels (empty without a breakdown in the receipt)."""
    rows, calls = [], None
    for case in cases:
        breakdown = case.get("breakdown")
        if not isinstance(breakdown, Mapping):
            continue
        for kernel in _kernel_order(breakdown):
            record = breakdown[kernel]
            if isinstance(record, Mapping) and isinstance(record.get("kernels_us"), Mapping):
                total, _, parts = breakdown_line(dict(record)).partition(": ")
                rows.append([_shape_label(case), kernel, total.removesuffix(" us"), parts])
                calls = calls or record.get("calls")
    if not rows:
        return []
    return ["#### Where the GPU time goes", "",
            (f"torch.profiler over {calls or 'several'} eager calls per kernel, after the timed "
             "samples: the GPU time of one call and its largest GPU kernels (microseconds)."),
            "", md_table(["shape", "kernel", "GPU us per call", "largest GPU kernels (us)"],
                         rows), ""]
