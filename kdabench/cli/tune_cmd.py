"""`kdabench tune`: measure kernel configs on this device and write its profile."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kdabench.cli.errors import Finding, print_error, user_errors
from kdabench.cli.progress import run_cases_with_progress

TABLE_WIDTH = 150


@click.command("tune")
@click.option("--queries", "queries_path", type=click.Path(path_type=Path), default=None,
              help="A queries TOML file of your own (default: the packaged "
              "kdabench/data/tune.toml: the bench shapes at capacity 4 and 1).")
@click.option("--out", "out_path", type=click.Path(path_type=Path), default=None,
              help="The profile to write (default: <device>.json in the profile folder, "
              "$KDABENCH_PROFILE_DIR or the packaged profiles/). Entries of an existing "
              "profile for other queries are kept.")
@click.option("--only", "only", multiple=True, metavar="PATTERN",
              help="Tune only the queries whose id matches this shell pattern (repeatable), "
              "e.g. --only '8192x8x1-*'; the profile keeps the other entries, so a long file "
              "can be tuned in parts.")
@click.option("--reps", type=int, default=None,
              help="Timed samples per candidate config (default: the queries file's "
              "[timing] reps).")
@click.option("--backends", "backends", default="triton,cute", show_default=True,
              metavar="A,B", help="Backends timed per query, triton among them: the CuTe "
              "DSL backend (one config) beside the Triton candidates, skipped with a note "
              "where it cannot run.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def tune(queries_path: Path | None, out_path: Path | None, only: tuple[str, ...],
         reps: int | None, backends: str, as_json: bool) -> None:
    """Time candidate kernel configs per query and write the device's profile.

    For each query (shape, capacity, gate) of the queries file: every KernelConfig of the
    file's [grid] that the rule admits (valid tiles; the state pass's shared-memory estimate
    within the budget), and the heuristic's, is timed on this GPU (CUDA events, median of
    --reps samples over input sets rotated past the L2 cache); the fastest is checked
    against the float64 recurrence on a smaller instance (the next fastest if it fails).
    A candidate replaces the heuristic only when it is at least the file's [timing]
    min_gain faster; with `shortlist = N`, a shape's capacity-1 query times only the
    heuristic and the N fastest configs of its capacity-4 query. The other backends are
    timed on the same input sets; the entry names one of them as the query's backend only
    where it is min_gain faster than the Triton winner and passes the same check. The
    profile records every candidate's median, the winner, its oracle errors, the backend,
    the device and the tool versions; plans then take their configs and, with the default
    backend "auto", their backend from it (policy mode AUTO or PREPLANNED_ONLY). Needs a
    CUDA GPU.

    Exit 0 when every query got an entry; 1 when a query got none (no candidate ran, or
    none passed the check; the profile keeps the others); 2 for bad input (a queries file
    that does not load, an --only pattern that matches no query, bad --reps, no CUDA GPU).
    """
    from kdabench.receipts.write import portable_command_line
    from kdabench.tune import QueriesError, Tune, TuneError, load_queries, select_queries

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    with user_errors(QueriesError, TuneError):
        queries = select_queries(load_queries(queries_path), only)
        run = Tune(queries, out=out_path, reps=reps, command_line=portable_command_line(
                       ["kdabench", *sys.argv[1:]], Path.cwd()),
                   backends=[b.strip() for b in backends.split(",") if b.strip()])
    for note in run.notes:
        print_error(f"note: {note}", style="bold yellow")
    device = escape(str(run.device.get("profile_name")))
    console.print(f"tune · {len(queries.queries)} queries · {device} · {run.timing['reps']} "
                  f"reps · profile {escape(str(run.out))}")
    result = run_cases_with_progress(console, run, total=len(queries.queries),
                                     first="preparing", label=lambda query: query.id,
                                     receipt=str(run.out), artifact="profile")
    if as_json:
        from kdabench.receipts import sanitize

        click.echo(json.dumps(sanitize(result.to_dict()), indent=2))
    else:
        wide = max(Console().width, TABLE_WIDTH)  # piped logs keep every column
        _render(Console(highlight=False, soft_wrap=True, width=wide), result)
    bad = [r for r in result.records if r["verdict"] != "pass"]
    if bad:
        raise Finding(f"{len(bad)} of {len(result.records)} queries got no profile entry: "
                      + "; ".join(f"{r['id']}: {r.get('message')}" for r in bad[:3]))


def _changes(config: dict[str, Any] | None) -> str:
    """The config's fields that differ from KernelConfig's defaults ("defaults" if none)."""
    if config is None:
        return "-"
    from kdabench.kernels.catalog import config_defaults

    defaults = config_defaults()
    changed = [f"{k}={v}" for k, v in config.items() if defaults.get(k) != v]
    return " ".join(changed) or "defaults"


def _number(value: Any, form: str) -> str:
    return format(value, form) if isinstance(value, (int, float)) else "-"


def _render(console: Console, result) -> None:
    table = Table(title=f"tune · {escape(str(result.profile['device'].get('name')))}",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("query", no_wrap=True)
    table.add_column("timed", justify="right")
    table.add_column("config (vs defaults)")
    table.add_column("backend")
    for column in ("ms", "heuristic ms", "speedup", "out err", "state err"):
        table.add_column(column, justify="right", no_wrap=True)
    for record in result.records:
        errors = record.get("oracle_errors") or {}
        state = max((v for k, v in errors.items() if k != "output"
                     and isinstance(v, (int, float))), default=None)
        table.add_row(
            escape(record["id"]), f"{record['timed']}/{record['candidates']}",
            escape(_changes(record.get("config"))), escape(record.get("backend") or "-"),
            _number(record.get("median_ms"), ".4f"),
            _number(record.get("heuristic_median_ms"), ".4f"),
            _number(record.get("speedup_over_heuristic"), ".2f") + "x"
            if record.get("speedup_over_heuristic") else "-",
            _number(errors.get("output"), ".1e"), _number(state, ".1e"),
            style="red" if record["verdict"] != "pass" else None,
        )
    console.print(table)
    for record in result.records:
        if record.get("message"):
            console.print(f"[red]{escape(record['id'])}[/red]: {escape(record['message'])}")
    console.print(f"profile {escape(str(result.profile_path))} · {len(result.profile['entries'])}"
                  f" entries · {result.profile['status']}")
