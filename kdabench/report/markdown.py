"""Markdown formatting: numbers, errors, verdicts and GitHub tables as report text."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}"


def fmt_err(value: float | None, tolerance: float | None = None) -> str:
    """An error, with its share of the tolerance: "2.18e-03 (44%)"."""
    if value is None:
        return "-"
    text = f"{value:.2e}" if math.isfinite(value) else str(value)
    if tolerance and math.isfinite(value):
        text += f" ({100 * value / tolerance:.0f}%)"
    return text


def fmt_count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _cell(value: Any) -> str:
    text = "-" if value is None or value == "" else str(value)
    return " ".join(text.replace("|", "\\|").split())


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub Markdown table ('|' inside cells escaped, newlines folded)."""
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |",
             "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_verdict(verdict: Any) -> str:
    return f"**{str(verdict).upper()}**" if verdict in ("fail", "error") else str(verdict)


def fmt_case_id(case: Mapping[str, Any]) -> str:
    return f"`{case.get('id')}`"


def device_name(doc: Mapping[str, Any]) -> str:
    device = doc.get("device") if isinstance(doc.get("device"), dict) else {}
    name = str(device.get("name") or "unknown device")
    if device.get("compute_capability"):
        name += f" (cc {device['compute_capability']})"
    return name
