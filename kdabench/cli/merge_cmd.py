"""`kdabench merge`: join the shard receipts of one sharded run (qualify or bench) into one
receipt, with a bench run's plots."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from kdabench.cli.errors import Finding, UserError, print_error
from kdabench.receipts import (
    ReceiptError,
    atomic_write_bytes,
    load_receipt,
    merge_receipts,
    missing_shards,
    receipt_filename,
    render_receipt,
)


@click.command("merge")
@click.argument("out", type=click.Path(path_type=Path))
@click.argument("shards", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("--plot/--no-plot", default=True, show_default=True,
              help="Draw a merged bench receipt's plots (time against T per mode) as PNGs "
              "beside it; qualify receipts have none.")
def merge(out: Path, shards: tuple[Path, ...], force: bool, as_json: bool, plot: bool) -> None:
    """Join SHARD receipts (from `kdabench qualify --shard I/N` or `kdabench bench --shard
    I/N`) into the receipt OUT.

    The shards must verify, be complete, and share kind, sources, toolchain, device
    model and configuration (bench shards may differ in the ceilings and summary each
    measured: merged_from keeps them, and the summary is recomputed over every shape);
    case ids must not repeat. Cases are put back in matrix or shapes-file order and the
    merged receipt gets a new sha256. When OUT is a folder, the receipt is written there
    as <kind>-<device>-<time>.json. A merged bench receipt gets its plots beside it.

    Exit 0 when the merged receipt is written; 1 when it is written but some shard
    of the run is absent (the receipt is marked partial); 2 when the shards cannot be
    read or merged.
    """
    docs = []
    for path in shards:
        try:
            docs.append(load_receipt(path))
        except ReceiptError as error:
            raise UserError(str(error)) from error
    bench = docs[0].get("kind") == "bench"
    try:
        merged = _merger(docs[0].get("kind"))(
            docs, labels=[str(path) for path in shards], command_line=list(sys.argv)
        )
    except ReceiptError as error:
        raise UserError(f"cannot merge: {error}") from error

    if out.is_dir():
        out = out / receipt_filename(merged["kind"], merged["device"], merged["created_at"])
    resolved = out.resolve()
    if any(path.resolve() == resolved for path in shards):
        raise UserError(f"{out} is one of the shards; write the merged receipt elsewhere")
    if out.exists() and not force:
        raise UserError(f"{out} exists; pass --force to overwrite it or choose another path")
    try:
        atomic_write_bytes(out, render_receipt(merged))
    except OSError as error:
        raise UserError(f"cannot write {out}: {error.strerror or error}") from error

    plots, plot_error = _plots(merged, out) if bench and plot else ([], None)
    absent = missing_shards(merged)
    summary = merged["summary"]
    if as_json:
        click.echo(json.dumps({
            "out": str(out),
            "sha256": merged["sha256"],
            "kind": merged["kind"],
            "status": merged["status"],
            "summary": summary,
            "shards": merged["config"]["merged_from"],
            "missing_shards": absent,
            "plots": [str(path) for path in plots],
        }, indent=2, sort_keys=True))
    else:
        console = Console(highlight=False, soft_wrap=True)
        counts = ", ".join(f"{summary[v]} {v}" for v in ("pass", "fail", "error", "skip"))
        console.print(
            f"merged {len(docs)} {escape(merged['kind'])} shard receipt(s) -> "
            f"[bold]{escape(str(out))}[/bold]"
        )
        console.print(f"  {summary['total']} cases: {counts}")
        console.print(f"  status {merged['status']} · sha256 {merged['sha256'][:16]}…")
        for path in plots:
            console.print(f"  plot {escape(str(path))}")
    if plot_error:
        print_error(f"the plots were not drawn: {plot_error}", style="bold yellow")
    if absent:
        raise Finding(
            f"the merged receipt is partial: shard(s) {', '.join(absent)} are absent; "
            "merge again with every shard"
        )


def _merger(kind: Any) -> Callable[..., dict[str, Any]]:
    """The function that merges the shards: bench's (recomputes its summary), qualify's
    (recomputes its time totals) or the plain one."""
    if kind == "bench":
        from kdabench.bench import merge_bench_receipts

        return merge_bench_receipts
    if kind == "qualify":
        from kdabench.qualify.merge import merge_qualify_receipts

        return merge_qualify_receipts
    return merge_receipts


def _plots(merged: dict[str, Any], out: Path) -> tuple[list[Path], str | None]:
    """A merged bench receipt's plots beside it, and why they were not drawn (None: drawn)."""
    from kdabench.bench.plots import plot_receipt

    try:
        return plot_receipt(merged, out), None
    except Exception as error:  # noqa: BLE001 - a plot never loses the receipt
        return [], f"{type(error).__name__}: {error}"
