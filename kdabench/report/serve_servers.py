"""Two parts of a serve-sweep receipt's section: what each arm's server said it runs on, and
the shared-prefix cases (table and plot).

Read defensively: ``config.servers.<arm>.runs_on`` ({"status": "reported", "device",
"compute_capability", "driver_version", "backend", "model", "retention", "torch", "triton"}
or {"status": "unknown"}, absent in older receipts), ``config.shared_prefix_skipped`` and the
"shared-prefix" cases (``total_tokens``, ``shared_tokens``, ``p2_ttft_ms``, ``p2_median_ms``,
``p2_ci95_ms``, ``p1_median_ms``; older receipts have neither interval nor per-case id).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kdabench.report.fields import finite_numbers, to_number
from kdabench.report.markdown import fmt_count, fmt_ms, md_table
from kdabench.report.plotting import new_figure, save_png


def server_lines(doc: Mapping[str, Any]) -> list[str]:
    """A table of what each arm's server runs on; nothing for a receipt without it."""
    config = doc.get("config") if isinstance(doc.get("config"), Mapping) else {}
    servers = config.get("servers") if isinstance(config.get("servers"), Mapping) else {}
    rows = []
    for arm, record in servers.items():
        runs_on = record.get("runs_on") if isinstance(record, Mapping) else None
        if not isinstance(runs_on, Mapping):
            continue
        if runs_on.get("status") != "reported":
            rows.append([arm, "unknown (the server's /version does not say)", "-", "-", "-", "-",
                         "-"])
            continue
        retention = runs_on.get("retention") if isinstance(runs_on.get("retention"),
                                                            Mapping) else {}
        settings = ", ".join(f"{key} {retention[key]}" for key in (
            "checkpoint_export", "block_tokens", "max_batched_tokens", "cache_gib")
            if key in retention)
        rows.append([arm, runs_on.get("device") or "-", runs_on.get("compute_capability") or "-",
                     runs_on.get("driver_version") or "-",
                     f"{runs_on.get('backend') or '-'} · {runs_on.get('model') or '-'}",
                     settings or "-",
                     f"{runs_on.get('torch') or '-'} · {runs_on.get('triton') or '-'}"])
    if not rows:
        return []
    return ["#### Servers", "", md_table(["arm", "device", "compute capability", "driver",
                                          "backend · model", "retention", "torch · Triton"],
                                         rows), ""]


def _shared(case: Mapping[str, Any]) -> tuple[float | None, float | None]:
    return to_number(case.get("total_tokens")), to_number(case.get("shared_tokens"))


def shared_prefix_lines(doc: Mapping[str, Any], cases: Sequence[Mapping[str, Any]],
                        plot_path: Path) -> tuple[list[str], list[Path]]:
    """The shared-prefix table and plot (P2's TTFT per case and arm), and skipped cases."""
    shared = [c for c in cases if c.get("kind") == "shared-prefix"]
    config = doc.get("config") if isinstance(doc.get("config"), Mapping) else {}
    skipped = config.get("shared_prefix_skipped") or []
    if not shared and not skipped:
        return [], []
    lines = ["#### Shared prefix", "",
             ("P2 shares its first tokens with P1, sent just before it; a cache that kept the "
             "state at the shared prefix's end answers P2 sooner."), ""]
    shared = sorted(shared, key=lambda c: _shared(c)[0] or 0)
    if shared:
        def interval(case: Mapping[str, Any]) -> str:
            ci = case.get("p2_ci95_ms")
            return f"{fmt_ms(ci[0])} – {fmt_ms(ci[1])}" if isinstance(ci, list) and \
                len(ci) == 2 else "-"

        lines += [md_table(["arm", "P1 tokens", "shared tokens", "P2 samples",
                            "P2 median TTFT (ms)", "95% CI (ms)", "P1 median TTFT (ms)"],
                           [[c.get("arm"), fmt_count(_shared(c)[0]), fmt_count(_shared(c)[1]),
                             len(finite_numbers(c.get("p2_ttft_ms"))),
                             fmt_ms(to_number(c.get("p2_median_ms"))), interval(c),
                             fmt_ms(to_number(c.get("p1_median_ms")))] for c in shared]), ""]
    for case in skipped:
        if isinstance(case, Mapping):
            lines += [(f"Skipped: {case.get('total_tokens')} tokens sharing "
                      f"{case.get('shared_tokens')} ({case.get('reason')})."), ""]
    plots = []
    if plot_shared_prefix(shared, plot_path):
        plots.append(plot_path)
        lines += [f"![P2 TTFT per shared-prefix case and arm]({plot_path.name})", ""]
    return lines, plots


def plot_shared_prefix(cases: Sequence[Mapping[str, Any]], path: Path) -> bool:
    """P2's median TTFT per case (x) and arm (bars), with its interval; False without data."""
    usable = [c for c in cases if to_number(c.get("p2_median_ms")) is not None]
    if not usable:
        return False
    groups = list(dict.fromkeys(_shared(c) for c in usable))
    arms = list(dict.fromkeys(str(c.get("arm")) for c in usable))
    figure, (axis,) = new_figure(10.0, 5.2)
    width = 0.8 / len(arms)
    for index, arm in enumerate(arms):
        mine = {_shared(c): c for c in usable if str(c.get("arm")) == arm}
        xs = [g - 0.4 + width * (index + 0.5) for g, key in enumerate(groups) if key in mine]
        chosen = [mine[key] for key in groups if key in mine]
        medians = [float(to_number(c.get("p2_median_ms")) or 0.0) for c in chosen]
        errors = [[0.0, 0.0] for _ in chosen]
        for error, case, median in zip(errors, chosen, medians):
            ci = case.get("p2_ci95_ms")
            if isinstance(ci, list) and len(ci) == 2:
                error[:] = [max(median - ci[0], 0.0), max(ci[1] - median, 0.0)]
        axis.bar(xs, medians, width=width * 0.9, color=f"C{index % 10}", label=arm,
                 yerr=[[e[0] for e in errors], [e[1] for e in errors]], capsize=4)
    axis.set_xticks(range(len(groups)), [f"{fmt_count(s)} of {fmt_count(t)}"
                                         for t, s in groups])
    axis.set_xlabel("tokens P2 shares with P1, of P1's length")
    axis.set_ylabel("P2 median TTFT (ms)")
    axis.set_title("P2's time to first token after P1 (bars: 95% confidence interval)")
    axis.grid(True, axis="y", alpha=0.4)
    axis.legend(title="arm", fontsize="small")
    save_png(figure, path)
    return True
