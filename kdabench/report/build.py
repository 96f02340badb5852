"""Assembly: the report's overview, one section per receipt, report.md written.

Inputs are receipt files or folders of them (every ``*.json`` directly inside a folder),
read and verified by :func:`kdabench.receipts.load_receipts` against the kernel sources in
hand. A receipt that fails verification is still rendered, under a warning in its section,
unless ``require_verified`` is given, which refuses it. Any kind without a section of its
own is listed with its cases' ids, verdicts and messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdabench.receipts import LoadedReceipt, ReceiptError, load_receipts
from kdabench.report.bench import bench_section
from kdabench.report.markdown import device_name, fmt_case_id, fmt_verdict, md_table
from kdabench.report.qualify import qualify_section
from kdabench.report.serve_sweep import serve_section

REPORT_NAME = "report.md"


class ReportError(ValueError):
    """An input cannot be reported (missing, not a receipt, refused); one line."""


def read_receipts(
    inputs: Iterable[str | Path], *, require_verified: bool = False,
    current_sources: Mapping[str, str] | None = None,
) -> list[LoadedReceipt]:
    """Read and verify every receipt named by ``inputs``, its source hashes against
    ``current_sources`` (default: the tree in hand). Raises :class:`ReportError` for an input
    that is not a readable receipt, or, with ``require_verified``, for a receipt that fails
    verification."""
    try:
        receipts = load_receipts(inputs, "tree" if current_sources is None else current_sources)
    except ReceiptError as error:
        raise ReportError(str(error)) from error
    bad = [r for r in receipts if not r.verified]
    if require_verified and bad:
        details = "; ".join(f"{r.path} ({', '.join(r.check.problems)})" for r in bad)
        raise ReportError(f"refusing {len(bad)} receipt(s) that fail verification: {details}")
    return receipts


def _other_section(receipt: LoadedReceipt) -> list[str]:
    return [f"Kind `{receipt.kind}` is not one this report knows; its cases are listed.", "",
            md_table(["#", "case", "verdict", "message"],
                     [[i + 1, fmt_case_id(case), fmt_verdict(case.get("verdict")),
                       case.get("message")] for i, case in enumerate(receipt.cases)]), ""]


SECTIONS = {"qualify": (qualify_section, "kernel-time"),
            "bench": (bench_section, "bench-time"),
            "serve-sweep": (serve_section, "ttft")}


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
    lines = [f"## {number}. {receipt.kind} · {device_name(doc)} · {doc.get('created_at')}", ""]
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
                       [[i + 1, f"`{r.path.name}`", r.kind, device_name(r.doc),
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
    receipts = read_receipts(inputs, require_verified=require_verified,
                             current_sources=current_sources)
    out_dir = Path(out_dir)
    text, plots = render_report(receipts, out_dir, title)
    markdown_path = out_dir / REPORT_NAME
    markdown_path.write_text(text, encoding="utf-8")
    return ReportResult(markdown_path, plots, receipts)
