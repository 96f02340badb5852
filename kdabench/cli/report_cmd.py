"""`kdabench report`: receipts rendered as a Markdown report with PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kdabench.cli.errors import UserError, print_error
from kdabench.report import ReportError, build_report


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
@click.option("--json", "as_json", is_flag=True, help="Print the written paths as JSON.")
def report(
    receipts: tuple[Path, ...], out_dir: Path, title: str | None, require_verified: bool,
    as_json: bool,
) -> None:
    """Write a Markdown report with PNG plots of each RECEIPT (a file or a folder of them).

    qualify receipts: a summary by scenario and by matrix axis (cases, pass/fail, worst
    output and state error against the tolerance), every case with its verdict and errors,
    and a plot of kernel time against T per head count. bench receipts: time per shape and
    kernel with the floor, and a plot of time against T. serve-sweep receipts: TTFT per arm
    and prompt size with confidence intervals (table and plot) and decode rates. Receipts of
    other kinds are listed with their cases. The report names every case of every receipt.

    Prints the paths written (report.md first), one a line. Exit 0 when the report is
    written; 2 when an input is not a readable receipt, a receipt fails verification under
    --require-verified, or the report cannot be written.
    """
    try:
        result = build_report(receipts, out_dir, title=title, require_verified=require_verified)
    except ReportError as error:
        raise UserError(str(error)) from error
    except OSError as error:
        raise UserError(
            f"cannot write the report into {out_dir}: {error.strerror or error}"
        ) from error

    for receipt in result.unverified:
        print_error(
            f"warning: {receipt.path} fails verification ({'; '.join(receipt.check.problems)}); "
            "it is rendered and marked NOT VERIFIED",
            style="bold yellow",
        )
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        for path in result.paths:
            click.echo(str(path))
