"""Rendering a comparison: cell formats and the pairing lines shared with the CLI's table,
and the Markdown comment."""

from __future__ import annotations

from collections.abc import Callable

from kdabench.compare.cases import CaseComparison
from kdabench.compare.groups import Group
from kdabench.compare.pairing import Comparison

# --------------------------------------------------------------------------- rendering


def format_ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def format_ratio(case: CaseComparison) -> str:
    return "—" if case.ratio is None else f"{case.ratio:.3f}"


def format_interval(case: CaseComparison) -> str:
    if case.ci_low is None or case.ci_high is None:
        return "—"
    return f"{case.ci_low:.3f}–{case.ci_high:.3f}"


def format_p(case: CaseComparison) -> str:
    return "—" if case.p_value is None else f"{case.p_value:.2g}"


def has_several_groups(comparison: Comparison) -> bool:
    """Whether the cases come from more than one (kind, backend, device): the table then
    names each case's."""
    return len({(c.kind, c.backend, c.device) for c in comparison.cases}) > 1


def pairing_lines(comparison: Comparison, path: Callable[[str], str] = str) -> list[str]:
    """A line per pair ('qualify, triton, NVIDIA H200: BASE a.json against HEAD b.json') and
    per unmatched receipt ('unmatched in BASE: x.json (qualify, cute, NVIDIA H200): no
    receipt of ...'); ``path`` formats a receipt's path."""
    lines = [f"{pair.describe()}: BASE {_group_receipts(pair.base, path)} against HEAD "
             f"{_group_receipts(pair.head, path)}" for pair in comparison.pairs]
    return lines + [f"unmatched in {receipt.side}: {path(receipt.path)} "
                    f"({receipt.key.describe()}): {receipt.reason}"
                    for receipt in comparison.unmatched]


def _group_receipts(group: Group, path: Callable[[str], str]) -> str:
    """'a.json, b.json (+2 superseded)': the receipts whose cases are compared, and how many
    older ones a newer receipt replaced entirely."""
    used = ", ".join(path(str(part.receipt.path)) for part in group.used) or "no case"
    superseded = len(group.superseded)
    return f"{used} (+{superseded} superseded)" if superseded else used


def _markdown_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(comparison: Comparison) -> str:
    """A Markdown comment for a pull request: summary line, warnings as a blockquote, which
    receipts were paired with which, one table row per case (regressions first)."""
    mark = "❌" if comparison.has_regression else "✅"
    lines = [f"**kdabench compare** {mark} {comparison.summary_line()}", ""]
    if comparison.warnings:
        lines += [f"> ⚠️ {_markdown_cell(message)}" for message in comparison.warnings]
        lines.append("")
    lines += [f"{comparison.pairing_heading().capitalize()}:", ""]
    lines += [f"- {line}" for line in pairing_lines(comparison, lambda path: f"`{path}`")]
    lines.append("")
    multi = has_several_groups(comparison)
    header = (["kind", "backend", "device"] if multi else []) + [
        "case", "verdict", "base ms", "head ms", "ratio",
        f"{comparison.options.confidence * 100:g}% CI", "p", "correctness", "note"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(" --- " for _ in header) + "|")
    for case in comparison.cases:
        verdict = f"**{case.verdict}**" if case.is_regression else case.verdict
        correctness = f"{case.base_verdict or '—'} → {case.head_verdict or '—'}"
        row = ([case.kind, case.backend or "—", case.device] if multi else []) + [
            f"`{case.id}`", verdict, format_ms(case.base_median_ms),
            format_ms(case.head_median_ms), format_ratio(case), format_interval(case),
            format_p(case), correctness, case.note]
        lines.append("| " + " | ".join(_markdown_cell(cell) for cell in row) + " |")
    return "\n".join(lines) + "\n"
