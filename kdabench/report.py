"""Reports: receipts rendered for people, as one Markdown file with PNG plots.

    from kdabench.report import build_report

    result = build_report(["results/"], out_dir="report", title="H200 evidence")
    result.markdown_path, result.plots, result.unverified

``kdabench compare`` judges a change for CI; a report shows what receipts hold. Inputs are
receipt files or folders of them (every ``*.json`` directly inside a folder). Every receipt
is verified (:func:`kdabench.receipts.verify_file`); one that fails is still rendered, under
a warning in its section, unless ``require_verified`` is given, which refuses it. A file
that is not a readable receipt raises :class:`ReportError`. The Markdown names every case
of every receipt. Plots are drawn on :class:`matplotlib.figure.Figure` objects with the Agg
canvas, never through pyplot, so no display and no global backend state are touched.

Fields read per kind. Anything absent is shown as "-" and never stops a report; numbers
stored as "nan"/"inf" strings (see :func:`kdabench.receipts.sanitize`) are read as floats.

qualify (written by :mod:`kdabench.qualify`)
    ``scenario``, ``params`` (the matrix axes: capacity, heads, head_dim, layout, offsets,
    gate, ...), ``errors`` (``output``; the state errors ``final_state``, ``checkpoint``,
    ``prefix_unaligned``), ``tolerances`` (``output``, ``state``), ``shape.tokens`` (or
    ``shape.max_tokens`` for graph cases) as T, ``median_ms``, ``samples_ms``, ``message``.
    Rendered: a summary by scenario and by axis, every case with its verdict and errors, and
    a plot of median kernel time against T per head count for the ``accuracy`` cases.

bench (``kdabench bench``; no writer yet, so read defensively)
    One case per kernel and shape: ``kernel`` ("kdabench", "fla", ...; default "kdabench"),
    ``median_ms``, ``samples_ms``; or one case per shape with per-kernel medians, either
    ``kernels`` = {name: {"median_ms": ms, "samples_ms": [...]} or ms} or ``median_ms`` =
    {name: ms}. Shape: ``T`` (or ``tokens``, ``shape.T``, ``shape.tokens``), ``H`` (or
    ``heads``, ``shape.H``, ``shape.heads``, ``params.heads``), ``seqs`` (or ``num_seqs``,
    ``shape.seqs``, ``shape.num_seqs``), ``shape`` as a label ("8192x8x1") or
    ``shape.label``; optional ``floor_ms`` (or ``floor.ms``), the time the shape's bytes
    and FLOPs need at the measured rates. Rendered: a table per shape (medians, fla/kdabench,
    distance to the floor) and a plot of time against T per kernel, with the floor.

serve-sweep (``kdabench serve-sweep``, :mod:`kdabench.sweep.runner`; read defensively)
    ``kind`` per case: "cold-ttft" (or "ttft", or absent) cases are TTFT cells; others
    ("decode", "probe", "server", "shared-prefix", "failure") are never read as TTFT. ``arm``;
    prompt size ``prompt_tokens_requested`` (or ``prompt_tokens``, ``prompt_size``); TTFT
    samples ``ttft_samples_ms`` (or ``ttft_ms.samples``, ``ttft.samples_ms``, ``samples_ms``),
    median ``ttft_median_ms`` (or ``ttft_ms.median``, ``ttft.median_ms``, ``median_ms``; else
    the median of the samples), 95% interval ``ttft_ci_ms`` (or ``ttft_ms.ci``,
    ``ttft.ci_ms``, ``ci95_ms``, ``ci_ms``; [low, high] or {"low", "high"}; else a seeded
    bootstrap of the samples, marked as computed here); ``rate_tok_s`` (else prompt tokens
    over the median); ``valid`` false marks an arm whose activation checks failed. Decode:
    ``tokens_per_s`` (or ``decode_tokens_per_s``, ``decode.tokens_per_s``),
    ``acceptance_length`` (or ``decode.acceptance_length``), ``steps_per_s`` (or
    ``decode_steps_per_s``, ``decode.steps_per_s``; else tokens/s over the acceptance
    length). Rendered: a TTFT table and plot per arm and prompt size with the intervals,
    prompt tokens per second, and a decode-rate table.

Any other kind is listed with its cases' ids, verdicts and messages.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdabench.receipts import ReceiptError, Verification, read_receipt, verify_receipt

REPORT_NAME = "report.md"
STATE_ERRORS = ("final_state", "checkpoint", "prefix_unaligned")
AXIS_SKIP = frozenset({"seed", "variant"})  # not axes worth a summary row
BOOTSTRAP_RESAMPLES = 2000
KERNEL_ORDER = ("kdabench", "fla")
_DPI = 120


class ReportError(ValueError):
    """An input cannot be reported (missing, not a receipt, refused); one line."""


# --------------------------------------------------------------------------- reading


@dataclass
class LoadedReceipt:
    """One receipt as read: its path, document and what verification found."""

    path: Path
    doc: dict[str, Any]
    check: Verification
    sources_compared: bool = True

    @property
    def kind(self) -> str:
        return str(self.doc.get("kind"))

    @property
    def cases(self) -> list[dict[str, Any]]:
        return [case for case in self.doc.get("cases", []) if isinstance(case, dict)]

    @property
    def verified(self) -> bool:
        return self.check.ok


def receipt_paths(inputs: Iterable[str | Path]) -> list[Path]:
    """Receipt files named by ``inputs``: files as given, folders as their ``*.json``."""
    paths: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.glob("*.json") if p.is_file())
            if not found:
                raise ReportError(f"{path}: a folder with no *.json receipt in it")
            paths += found
        elif path.exists():
            paths.append(path)
        else:
            raise ReportError(f"{path}: no such file or folder")
    unique: list[Path] = []
    for path in paths:
        if path.resolve() not in {p.resolve() for p in unique}:
            unique.append(path)
    return unique


def _current_sources() -> dict[str, str] | None:
    from kdabench.sources import source_hashes

    try:
        return source_hashes()
    except ModuleNotFoundError:  # sources not installed: integrity is still checked
        return None


def load_receipts(
    inputs: Iterable[str | Path], current_sources: Mapping[str, str] | None = None
) -> list[LoadedReceipt]:
    """Read and verify every receipt named by ``inputs`` (raises :class:`ReportError`)."""
    current = dict(current_sources) if current_sources is not None else _current_sources()
    loaded = []
    for path in receipt_paths(inputs):
        try:
            doc, raw = read_receipt(path)
        except ReceiptError as error:
            raise ReportError(str(error)) from error
        # Without sources to compare with, compare the receipt with itself rather than
        # report every file as changed; integrity is checked either way.
        sources = current if current is not None else (doc.get("sources") or {})
        check = verify_receipt(doc, sources, raw=raw, path=path)
        loaded.append(LoadedReceipt(path, doc, check, sources_compared=current is not None))
    return loaded


# --------------------------------------------------------------------------- field access


def _get(case: Mapping[str, Any], *names: str) -> Any:
    """The first present, non-None value among dotted field names ("shape.tokens")."""
    for name in names:
        value: Any = case
        for part in name.split("."):
            if isinstance(value, Mapping) and part in value:
                value = value[part]
            else:
                value = None
                break
        if value is not None:
            return value
    return None


def _number(value: Any) -> float | None:
    """A float from a receipt value (numbers, or the strings "nan"/"inf"/"-inf")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    return None


def _numbers(values: Any) -> list[float]:
    if not isinstance(values, (list, tuple)):
        return []
    return [n for n in (_number(v) for v in values) if n is not None and math.isfinite(n)]


def _worst(values: Iterable[float | None]) -> float | None:
    """The largest value, NaN counting as worst of all; None when there is none."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return max(present, key=lambda v: math.inf if math.isnan(v) else v)


# --------------------------------------------------------------------------- formatting


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}"


def fmt_err(value: float | None, tolerance: float | None = None) -> str:
    """An error, with its share of the tolerance: "2.18e-03 (44%)"."""
    if value is None:
        return "-"
    text = f"{value:.2e}" if math.isfinite(value) else str(value)
    if tolerance and math.isfinite(value):
        text += f" ({100 * value / tolerance:.0f}%)"
    return text


def fmt_count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _cell(value: Any) -> str:
    text = "-" if value is None or value == "" else str(value)
    return " ".join(text.replace("|", "\\|").split())


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub Markdown table ('|' inside cells escaped, newlines folded)."""
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |",
             "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _verdict(verdict: Any) -> str:
    return f"**{str(verdict).upper()}**" if verdict in ("fail", "error") else str(verdict)


def _case_id(case: Mapping[str, Any]) -> str:
    return f"`{case.get('id')}`"


def _device_name(doc: Mapping[str, Any]) -> str:
    device = doc.get("device") if isinstance(doc.get("device"), dict) else {}
    name = str(device.get("name") or "unknown device")
    if device.get("compute_capability"):
        name += f" (cc {device['compute_capability']})"
    return name


# --------------------------------------------------------------------------- plotting


def _figure(width: float = 10.0, height: float = 5.6, ncols: int = 1):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    axes = figure.subplots(1, ncols, squeeze=False)[0]
    return figure, list(axes)


def _save(figure, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    figure.savefig(path, format="png", dpi=_DPI)
    return path


def _token_label(value: float, _position: Any = None) -> str:
    """A token count for an axis: 2048 -> "2K", 65536 -> "64K", 300 -> "300"."""
    if value >= 1024 and value % 512 == 0:
        return f"{value / 1024:g}K"
    return f"{value:g}"


def _log_axes(axes, xlabel: str, ylabel: str, xs: Sequence[float]) -> None:
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


def _quartiles(samples: Sequence[float], median: float) -> tuple[float, float]:
    if len(samples) < 2:
        return 0.0, 0.0
    low, _, high = statistics.quantiles(samples, n=4)
    return max(median - low, 0.0), max(high - median, 0.0)


# --------------------------------------------------------------------------- qualify


def _state_error(case: Mapping[str, Any]) -> float | None:
    errors = case.get("errors") if isinstance(case.get("errors"), dict) else {}
    return _worst(_number(errors.get(name)) for name in STATE_ERRORS)


def _output_error(case: Mapping[str, Any]) -> float | None:
    return _number(_get(case, "errors.output"))


def _tokens(case: Mapping[str, Any]) -> float | None:
    return _number(_get(case, "shape.tokens", "shape.max_tokens", "T", "tokens"))


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
            (self.output, _output_error(case), _number(_get(case, "tolerances.output"))),
            (self.state, _state_error(case), _number(_get(case, "tolerances.state"))),
        ):
            if value is not None:
                errors.append((value, tolerance))
        median = _number(case.get("median_ms"))
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
        median = statistics.median(self.medians) if self.medians else None
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
        number = _number(_try_float(value))
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
        tokens, median = _tokens(case), _number(case.get("median_ms"))
        if tokens is None or median is None or not math.isfinite(median) or median <= 0:
            continue
        heads = int(_number(_get(case, "params.heads", "shape.heads")) or 0)
        head_dim = int(_number(_get(case, "params.head_dim")) or 0)
        capacity = int(_number(_get(case, "params.capacity")) or 0)
        spread = _quartiles(_numbers(case.get("samples_ms")), median)
        points.setdefault((head_dim, heads), []).append((tokens, median, spread, capacity))
    if not points:
        return False
    head_dims = sorted({head_dim for head_dim, _ in points})
    all_heads = sorted({heads for _, heads in points})
    capacities = sorted({p[3] for series in points.values() for p in series})
    figure, panels = _figure(6.5 * len(head_dims) if len(head_dims) > 1 else 10.0, 6.0,
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
                       [statistics.median(by_tokens[t]) for t in line_x], "-",
                       color=colors[heads], linewidth=1.4)
        _log_axes(panel, "total tokens T (log scale)", "median kernel time (ms, log scale)",
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
    _save(figure, path)
    return True


def _qualify_section(receipt: LoadedReceipt, plot_path: Path) -> tuple[list[str], list[Path]]:
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
    if plot_qualify_times(cases, plot_path, _device_name(receipt.doc)):
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
                       [[i + 1, _case_id(case), case.get("scenario"),
                         _verdict(case.get("verdict")), fmt_count(_tokens(case)),
                         fmt_err(_output_error(case), _number(_get(case, "tolerances.output"))),
                         fmt_err(_state_error(case), _number(_get(case, "tolerances.state"))),
                         fmt_ms(_number(case.get("median_ms"))), case.get("message")]
                        for i, case in enumerate(cases)]),
              ""]
    return lines, plots


# --------------------------------------------------------------------------- bench


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


def bench_points(case: Mapping[str, Any]) -> list[BenchPoint]:
    """The (kernel, time) points of one bench case, in either layout the docstring names."""
    tokens = _number(_get(case, "T", "tokens", "shape.T", "shape.tokens"))
    heads = _number(_get(case, "H", "heads", "shape.H", "shape.heads", "params.heads"))
    seqs = _get(case, "seqs", "num_seqs", "shape.seqs", "shape.num_seqs")
    label = _get(case, "shape.label", "shape_label")
    if isinstance(case.get("shape"), str):
        label = case["shape"]
    if label is None:
        parts = [fmt_count(tokens), fmt_count(heads), "-" if seqs is None else str(seqs)]
        label = "x".join(parts)
    floor = _number(_get(case, "floor_ms", "floor.ms"))
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
            median, samples = _number(entry.get("median_ms")), _numbers(entry.get("samples_ms"))
        else:
            median, samples = _number(entry), []
        if median is None and samples:
            median = statistics.median(samples)
        points.append(BenchPoint(str(case.get("id")), str(kernel), str(label), tokens, heads,
                                 seqs, median, samples, floor))
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
    figure, (panel,) = _figure(11.5, 6.2)
    kernels = _kernel_order(p.kernel for p in usable)
    colors = {k: f"C{i % 10}" for i, k in enumerate(kernels)}
    head_counts = sorted({p.heads for p in usable}, key=lambda h: (h is None, h or 0))
    markers = {h: _HEAD_MARKERS[i % len(_HEAD_MARKERS)] for i, h in enumerate(head_counts)}
    series: dict[tuple[str, Any, str], list[BenchPoint]] = {}
    for point in usable:
        series.setdefault((point.kernel, point.heads, str(point.seqs)), []).append(point)
    for (kernel, heads, _), members in series.items():
        members.sort(key=lambda p: p.tokens)
        spread = [_quartiles(p.samples, p.median_ms) for p in members]
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
    _log_axes(panel, "total tokens T (log scale)", "median time (ms, log scale)",
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
    _save(figure, path)
    return True


def _bench_section(receipt: LoadedReceipt, plot_path: Path) -> tuple[list[str], list[Path]]:
    cases = receipt.cases
    points = [point for case in cases for point in bench_points(case)]
    kernels = _kernel_order(p.kernel for p in points)
    shapes: dict[tuple[str, Any, Any], dict[str, BenchPoint]] = {}
    for point in points:
        shapes.setdefault((point.shape, point.tokens, point.heads), {})[point.kernel] = point
    rows = []
    for (label, tokens, heads), by_kernel in shapes.items():
        ours, fla = by_kernel.get("kdabench"), by_kernel.get("fla")
        floor = next((p.floor_ms for p in by_kernel.values() if p.floor_ms), None)
        ratio = (f"{fla.median_ms / ours.median_ms:.2f}x" if ours and fla and ours.median_ms
                 and fla.median_ms else "-")
        to_floor = (f"{ours.median_ms / floor:.2f}x" if ours and ours.median_ms and floor
                    else "-")
        rows.append([label, fmt_count(tokens), fmt_count(heads),
                     *[fmt_ms(by_kernel[k].median_ms) if k in by_kernel else "-"
                       for k in kernels], ratio, fmt_ms(floor), to_floor])
    lines = ["#### Time per shape", "",
             ("fla / kdabench above 1 means kdabench is faster; kdabench / floor is how far "
             "kdabench is from the time the shape's bytes and FLOPs need."), "",
             md_table(["shape", "T", "H", *[f"{k} (ms)" for k in kernels], "fla / kdabench",
                       "floor (ms)", "kdabench / floor"], rows), ""]
    plots = []
    lines += ["#### Time against T", ""]
    if plot_bench(points, plot_path, _device_name(receipt.doc)):
        plots.append(plot_path)
        lines += [f"![time against T]({plot_path.name})", ""]
    else:
        lines += ["No case carries both T and a median time.", ""]
    lines += ["#### Cases", "",
              md_table(["#", "case", "verdict", "shape", "T", "kernels (median ms)",
                        "floor (ms)", "message"],
                       [[i + 1, _case_id(case), _verdict(case.get("verdict")),
                         pts[0].shape if pts else "-",
                         fmt_count(pts[0].tokens) if pts else "-",
                         ", ".join(f"{p.kernel} {fmt_ms(p.median_ms)}" for p in pts),
                         fmt_ms(pts[0].floor_ms) if pts else "-", case.get("message")]
                        for i, (case, pts) in enumerate((c, bench_points(c)) for c in cases)]),
              ""]
    return lines, plots


# --------------------------------------------------------------------------- serve-sweep


TTFT_KINDS = (None, "cold-ttft", "ttft")  # case["kind"] of a TTFT cell (None: unmarked)


@dataclass
class ServePoint:
    """One case of a serve-sweep receipt: TTFT of an arm at a prompt size, decode rates, or
    neither (a probe, a server record)."""

    case_id: str
    kind: str | None
    arm: str
    prompt_tokens: float | None
    samples: list[float]
    median_ms: float | None
    ci_ms: tuple[float, float] | None
    ci_computed: bool
    rate_tok_s: float | None
    valid: bool
    tokens_per_s: float | None
    acceptance_length: float | None
    steps_per_s: float | None

    @property
    def has_ttft(self) -> bool:
        return self.median_ms is not None and math.isfinite(self.median_ms)

    @property
    def has_decode(self) -> bool:
        return self.tokens_per_s is not None or self.steps_per_s is not None


def bootstrap_ci(samples: Sequence[float], *, level: float = 0.95,
                 resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median (seeded: the same samples, the same CI)."""
    import numpy as np

    values = np.asarray(samples, dtype=float)
    draws = np.random.default_rng(seed).choice(values, size=(resamples, values.size))
    medians = np.median(draws, axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(medians, [tail, 1.0 - tail])
    return float(low), float(high)


def _interval(value: Any) -> tuple[float, float] | None:
    if isinstance(value, Mapping):
        value = [_get(value, "low", "lo"), _get(value, "high", "hi")]
    if isinstance(value, (list, tuple)) and len(value) == 2:
        low, high = _number(value[0]), _number(value[1])
        if low is not None and high is not None:
            return low, high
    return None


def serve_point(case: Mapping[str, Any]) -> ServePoint:
    """Read one serve-sweep case (field names: the module docstring)."""
    kind = case.get("kind") if isinstance(case.get("kind"), str) else None
    samples: list[float] = []
    median = interval = None
    computed = False
    if kind in TTFT_KINDS:
        samples = _numbers(_get(case, "ttft_samples_ms", "ttft_ms.samples", "ttft.samples_ms",
                                "samples_ms"))
        median = _number(_get(case, "ttft_median_ms", "ttft_ms.median", "ttft.median_ms",
                              "median_ms"))
        if median is None:
            median = _number(case.get("ttft_ms"))
        if median is None and samples:
            median = statistics.median(samples)
        interval = _interval(_get(case, "ttft_ci_ms", "ttft_ms.ci", "ttft.ci_ms", "ci95_ms",
                                  "ci_ms"))
        if interval is None and len(samples) >= 2:
            interval, computed = bootstrap_ci(samples), True
    prompt = _number(_get(case, "prompt_tokens_requested", "prompt_tokens", "prompt_size",
                          "params.prompt_tokens"))
    rate = _number(case.get("rate_tok_s"))
    if rate is None and median:
        actual = _number(case.get("prompt_tokens")) or prompt
        rate = actual / (median / 1000.0) if actual else None
    tokens_per_s = _number(_get(case, "decode_tokens_per_s", "decode.tokens_per_s",
                                "tokens_per_s"))
    acceptance = _number(_get(case, "acceptance_length", "decode.acceptance_length"))
    steps = _number(_get(case, "decode_steps_per_s", "decode.steps_per_s", "steps_per_s",
                         "decode_steps_per_s_normalized", "decode.normalized_steps_per_s"))
    if steps is None and tokens_per_s is not None and acceptance:
        steps = tokens_per_s / acceptance
    return ServePoint(
        case_id=str(case.get("id")), kind=kind,
        arm=str(_get(case, "arm", "params.arm") or "-"), prompt_tokens=prompt,
        samples=samples, median_ms=median, ci_ms=interval, ci_computed=computed,
        rate_tok_s=rate, valid=case.get("valid") is not False,
        tokens_per_s=tokens_per_s, acceptance_length=acceptance, steps_per_s=steps,
    )


def _tokens_label(tokens: float | None) -> str:
    if tokens is None:
        return "?"
    if tokens >= 1024 and tokens % 1024 == 0:
        return f"{tokens / 1024:.0f}K"
    return f"{tokens:,.0f}"


def plot_serve(points: Sequence[ServePoint], path: Path, device: str) -> bool:
    """Median TTFT per arm and prompt size with interval bars, and prompt tokens/s; False
    when no point has a TTFT."""
    usable = [p for p in points if p.has_ttft]
    if not usable:
        return False
    sizes = sorted({p.prompt_tokens for p in usable}, key=lambda t: (t is None, t or 0))
    arms = list(dict.fromkeys(p.arm for p in usable))
    invalid_arms = {p.arm for p in usable if not p.valid}
    figure, (ttft, rate) = _figure(13.0, 5.6, ncols=2)
    width = 0.8 / max(len(arms), 1)
    for index, arm in enumerate(arms):
        mine = {p.prompt_tokens: p for p in usable if p.arm == arm}
        xs = [sizes.index(t) - 0.4 + width * (index + 0.5) for t in sizes if t in mine]
        chosen = [mine[t] for t in sizes if t in mine]
        below = [p.median_ms - p.ci_ms[0] if p.ci_ms else 0.0 for p in chosen]
        above = [p.ci_ms[1] - p.median_ms if p.ci_ms else 0.0 for p in chosen]
        color = f"C{index % 10}"
        ttft.errorbar(xs, [p.median_ms for p in chosen],
                      yerr=[[max(b, 0.0) for b in below], [max(a, 0.0) for a in above]],
                      fmt="o", color=color, capsize=4,
                      label=f"{arm} (NOT VALID)" if arm in invalid_arms else arm)
        rate.bar(xs, [p.rate_tok_s or 0.0 for p in chosen], width=width * 0.9, color=color,
                 label=arm)
    for panel in (ttft, rate):
        panel.set_xticks(range(len(sizes)), [_tokens_label(t) for t in sizes])
        panel.set_xlabel("prompt size (tokens)")
        panel.grid(True, axis="y", alpha=0.4)
    ttft.legend(title="arm", fontsize="small", loc="upper left")
    rate.set_ylim(top=rate.get_ylim()[1] * 1.08)
    ttft.set_ylabel("median cold TTFT (ms)")
    ttft.set_title("TTFT per arm (bars: 95% confidence interval)")
    ttft.set_ylim(bottom=0)
    rate.set_ylabel("prompt tokens / median TTFT (tokens/s)")
    rate.set_title("prefill rate per arm (colours as on the left)")
    figure.suptitle(f"Cold time to first token per arm and prompt size · {device}")
    _save(figure, path)
    return True


def _serve_section(receipt: LoadedReceipt, plot_path: Path) -> tuple[list[str], list[Path]]:
    cases = receipt.cases
    points = [serve_point(case) for case in cases]
    arm_order = {arm: i for i, arm in enumerate(dict.fromkeys(p.arm for p in points))}
    timed = sorted((p for p in points if p.has_ttft),
                   key=lambda p: (p.prompt_tokens or 0, arm_order[p.arm]))
    lines = ["#### Cold TTFT per arm and prompt size", ""]
    if timed:
        def interval(p: ServePoint) -> str:
            if not p.ci_ms:
                return "-"
            text = f"{fmt_ms(p.ci_ms[0])} – {fmt_ms(p.ci_ms[1])}"
            return text + " (bootstrap here)" if p.ci_computed else text

        lines += [("Prompt tokens/s is prompt tokens over median TTFT. An arm whose activation "
                  "checks failed is marked NOT VALID: its numbers are not evidence."), "",
                  md_table(["arm", "prompt tokens", "samples", "median TTFT (ms)",
                            "95% CI (ms)", "prompt tokens/s", "valid"],
                           [[p.arm, fmt_count(p.prompt_tokens), len(p.samples),
                             fmt_ms(p.median_ms), interval(p), fmt_count(p.rate_tok_s),
                             "yes" if p.valid else "**NOT VALID**"] for p in timed]), ""]
    else:
        lines += ["No case carries a TTFT.", ""]
    plots = []
    if plot_serve(points, plot_path, _device_name(receipt.doc)):
        plots.append(plot_path)
        lines += [f"![TTFT per arm and prompt size]({plot_path.name})", ""]
    decode = [p for p in points if p.has_decode]
    lines += ["#### Decode rates", ""]
    if decode:
        lines += [("Steps/s is output tokens/s divided by the speculative-decoding acceptance "
                  "length (1 without speculation)."), "",
                  md_table(["arm", "prompt tokens", "output tokens/s", "acceptance length",
                            "steps/s", "valid"],
                           [[p.arm, fmt_count(p.prompt_tokens), _fmt_rate(p.tokens_per_s),
                             _fmt_rate(p.acceptance_length), _fmt_rate(p.steps_per_s),
                             "yes" if p.valid else "**NOT VALID**"] for p in decode]), ""]
    else:
        lines += ["No case carries a decode rate.", ""]
    lines += ["#### Cases", "",
              md_table(["#", "case", "kind", "verdict", "arm", "prompt tokens",
                        "median TTFT (ms)", "decode steps/s", "message"],
                       [[i + 1, _case_id(case), p.kind, _verdict(case.get("verdict")), p.arm,
                         fmt_count(p.prompt_tokens), fmt_ms(p.median_ms),
                         _fmt_rate(p.steps_per_s), case.get("message")]
                        for i, (case, p) in enumerate(zip(cases, points, strict=True))]),
              ""]
    return lines, plots


def _fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# --------------------------------------------------------------------------- other kinds


def _other_section(receipt: LoadedReceipt) -> list[str]:
    return [f"Kind `{receipt.kind}` is not one this report knows; its cases are listed.", "",
            md_table(["#", "case", "verdict", "message"],
                     [[i + 1, _case_id(case), _verdict(case.get("verdict")),
                       case.get("message")] for i, case in enumerate(receipt.cases)]), ""]


# --------------------------------------------------------------------------- assembly


SECTIONS = {"qualify": (_qualify_section, "kernel-time"),
            "bench": (_bench_section, "bench-time"),
            "serve-sweep": (_serve_section, "ttft")}


@dataclass
class ReportResult:
    """What :func:`build_report` wrote."""

    markdown_path: Path
    plots: list[Path]
    receipts: list[LoadedReceipt]

    @property
    def paths(self) -> list[Path]:
        return [self.markdown_path, *self.plots]

    @property
    def unverified(self) -> list[LoadedReceipt]:
        return [receipt for receipt in self.receipts if not receipt.verified]

    @property
    def unknown_kinds(self) -> list[str]:
        return sorted({r.kind for r in self.receipts if r.kind not in SECTIONS})

    def to_dict(self) -> dict[str, Any]:
        return {
            "markdown": str(self.markdown_path),
            "plots": [str(path) for path in self.plots],
            "receipts": [{"path": str(r.path), "kind": r.kind, "verified": r.verified,
                          "problems": list(r.check.problems), "cases": len(r.cases)}
                         for r in self.receipts],
            "unknown_kinds": self.unknown_kinds,
        }


def _receipt_heading(number: int, receipt: LoadedReceipt) -> list[str]:
    doc, check = receipt.doc, receipt.check
    lines = [f"## {number}. {receipt.kind} · {_device_name(doc)} · {doc.get('created_at')}", ""]
    if not check.ok:
        lines += ["> **NOT VERIFIED.** This receipt fails verification; its numbers below "
                  "cannot be trusted: " + "; ".join(check.problems) + ".", ""]
    git = doc.get("git") if isinstance(doc.get("git"), dict) else {}
    commit = git.get("commit")
    commit_text = commit[:12] if isinstance(commit, str) else "no commit"
    if git.get("dirty"):
        commit_text += " (dirty tree)"
    summary = check.summary
    counts = ", ".join(f"{summary.get(v, 0)} {v}" for v in ("pass", "fail", "error", "skip"))
    lines += [f"- file: `{receipt.path}`",
              (f"- sha256 `{str(doc.get('sha256'))[:16]}…` · "
              f"{'verified' if check.ok else '**NOT VERIFIED**'} · status {doc.get('status')}"),
              f"- made by kdabench {doc.get('tool_version')} at {commit_text}",
              f"- {summary.get('total', len(receipt.cases))} cases: {counts}"]
    if not receipt.sources_compared:
        lines.append("- sources: not compared (the kernel sources are not installed here)")
    elif check.sources.match:
        lines.append("- sources: match the tree in hand")
    else:
        lines.append(f"- sources: differ from the tree in hand ({check.sources.describe()})")
    for warning in check.warnings:
        lines.append(f"- note: {warning}")
    return [*lines, ""]


def _plot_path(out_dir: Path, receipt: LoadedReceipt, suffix: str, taken: set[str]) -> Path:
    name, number = f"{receipt.path.stem}-{suffix}.png", 1
    while name in taken:
        number += 1
        name = f"{receipt.path.stem}-{number}-{suffix}.png"
    taken.add(name)
    return out_dir / name


def render_report(receipts: Sequence[LoadedReceipt], out_dir: Path,
                  title: str | None = None) -> tuple[str, list[Path]]:
    """The Markdown text for ``receipts``, writing its plots into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title or 'kdabench report'}", "",
             f"{len(receipts)} receipt(s); each section below names every case of its receipt.",
             ""]
    bad = [r for r in receipts if not r.verified]
    if bad:
        lines += [f"> **Warning: {len(bad)} receipt(s) fail verification** and are marked "
                  "NOT VERIFIED below: " + ", ".join(f"`{r.path}`" for r in bad) + ".", ""]
    unknown = sorted({r.kind for r in receipts if r.kind not in SECTIONS})
    if unknown:
        lines += ["Receipts of kinds this report does not know (listed, not plotted): "
                  + ", ".join(f"`{kind}`" for kind in unknown) + ".", ""]
    lines += [md_table(["#", "receipt", "kind", "device", "created", "status", "verified",
                        "cases", "pass", "fail", "error", "skip"],
                       [[i + 1, f"`{r.path.name}`", r.kind, _device_name(r.doc),
                         r.doc.get("created_at"), r.doc.get("status"),
                         "yes" if r.verified else "**NO**", len(r.cases),
                         *[sum(c.get("verdict") == v for c in r.cases)
                           for v in ("pass", "fail", "error", "skip")]]
                        for i, r in enumerate(receipts)]), ""]
    plots: list[Path] = []
    taken: set[str] = set()
    for number, receipt in enumerate(receipts, start=1):
        lines += _receipt_heading(number, receipt)
        if receipt.kind in SECTIONS:
            section, suffix = SECTIONS[receipt.kind]
            body, drawn = section(receipt, _plot_path(out_dir, receipt, suffix, taken))
            lines += body
            plots += drawn
        else:
            lines += _other_section(receipt)
    return "\n".join(lines).rstrip() + "\n", plots


def build_report(
    inputs: Iterable[str | Path],
    out_dir: str | Path,
    *,
    title: str | None = None,
    require_verified: bool = False,
    current_sources: Mapping[str, str] | None = None,
) -> ReportResult:
    """Read, verify and render receipts into ``out_dir``/report.md and PNG plots.

    Raises :class:`ReportError` for an input that is not a readable receipt, or, with
    ``require_verified``, for a receipt that fails verification (before writing anything).
    """
    receipts = load_receipts(inputs, current_sources)
    if require_verified:
        bad = [r for r in receipts if not r.verified]
        if bad:
            details = "; ".join(f"{r.path} ({', '.join(r.check.problems)})" for r in bad)
            raise ReportError(f"refusing {len(bad)} receipt(s) that fail verification: "
                              f"{details}")
    out_dir = Path(out_dir)
    text, plots = render_report(receipts, out_dir, title)
    markdown_path = out_dir / REPORT_NAME
    markdown_path.write_text(text, encoding="utf-8")
    return ReportResult(markdown_path, plots, receipts)
