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

from kdabench.cli.errors import EXIT_CODES_HELP, Finding, UserError
from kdabench.compare import (
    CompareError,
    Comparison,
    compare_paths,
    format_interval,
    format_ms,
    format_p,
    format_ratio,
    parse_threshold,
    render_markdown,
)
from kdabench.receipts import atomic_write_bytes

_FILE_WIDTH = 200  # columns of a table written to a file or a pipe

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
    """Warnings first, then one row per case, then the summary line."""
    for message in comparison.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(message)}", soft_wrap=True)
    multi = len({(c.kind, c.device) for c in comparison.cases}) > 1
    table = Table(show_lines=False, header_style="bold")
    if multi:
        table.add_column("kind")
        table.add_column("device")
    table.add_column("case", overflow="fold")
    table.add_column("verdict", no_wrap=True)
    for name in ("base ms", "head ms", "ratio",
                 f"{comparison.options.confidence * 100:g}% CI", "p"):
        table.add_column(name, justify="right")
    table.add_column("correctness", no_wrap=True)
    table.add_column("note")
    for case in comparison.cases:
        cells = [case.kind, case.device] if multi else []
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


@click.command("compare", epilog=EXIT_CODES_HELP)
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
@click.option("--no-verify", is_flag=True,
              help="Compare receipts that fail verification (with a warning) instead of refusing.")
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the output, in the chosen format, to this file.")
def compare(base: Path, head: Path, threshold: float, alpha: float, output_format: str,
            no_verify: bool, out: Path | None) -> None:
    """Compare the receipts HEAD against BASE, case by case.

    BASE and HEAD are receipt files or folders of receipts (every *.json in the folder);
    cases are matched by receipt kind, device name and case id. For each case: the
    medians of the raw samples, the ratio HEAD/BASE, a Mann-Whitney test (two-sided),
    a bootstrap 95% interval of the ratio, and a verdict. A bench case is judged by
    kdabench's samples (capacity 4) in a timing mode both sides ran (BASE's primary
    mode, CUDA-graph replay unless only eager ran); its note gives each side's fla
    ratio, fla having run on the same inputs in each receipt:

    \b
      failed     passed in BASE, does not pass in HEAD (whatever the timing)
      regressed  ratio above 1 + threshold and p below alpha
      improved   ratio below 1 - threshold and p below alpha, or now passes
      unchanged  anything else; a case without samples compares correctness only
      new        only in HEAD
      missing    only in BASE

    Warnings come first: device, toolchain or kernel/oracle sources that differ between
    the sides, partial receipts. A receipt that does not verify is refused unless
    --no-verify.

    Exit 0 when nothing regressed; 1 when a case regressed or failed; 2 when the input
    cannot be compared (unreadable, not a receipt, does not verify, mismatched kinds,
    no case in common).
    """
    try:
        comparison = compare_paths(base, head, threshold=threshold, alpha=alpha,
                                   verify=not no_verify)
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
