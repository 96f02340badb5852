"""`kdabench reseal`: rewrite the machine paths older receipts hold and seal them again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from kdabench.cli.errors import UserError
from kdabench.receipts import ReceiptError, atomic_write_bytes, read_receipt, render_receipt
from kdabench.receipts.files import receipt_files
from kdabench.receipts.reseal import reseal as reseal_receipt


@click.command("reseal")
@click.argument("receipts", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--dry-run", is_flag=True, help="Only report what would be rewritten; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def reseal(receipts: tuple[Path, ...], dry_run: bool, as_json: bool) -> None:
    """Rewrite the absolute machine paths in each RECEIPT as receipts record them now, and
    seal it again in place.

    A RECEIPT is a file or a folder (every *.json directly in it). In command_line the
    program is recorded by its name and every other absolute path by its last component
    (/root/out/results -> results); in any other string, so is each absolute path of two
    components or more ("not in /work/main/profiles)" -> "not in profiles)"). Nothing else
    changes: numbers, sources, git and created_at never do.

    A resealed receipt gets a top-level field "resealed": the sha256 it had before, the
    time, the kdabench version, and the JSON pointers of the values rewritten (never their
    old values). It verifies with `kdabench verify`, which shows the reseal. A receipt that
    holds no absolute path is left byte for byte as it is ("nothing to rewrite"). Every
    RECEIPT is read and checked before any is written; each is replaced atomically.

    Exit 0 when every receipt was resealed or had nothing to rewrite; 2 when a file cannot be
    read, is not a receipt, or does not verify (a tampered receipt is never resealed).
    """
    results: list[tuple[Path, dict[str, Any], dict[str, Any], list[str]]] = []
    for path in receipt_files(receipts, UserError):
        try:
            doc, raw = read_receipt(path)
        except ReceiptError as error:
            raise UserError(str(error)) from error
        try:
            resealed, rewritten = reseal_receipt(doc, raw=raw)
        except ReceiptError as error:
            raise UserError(f"{path}: {error}") from error
        results.append((path, doc, resealed, rewritten))

    written: set[Path] = set()
    for path, _, resealed, rewritten in results:
        if rewritten and not dry_run:
            try:
                atomic_write_bytes(path, render_receipt(resealed))
            except OSError as error:
                raise UserError(f"cannot write {path}: {error.strerror or error}") from error
            written.add(path)

    if as_json:
        click.echo(json.dumps([
            {"path": str(path), "rewritten": rewritten, "previous_sha256": doc["sha256"],
             "sha256": resealed["sha256"] if path in written else doc["sha256"],
             "written": path in written}
            for path, doc, resealed, rewritten in results
        ], indent=2, sort_keys=True))
        return
    console = Console(highlight=False, soft_wrap=True)
    for path, doc, resealed, rewritten in results:
        name, before = escape(str(path)), doc["sha256"][:16]
        if not rewritten:
            console.print(f"{name}: nothing to rewrite")
        elif dry_run:
            console.print(f"{name}: would reseal, {len(rewritten)} value(s) to rewrite "
                          f"(sha256 {before}…)")
        else:
            console.print(f"{name}: resealed, {len(rewritten)} value(s) rewritten, "
                          f"sha256 {before}… -> {resealed['sha256'][:16]}…")
