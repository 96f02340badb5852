"""Reports: receipts rendered for people, as one Markdown file with PNG plots.

    from kdabench.report import build_report

    result = build_report(["results/"], out_dir="report", title="H200 evidence")
    result.markdown_path, result.plots, result.unverified

``kdabench compare`` judges a change for CI; a report shows what receipts hold. Inputs are
receipt files or folders of them (every ``*.json`` directly inside a folder). Every receipt
is verified (:func:`kdabench.receipts.load_receipts`); one that fails is still rendered, under
a warning in its section, unless ``require_verified`` is given, which refuses it. A file
that is not a readable receipt raises :class:`ReportError`. The Markdown names every case
of every receipt. Plots are drawn on :class:`matplotlib.figure.Figure` objects with the Agg
canvas, never through pyplot, so no display and no global backend state are touched.

Fields read per kind are listed in each kind's module. Anything absent is shown as "-" and
never stops a report; numbers stored as "nan"/"inf" strings (see
:func:`kdabench.receipts.sanitize`) are read as floats. Any other kind is listed with its
cases' ids, verdicts and messages.

The same cases as one pandas DataFrame, a row per case per receipt (``kdabench report
--csv``)::

    table = report_table(["results/"])       # columns: kdabench.report.table.COLUMNS

The modules: `fields` (values read from cases whatever their layout), `markdown` (numbers
and tables as text), `plotting` (figures, PNG files, log-log axes), one section per kind:
`qualify`, `bench`, `serve_sweep`; `build` (the receipts read, the whole report assembled
and written) and `table` (every case as a DataFrame row).
"""

from kdabench.report.bench import KERNEL_ORDER, BenchPoint, bench_points, plot_bench
from kdabench.report.breakdown import breakdown_line, short_kernel_name
from kdabench.report.build import (
    REPORT_NAME,
    SECTIONS,
    ReportError,
    ReportResult,
    build_report,
    read_receipts,
    render_report,
)
from kdabench.report.markdown import fmt_count, fmt_err, fmt_ms, md_table
from kdabench.report.qualify import (
    AXIS_SKIP,
    STATE_ERRORS,
    plot_qualify_times,
    qualify_by_axis,
    qualify_by_scenario,
)
from kdabench.report.serve_sweep import TTFT_KINDS, ServePoint, plot_serve, serve_point
from kdabench.report.table import COLUMNS, case_rows, cases_table, report_table

__all__ = [
    "AXIS_SKIP", "COLUMNS", "KERNEL_ORDER", "REPORT_NAME", "SECTIONS", "STATE_ERRORS",
    "TTFT_KINDS",
    "BenchPoint", "ReportError", "ReportResult", "ServePoint",
    "bench_points", "breakdown_line", "build_report", "case_rows", "cases_table", "fmt_count", "fmt_err",
    "fmt_ms", "md_table", "plot_bench", "plot_qualify_times", "plot_serve", "qualify_by_axis",
    "qualify_by_scenario", "read_receipts", "render_report", "report_table", "serve_point",
    "short_kernel_name",
]
