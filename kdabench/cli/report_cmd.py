"""`kdabench report`: receipts rendered as a Markdown report with PNG plots, or their cases
as one CSV table."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kdabench.cli.errors import UserError, print_error
from kdabench.receipts import LoadedReceipt, atomic_write_bytes
from kdabench.report import ReportError, build_report, cases_table, read_receipts


@click.command("report")
@click.argument("receipts", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("kdabench-report"),
    show_default=True,
    help="Folder to write report.md and the PNG plots into (created if absent).",
)
@click.option("--title", default=None, help="Title of the report (default: 'kdabench report').")
@click.option(
    "--require-verified",
    is_flag=True,
    help="Refuse (exit 2, nothing written) when a receipt fails verification; by default it "
    "is rendered and marked NOT VERIFIED.",
)
@click.option(
    "--csv",
    "csv_path",
    default=None,
    metavar="FILE",
    help="Instead of the Markdown report, write every case of every receipt as one CSV table "
    "to FILE ('-' for stdout): one row per case per receipt.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the written paths as JSON.")
def report(
    receipts: tuple[Path, ...], out_dir: Path, title: str | None, require_verified: bool,
    csv_path: str | None, as_json: bool,
) -> None:
    """Write a Markdown report with PNG plots of each RECEIPT (a file or a folder of them).

    qualify receipts: a summary by scenario and by matrix axis (cases, pass/fail, worst
    output and state error against the tolerance), every case with its verdict and errors,
    and a plot of kernel time against T per head count. bench receipts: time per shape and
    kernel with the floor, and a plot of time against T. serve-sweep receipts: TTFT per arm
    and prompt size with confidence intervals (table and plot) and decode rates. Receipts of
    other kinds are listed with their cases. The report names every case of every receipt.

    With --csv FILE, writes instead one CSV table of every case of every receipt, one row
    per case per receipt, with the columns receipt (file name), kind, backend, device,
    verified, case, verdict, scenario, arm, kernel, mode, tokens, seqs, heads, head_dim,
    prompt_tokens, median_ms, ci_low_ms, ci_high_ms (a seeded bootstrap 95% interval of the
    median of the raw samples) and n_samples; a field a kind lacks is empty (--out and
    --title are the Markdown report's). The same table from Python, as a pandas DataFrame:
    kdabench.report.report_table(paths).

    Prints the paths written (report.md first), one a line. Exit 0 when the report (or the
    table) is written; 2 when an input is not a readable receipt, a receipt fails
    verification under --require-verified, or the output cannot be written.
    """
    if csv_path is not None:
        _write_csv(receipts, csv_path, require_verified=require_verified, as_json=as_json)
        return
    try:
        result = build_report(receipts, out_dir, title=title, require_verified=require_verified)
    except ReportError as error:
        raise UserError(str(error)) from error
    except OSError as error:
        raise UserError(
            f"cannot write the report into {out_dir}: {error.strerror or error}"
        ) from error

    _warn_unverified(result.unverified, "it is rendered and marked NOT VERIFIED")
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        for path in result.paths:
            click.echo(str(path))


def _warn_unverified(receipts: list[LoadedReceipt], consequence: str) -> None:
    for receipt in receipts:
        print_error(
            f"warning: {receipt.path} fails verification ({'; '.join(receipt.check.problems)}); "
            f"{consequence}",
            style="bold yellow",
        )


def _write_csv(receipts: tuple[Path, ...], csv_path: str, *, require_verified: bool,
               as_json: bool) -> None:
    """`report --csv FILE`: the cases table written to FILE, or to stdout for '-'."""
    if csv_path == "-" and as_json:
        raise UserError("--csv - and --json both write to stdout; give --csv a FILE")
    try:
        loaded = read_receipts(receipts, require_verified=require_verified)
    except ReportError as error:
        raise UserError(str(error)) from error
    table = cases_table(loaded)
    text = table.to_csv(index=False, lineterminator="\n")
    _warn_unverified([r for r in loaded if not r.verified],
                     "its rows say verified False")
    if csv_path == "-":
        click.echo(text, nl=False)
        return
    try:
        atomic_write_bytes(Path(csv_path), text.encode("utf-8"))
    except OSError as error:
        raise UserError(f"cannot write {csv_path}: {error.strerror or error}") from error
    if as_json:
        click.echo(json.dumps({"csv": csv_path, "rows": len(table),
                               "receipts": [str(r.path) for r in loaded]},
                              indent=2, sort_keys=True))
    else:
        click.echo(csv_path)
