"""The section of a serve-sweep receipt (``kdabench serve-sweep``,
:mod:`kdabench.sweep.runner`; read defensively).

Fields read: ``kind`` per case: "cold-ttft" (or "ttft", or absent) cases are TTFT cells;
others ("decode", "probe", "server", "shared-prefix", "failure") are never read as TTFT.
``arm``; prompt size ``prompt_tokens_requested`` (or ``prompt_tokens``, ``prompt_size``);
TTFT samples ``ttft_samples_ms`` (or ``ttft_ms.samples``, ``ttft.samples_ms``,
``samples_ms``), median ``ttft_median_ms`` (or ``ttft_ms.median``, ``ttft.median_ms``,
``median_ms``; else the median of the samples), 95% interval ``ttft_ci_ms`` (or
``ttft_ms.ci``, ``ttft.ci_ms``, ``ci95_ms``, ``ci_ms``; [low, high] or {"low", "high"}; else
a seeded bootstrap of the samples, :func:`kdabench.stats.bootstrap_ci`, marked as computed
here); ``rate_tok_s`` (else prompt tokens over the median); ``valid`` false marks an arm
whose activation checks failed; verdict "skip" with ``status`` "unverified" marks a cell
whose samples the server did not show cold (no cached-token count in usage or /metrics):
cold by construction only.
Decode: ``tokens_per_s`` (or ``decode_tokens_per_s``, ``decode.tokens_per_s``),
``acceptance_length`` (or ``decode.acceptance_length``), ``steps_per_s`` (or
``decode_steps_per_s``, ``decode.steps_per_s``; else tokens/s over the acceptance
length). Rendered: a TTFT table and plot per arm and prompt size with the intervals,
prompt tokens per second, and a decode-rate table; unverified cells and cases say so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdabench import stats
from kdabench.receipts import LoadedReceipt
from kdabench.report.fields import finite_numbers, get_field, to_number
from kdabench.report.markdown import (
    device_name,
    fmt_case_id,
    fmt_count,
    fmt_ms,
    fmt_verdict,
    md_table,
)
from kdabench.report.plotting import new_figure, save_png
from kdabench.report.serve_servers import server_lines, shared_prefix_lines
from kdabench.sweep.contrasts import contrasts

TTFT_KINDS = (None, "cold-ttft", "ttft")  # case["kind"] of a TTFT cell (None: unmarked)
UNVERIFIED = "unverified"
UNVERIFIED_NOTE = ("**unverified** marks a cell whose samples the server did not show cold "
                   "(it reported no cached-token count, in usage or /metrics): they are cold "
                   "by construction (unique from the first token), not verified by the "
                   "server.")


@dataclass
class ServePoint:
    """One case of a serve-sweep receipt: TTFT of an arm at a prompt size, decode rates, or
    neither (a probe, a server record)."""

    case_id: str
    kind: str | None
    arm: str
    prompt_tokens: float | None
    samples: list[float]
    median_ms: float | None
    ci_ms: tuple[float, float] | None
    ci_computed: bool
    rate_tok_s: float | None
    valid: bool
    unverified: bool  # neither passed nor failed: the server gave no cache evidence
    tokens_per_s: float | None
    acceptance_length: float | None
    steps_per_s: float | None

    @property
    def has_ttft(self) -> bool:
        return self.median_ms is not None and math.isfinite(self.median_ms)

    @property
    def has_decode(self) -> bool:
        return self.tokens_per_s is not None or self.steps_per_s is not None


def _interval(value: Any) -> tuple[float, float] | None:
    if isinstance(value, Mapping):
        value = [get_field(value, "low", "lo"), get_field(value, "high", "hi")]
    if isinstance(value, (list, tuple)) and len(value) == 2:
        low, high = to_number(value[0]), to_number(value[1])
        if low is not None and high is not None:
            return low, high
    return None


def serve_point(case: Mapping[str, Any]) -> ServePoint:
    """Read one serve-sweep case (field names: the module docstring)."""
    kind = case.get("kind") if isinstance(case.get("kind"), str) else None
    samples: list[float] = []
    median = interval = None
    computed = False
    if kind in TTFT_KINDS:
        samples = finite_numbers(get_field(case, "ttft_samples_ms", "ttft_ms.samples",
                                           "ttft.samples_ms", "samples_ms"))
        median = to_number(get_field(case, "ttft_median_ms", "ttft_ms.median", "ttft.median_ms",
                                     "median_ms"))
        if median is None:
            median = to_number(case.get("ttft_ms"))
        if median is None:
            median = stats.median(samples)
        interval = _interval(get_field(case, "ttft_ci_ms", "ttft_ms.ci", "ttft.ci_ms",
                                       "ci95_ms", "ci_ms"))
        if interval is None and len(samples) >= 2:
            interval, computed = stats.bootstrap_ci(samples), True
    prompt = to_number(get_field(case, "prompt_tokens_requested", "prompt_tokens",
                                 "prompt_size", "params.prompt_tokens"))
    rate = to_number(case.get("rate_tok_s"))
    if rate is None and median:
        actual = to_number(case.get("prompt_tokens")) or prompt
        rate = actual / (median / 1000.0) if actual else None
    tokens_per_s = to_number(get_field(case, "decode_tokens_per_s", "decode.tokens_per_s",
                                       "tokens_per_s"))
    acceptance = to_number(get_field(case, "acceptance_length", "decode.acceptance_length"))
    steps = to_number(get_field(case, "decode_steps_per_s", "decode.steps_per_s",
                                "steps_per_s", "decode_steps_per_s_normalized",
                                "decode.normalized_steps_per_s"))
    if steps is None and tokens_per_s is not None and acceptance:
        steps = tokens_per_s / acceptance
    return ServePoint(
        case_id=str(case.get("id")), kind=kind,
        arm=str(get_field(case, "arm", "params.arm") or "-"), prompt_tokens=prompt,
        samples=samples, median_ms=median, ci_ms=interval, ci_computed=computed,
        rate_tok_s=rate, valid=case.get("valid") is not False, unverified=is_unverified(case),
        tokens_per_s=tokens_per_s, acceptance_length=acceptance, steps_per_s=steps,
    )


def is_unverified(case: Mapping[str, Any]) -> bool:
    """True for a case the sweep recorded as unverified (verdict "skip", status said so)."""
    return case.get("verdict") == "skip" and case.get("status") == UNVERIFIED


def _verdict_text(case: Mapping[str, Any]) -> str:
    return UNVERIFIED if is_unverified(case) else fmt_verdict(case.get("verdict"))


def _arm_label(arm: str, invalid: set[str], unverified: set[str]) -> str:
    if arm in invalid:
        return f"{arm} (NOT VALID)"
    return f"{arm} ({UNVERIFIED})" if arm in unverified else arm


def _tokens_label(tokens: float | None) -> str:
    if tokens is None:
        return "?"
    if tokens >= 1024 and tokens % 1024 == 0:
        return f"{tokens / 1024:.0f}K"
    return f"{tokens:,.0f}"


def plot_serve(points: Sequence[ServePoint], path: Path, device: str) -> bool:
    """Median TTFT per arm and prompt size with interval bars, and prompt tokens/s; False
    when no point has a TTFT."""
    usable = [p for p in points if p.has_ttft]
    if not usable:
        return False
    sizes = sorted({p.prompt_tokens for p in usable}, key=lambda t: (t is None, t or 0))
    arms = list(dict.fromkeys(p.arm for p in usable))
    invalid_arms = {p.arm for p in usable if not p.valid}
    unverified_arms = {p.arm for p in usable if p.unverified}
    figure, (ttft, rate) = new_figure(13.0, 5.6, ncols=2)
    width = 0.8 / max(len(arms), 1)
    for index, arm in enumerate(arms):
        mine = {p.prompt_tokens: p for p in usable if p.arm == arm}
        xs = [sizes.index(t) - 0.4 + width * (index + 0.5) for t in sizes if t in mine]
        chosen = [mine[t] for t in sizes if t in mine]
        below = [p.median_ms - p.ci_ms[0] if p.ci_ms else 0.0 for p in chosen]
        above = [p.ci_ms[1] - p.median_ms if p.ci_ms else 0.0 for p in chosen]
        color = f"C{index % 10}"
        ttft.errorbar(xs, [p.median_ms for p in chosen],
                      yerr=[[max(b, 0.0) for b in below], [max(a, 0.0) for a in above]],
                      fmt="o", color=color, capsize=4,
                      label=_arm_label(arm, invalid_arms, unverified_arms))
        rate.bar(xs, [p.rate_tok_s or 0.0 for p in chosen], width=width * 0.9, color=color,
                 label=arm)
    for panel in (ttft, rate):
        panel.set_xticks(range(len(sizes)), [_tokens_label(t) for t in sizes])
        panel.set_xlabel("prompt size (tokens)")
        panel.grid(True, axis="y", alpha=0.4)
    ttft.legend(title="arm", fontsize="small", loc="upper left")
    rate.set_ylim(top=rate.get_ylim()[1] * 1.08)
    ttft.set_ylabel("median cold TTFT (ms)")
    ttft.set_title("TTFT per arm (bars: 95% confidence interval)")
    ttft.set_ylim(bottom=0)
    rate.set_ylabel("prompt tokens / median TTFT (tokens/s)")
    rate.set_title("prefill rate per arm (colours as on the left)")
    figure.suptitle(f"Cold time to first token per arm and prompt size · {device}")
    save_png(figure, path)
    return True


def serve_section(receipt: LoadedReceipt, plot_path: Path) -> tuple[list[str], list[Path]]:
    cases = receipt.cases
    points = [serve_point(case) for case in cases]
    arm_order = {arm: i for i, arm in enumerate(dict.fromkeys(p.arm for p in points))}
    timed = sorted((p for p in points if p.has_ttft),
                   key=lambda p: (p.prompt_tokens or 0, arm_order[p.arm]))
    lines = [*server_lines(receipt.doc), "#### Cold TTFT per arm and prompt size", ""]
    if timed:
        def interval(p: ServePoint) -> str:
            if not p.ci_ms:
                return "-"
            text = f"{fmt_ms(p.ci_ms[0])} – {fmt_ms(p.ci_ms[1])}"
            return text + " (bootstrap here)" if p.ci_computed else text

        lines += [("Prompt tokens/s is prompt tokens over median TTFT. An arm whose activation "
                  "checks failed is marked NOT VALID: its numbers are not evidence."), ""]
        if any(p.unverified for p in timed):
            lines += [UNVERIFIED_NOTE, ""]
        lines += [md_table(["arm", "prompt tokens", "samples", "median TTFT (ms)",
                            "95% CI (ms)", "prompt tokens/s", "valid"],
                           [[p.arm, fmt_count(p.prompt_tokens), len(p.samples),
                             fmt_ms(p.median_ms), interval(p), fmt_count(p.rate_tok_s),
                             _validity(p)] for p in timed]), ""]
    else:
        lines += ["No case carries a TTFT.", ""]
    plots = []
    if plot_serve(points, plot_path, device_name(receipt.doc)):
        plots.append(plot_path)
        lines += [f"![TTFT per arm and prompt size]({plot_path.name})", ""]
    shared, shared_plots = shared_prefix_lines(
        receipt.doc, cases, plot_path.with_name(f"{plot_path.stem}-shared-prefix.png"))
    lines += shared
    plots += shared_plots
    lines += contrast_lines(receipt.doc)
    decode = [p for p in points if p.has_decode]
    lines += ["#### Decode rates", ""]
    if decode:
        lines += [("Steps/s is output tokens/s divided by the speculative-decoding acceptance "
                  "length (1 without speculation)."), "",
                  md_table(["arm", "prompt tokens", "output tokens/s", "acceptance length",
                            "steps/s", "valid"],
                           [[p.arm, fmt_count(p.prompt_tokens), _fmt_rate(p.tokens_per_s),
                             _fmt_rate(p.acceptance_length), _fmt_rate(p.steps_per_s),
                             "yes" if p.valid else "**NOT VALID**"] for p in decode]), ""]
    else:
        lines += ["No case carries a decode rate.", ""]
    lines += ["#### Cases", "",
              md_table(["#", "case", "kind", "verdict", "arm", "prompt tokens",
                        "median TTFT (ms)", "decode steps/s", "message"],
                       [[i + 1, fmt_case_id(case), p.kind, _verdict_text(case), p.arm,
                         fmt_count(p.prompt_tokens), fmt_ms(p.median_ms),
                         _fmt_rate(p.steps_per_s), case.get("message")]
                        for i, (case, p) in enumerate(zip(cases, points, strict=True))]),
              ""]
    return lines, plots


def contrast_lines(doc: Mapping[str, Any]) -> list[str]:
    """Each arm against the sweep's baseline arm (kdabench.sweep.contrasts), where the
    receipt names one."""
    options = (doc.get("config") or {}).get("options") or {}
    baseline = options.get("baseline")
    if baseline is None:
        return []
    rows = contrasts(doc.get("cases") or [], baseline, seed=options.get("seed") or 0)
    lines = [f"#### Against {baseline}", ""]
    if not rows:
        return lines + [(f"No prompt size or shared-prefix case was measured by {baseline} "
                         "and another arm."), ""]
    return lines + [
        ("Median of the arm over median of the baseline, with a bootstrap 95% interval of the "
         "ratio (each side resampled); under 1, the arm is faster."), "",
        md_table(["arm", "case", "arm median (ms)", "baseline median (ms)", "ratio", "95% CI"],
                 [[row.arm, row.label, fmt_ms(row.arm_median_ms),
                   fmt_ms(row.baseline_median_ms),
                   "-" if row.ratio is None else f"{row.ratio:.3f}",
                   "-" if row.ci95 is None else f"{row.ci95[0]:.3f} – {row.ci95[1]:.3f}"]
                  for row in rows]), ""]


def _validity(point: ServePoint) -> str:
    if not point.valid:
        return "**NOT VALID**"
    return f"**{UNVERIFIED}**" if point.unverified else "yes"


def _fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
