"""`kdabench compare`: judge HEAD receipts against BASE receipts, case by case."""

from __future__ import annotations

import io
import json
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kdabench.cli.errors import (
    EXIT_BAD_INPUT,
    EXIT_FINDING,
    EXIT_INTERNAL,
    EXIT_OK,
    Finding,
    UserError,
)
from kdabench.compare import (
    ACROSS_FIELDS,
    CompareError,
    Comparison,
    compare_paths,
    format_interval,
    format_ms,
    format_p,
    format_ratio,
    has_several_groups,
    pairing_lines,
    parse_threshold,
    render_markdown,
)
from kdabench.receipts import atomic_write_bytes

_FILE_WIDTH = 200  # columns of a table written to a file or a pipe

_EXIT_CODES_HELP = f"""\b
Exit codes:
  {EXIT_OK}  ok: no case regressed or failed
  {EXIT_FINDING}  a case regressed, or passed in BASE and does not pass in HEAD (failed)
  {EXIT_BAD_INPUT}  bad input: a bad option, a missing or unreadable file, not a receipt, a receipt
     that does not verify (without --no-verify), no receipt paired, no case in common
  {EXIT_INTERNAL}  internal error (a bug): rerun with 'kdabench --debug compare ...' for the traceback
"""

_VERDICT_STYLES = {
    "failed": "bold red", "regressed": "bold red", "improved": "green",
    "new": "cyan", "missing": "yellow", "unchanged": "dim",
}


def _threshold(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        return parse_threshold(value)
    except CompareError as error:
        raise click.BadParameter(str(error)) from error


def render_table(console: Console, comparison: Comparison) -> None:
    """Warnings first, then which receipts were paired, one row per case, the summary line."""
    for message in comparison.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(message)}", soft_wrap=True)
    console.print(f"[bold]{escape(comparison.pairing_heading())}:[/bold]", soft_wrap=True)
    for line in pairing_lines(comparison):
        console.print(f"  {escape(line)}", soft_wrap=True)
    multi = has_several_groups(comparison)
    table = Table(show_lines=False, header_style="bold")
    if multi:
        for name in ("kind", "backend", "device"):
            table.add_column(name)
    table.add_column("case", overflow="fold")
    table.add_column("verdict", no_wrap=True)
    for name in ("base ms", "head ms", "ratio",
                 f"{comparison.options.confidence * 100:g}% CI", "p"):
        table.add_column(name, justify="right")
    table.add_column("correctness", no_wrap=True)
    table.add_column("note")
    for case in comparison.cases:
        cells = [case.kind, case.backend or "—", case.device] if multi else []
        cells += [case.id, case.verdict, format_ms(case.base_median_ms),
                  format_ms(case.head_median_ms), format_ratio(case), format_interval(case),
                  format_p(case), f"{case.base_verdict or '—'} → {case.head_verdict or '—'}",
                  case.note]
        verdict_column = len(cells) - 8
        table.add_row(*[
            Text(cell, style=_VERDICT_STYLES[case.verdict] if i == verdict_column else "")
            for i, cell in enumerate(cells)
        ])
    console.print(table)
    style = "bold red" if comparison.has_regression else "green"
    console.print(f"[{style}]{escape(comparison.summary_line())}[/{style}]", soft_wrap=True)


def _render(comparison: Comparison, output_format: str, *, width: int | None = None,
            color: bool = True) -> str:
    if output_format == "json":
        return json.dumps(comparison.to_dict(), indent=2, sort_keys=True) + "\n"
    if output_format == "markdown":
        return render_markdown(comparison)
    buffer = io.StringIO()
    console = Console(file=buffer, highlight=False, soft_wrap=False, width=width or _FILE_WIDTH,
                      color_system="auto" if color else None, force_terminal=color or None)
    render_table(console, comparison)
    return buffer.getvalue()


@click.command("compare", epilog=_EXIT_CODES_HELP)
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("head", type=click.Path(path_type=Path))
@click.option("--threshold", default="5%", show_default=True, callback=_threshold,
              help="Relative change of the median that counts (5% or 0.05).")
@click.option("--alpha", default=0.01, show_default=True,
              type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="Significance level of the Mann-Whitney test on the raw samples.")
@click.option("--format", "output_format", default="table", show_default=True,
              type=click.Choice(["table", "markdown", "json"]),
              help="table for a terminal, markdown for a pull-request comment, json for machines.")
@click.option("--across", multiple=True, type=click.Choice(ACROSS_FIELDS),
              help="Pair cases across this field too (repeat for both): leave it out of the "
                   "pairing, e.g. '--across backend' to compare CuTe against Triton.")
@click.option("--no-verify", is_flag=True,
              help="Compare receipts that fail verification (with a warning) instead of refusing.")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the output, in the chosen format, to this file.")
def compare(base: Path, head: Path, threshold: float, alpha: float, output_format: str,
            across: tuple[str, ...], no_verify: bool, out: Path | None) -> None:
    """Compare the receipts HEAD against BASE, case by case.

    BASE and HEAD are receipt files or folders of receipts (every *.json in the folder).

    Pairing: a case of BASE is compared with the case of HEAD that has the same receipt
    kind, kernel backend, device name and case id. The backend is the one a qualify receipt
    ran (qualify --backend); a bench receipt that timed several backends (bench --backends)
    holds each backend's cases apart, judged by that backend's kdabench kernel. Cases are
    never paired across backends or devices unless --across backend or --across device
    leaves that field out of the pairing (CuTe against Triton, one GPU against another);
    each side must then hold one backend (device) per pairing. Where a side holds several
    receipts of one kind, backend and device, the newest receipt's result is used for each
    case. A receipt with no counterpart on the other side is listed as unmatched and its
    cases are not compared. The output (table, markdown and json) says which receipts
    were paired with which.

    For each paired case: the medians of the raw samples, the ratio HEAD/BASE, a
    Mann-Whitney test (two-sided), a bootstrap 95% interval of the ratio, and a verdict. A
    bench case is judged by its backend's kdabench samples (capacity 4) in a timing mode
    both sides ran (BASE's primary mode, CUDA-graph replay unless only eager ran); its note
    gives each side's fla ratio, fla having run on the same inputs in each receipt:

    \b
      failed     passed in BASE, does not pass in HEAD (whatever the timing)
      regressed  ratio above 1 + threshold and p below alpha
      improved   ratio below 1 - threshold and p below alpha, or now passes
      unchanged  anything else; a case without samples compares correctness only
      new        only in HEAD (of a pair)
      missing    only in BASE (of a pair)

    Warnings come first: device, toolchain or kernel/oracle sources that differ between
    paired receipts, partial receipts. A receipt that does not verify is refused unless
    --no-verify.
    """
    try:
        comparison = compare_paths(base, head, threshold=threshold, alpha=alpha,
                                   verify=not no_verify, across=across)
    except CompareError as error:
        raise UserError(str(error)) from error

    if output_format == "table":
        console = Console(highlight=False)
        if not console.is_terminal:  # a log or a pipe: do not squeeze the table to 80 columns
            console.width = _FILE_WIDTH
        render_table(console, comparison)
    else:
        click.echo(_render(comparison, output_format), nl=False)
    if out is not None:
        try:
            atomic_write_bytes(out, _render(comparison, output_format, color=False)
                               .encode("utf-8"))
        except OSError as error:
            raise UserError(f"cannot write {out}: {error.strerror or error}") from error

    if comparison.has_regression:
        names = ", ".join(case.id for case in comparison.regressions[:5])
        more = len(comparison.regressions) - 5
        raise Finding(f"{len(comparison.regressions)} case(s) regressed or failed: {names}"
                      + (f" and {more} more" if more > 0 else ""))
