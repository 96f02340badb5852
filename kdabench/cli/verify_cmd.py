"""`kdabench verify`: re-check receipts' hashes and their sources against the tree in hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from kdabench.cli.errors import Finding, UserError
from kdabench.receipts import ReceiptError, Verification, verify_file
from kdabench.receipts.files import receipt_files
from kdabench.sources import source_hashes


def _device_line(device: dict[str, Any]) -> str:
    name = device.get("name") or "unknown device"
    details = [device.get("kind")]
    if device.get("compute_capability"):
        details.append(f"cc {device['compute_capability']}")
    details = [str(item) for item in details if item]
    return f"{name} ({', '.join(details)})" if details else str(name)


def _counts_line(summary: dict[str, Any]) -> str:
    total = summary.get("total", 0)
    parts = ", ".join(f"{summary.get(v, 0)} {v}" for v in ("pass", "fail", "error", "skip"))
    return f"{total} cases: {parts}"


def _render(console: Console, check: Verification) -> None:
    console.print(f"[bold]{escape(str(check.path))}[/bold]")
    if check.ok:
        console.print(f"  hash     [green]ok[/green] (sha256 {check.recomputed[:16]}…)")
    else:
        console.print("  hash     [bold red]FAILED[/bold red]")
        for problem in check.problems:
            console.print(f"           [red]{escape(problem)}[/red]")
    if check.status == "complete":
        status_text = "[green]complete[/green]"
    elif check.status == "partial":
        status_text = "[yellow]partial (interrupted run)[/yellow]"
    else:
        status_text = f"[yellow]{escape(str(check.status))}[/yellow]"
    console.print(
        f"  receipt  {escape(str(check.kind))} · {escape(_device_line(check.device))} · "
        f"{status_text} · {escape(_counts_line(check.summary))}"
    )
    commit = check.git.get("commit")
    commit_text = commit[:12] if isinstance(commit, str) else "no commit"
    if check.git.get("dirty"):
        commit_text += " (dirty)"
    console.print(
        f"  made     {escape(str(check.created_at))} · kdabench {escape(str(check.tool_version))}"
        f" · {escape(commit_text)}"
    )
    if check.resealed:
        previous = str(check.resealed.get("previous_sha256"))[:16]
        console.print(
            f"  resealed {escape(str(check.resealed.get('at')))} from sha256 {escape(previous)}…"
        )
    diff = check.sources
    if diff.match:
        console.print(
            f"  sources  [green]match the tree in hand[/green] ({len(diff.matching)} files)"
        )
    else:
        console.print("  sources  [yellow]differ from the tree in hand[/yellow]")
        for label, names in (("changed", diff.changed), ("missing", diff.missing),
                             ("added", diff.added)):
            for name in names:
                console.print(f"           [yellow]{label:8}[/yellow] {escape(name)}")


@click.command("verify")
@click.argument("receipts", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--require-sources-match",
    is_flag=True,
    help="Also exit 1 when a receipt's kernel/oracle source hashes differ from the tree "
    "in hand (by default that is reported as a warning).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def verify(receipts: tuple[Path, ...], require_sources_match: bool, as_json: bool) -> None:
    """Check that each RECEIPT is intact and say whether it matches the sources in hand.

    A RECEIPT is a file or a folder (every *.json directly in it). For each receipt: whether its sha256 verifies (any edited byte of the file fails),
    its kind, device, status and case counts, and whether the kernel and oracle source
    hashes it recorded match this tree (files that differ are listed).

    Exit 0 when every receipt verifies; 1 when one does not (or, with
    --require-sources-match, when its sources differ); 2 when a file cannot be read or
    is not a receipt.
    """
    try:
        current = source_hashes()
    except ModuleNotFoundError as error:
        raise UserError(f"cannot hash the sources in hand: {error}; reinstall kdabench") from error

    checks: list[Verification] = []
    unreadable: list[str] = []
    for path in receipt_files(receipts, UserError):
        try:
            checks.append(verify_file(path, current))
        except ReceiptError as error:
            unreadable.append(str(error))

    if as_json:
        results = [check.to_dict() for check in checks]
        results += [{"ok": False, "error": message} for message in unreadable]
        click.echo(json.dumps(results, indent=2, sort_keys=True))
    else:
        console = Console(highlight=False, soft_wrap=True)
        for check in checks:
            _render(console, check)

    if unreadable:
        raise UserError(
            unreadable[0] if len(unreadable) == 1
            else f"{len(unreadable)} files are not readable receipts: {'; '.join(unreadable)}"
        )
    failed = [check for check in checks if not check.ok]
    if failed:
        names = ", ".join(str(check.path) for check in failed)
        raise Finding(f"{len(failed)} of {len(checks)} receipt(s) do not verify: {names}")
    mismatched = [check for check in checks if not check.sources_match]
    if mismatched and require_sources_match:
        names = ", ".join(str(check.path) for check in mismatched)
        raise Finding(
            f"{len(mismatched)} receipt(s) were made from other kernel/oracle sources: {names}"
        )
    if not as_json:
        note = ""
        if mismatched:
            note = f" ({len(mismatched)} made from other sources than the tree in hand)"
        console.print(f"[green]{len(checks)} receipt(s) verify[/green]{escape(note)}")
