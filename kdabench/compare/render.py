"""Rendering a comparison: cell formats shared with the CLI's table, and the Markdown comment."""

from __future__ import annotations

from kdabench.compare.cases import CaseComparison
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


def _markdown_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(comparison: Comparison) -> str:
    """A Markdown comment for a pull request: summary line, warnings as a blockquote,
    one table row per case (regressions first)."""
    mark = "❌" if comparison.has_regression else "✅"
    lines = [f"**kdabench compare** {mark} {comparison.summary_line()}", ""]
    if comparison.warnings:
        lines += [f"> ⚠️ {_markdown_cell(message)}" for message in comparison.warnings]
        lines.append("")
    multi = len({(c.kind, c.device) for c in comparison.cases}) > 1
    header = (["kind", "device"] if multi else []) + [
        "case", "verdict", "base ms", "head ms", "ratio",
        f"{comparison.options.confidence * 100:g}% CI", "p", "correctness", "note"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(" --- " for _ in header) + "|")
    for case in comparison.cases:
        verdict = f"**{case.verdict}**" if case.is_regression else case.verdict
        correctness = f"{case.base_verdict or '—'} → {case.head_verdict or '—'}"
        row = ([case.kind, case.device] if multi else []) + [
            f"`{case.id}`", verdict, format_ms(case.base_median_ms),
            format_ms(case.head_median_ms), format_ratio(case), format_interval(case),
            format_p(case), correctness, case.note]
        lines.append("| " + " | ".join(_markdown_cell(cell) for cell in row) + " |")
    return "\n".join(lines) + "\n"
