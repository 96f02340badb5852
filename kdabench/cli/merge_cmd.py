"""`kdabench merge`: join the shard receipts of one sharded run into one receipt."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from kdabench.cli.errors import EXIT_CODES_HELP, Finding, UserError
from kdabench.receipts import (
    ReceiptError,
    atomic_write_bytes,
    load_receipt,
    merge_receipts,
    missing_shards,
    receipt_filename,
    render_receipt,
)


@click.command("merge", epilog=EXIT_CODES_HELP)
@click.argument("out", type=click.Path(path_type=Path))
@click.argument("shards", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def merge(out: Path, shards: tuple[Path, ...], force: bool, as_json: bool) -> None:
    """Join SHARD receipts (from `kdabench qualify --shard I/N`) into the receipt OUT.

    The shards must verify, be complete, and share kind, sources, toolchain, device
    model and matrix configuration; case ids must not repeat. Cases are put back in
    matrix order and the merged receipt gets a new sha256. When OUT is a folder, the
    receipt is written there as <kind>-<device>-<time>.json.

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
    try:
        merged = merge_receipts(
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
    if absent:
        raise Finding(
            f"the merged receipt is partial: shard(s) {', '.join(absent)} are absent; "
            "merge again with every shard"
        )
