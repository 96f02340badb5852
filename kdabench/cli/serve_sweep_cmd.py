"""`kdabench serve-sweep`: cold TTFT and decode of a server across flag arms, with a receipt."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kdabench.cli.errors import Finding, UserError, print_error
from kdabench.cli.serve_local_cmd import PRESET_NAMES
from kdabench.receipts import ReceiptError
from kdabench.stats import median
from kdabench.sweep.arms import PACKAGED, ArmsError, load_arms
from kdabench.sweep.cases import UNVERIFIED, case_ok, unverified, unverified_arms
from kdabench.sweep.client import APIS
from kdabench.sweep.contrasts import Contrast
from kdabench.sweep.options import SCHEDULES, SweepError, SweepOptions
from kdabench.sweep.runner import Sweep, SweepResult
from kdabench.sweep.servers import EMBEDDED_MAX_MODEL_LEN


def _sizes(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        sizes = tuple(int(part.strip().lower().replace("k", "")) * (1024 if "k" in part.lower()
                                                                       else 1)
                      for part in text.split(",") if part.strip())
    except ValueError:
        raise UserError(f"--prompt-tokens {text!r}: give comma-separated token counts, "
                        "e.g. 8192,16384,32768") from None
    if not sizes:
        raise UserError("--prompt-tokens needs at least one size")
    return sizes


def _pairs(text: str | None) -> tuple[tuple[int, int], ...] | None:
    """--shared-prefix "8192:4096,65536:57344" as ((8192, 4096), (65536, 57344))."""
    if text is None:
        return None
    try:
        pairs = tuple((int(total), int(shared)) for total, shared in
                      (part.split(":") for part in text.split(",") if part.strip()))
    except ValueError:
        raise UserError(f"--shared-prefix {text!r}: give P1:SHARED token counts, e.g. "
                        "8192:4096,65536:57344") from None
    if not pairs:
        raise UserError("--shared-prefix needs at least one P1:SHARED case")
    return pairs


@click.command("serve-sweep")
@click.option("--arms", "arms_spec", default="local", show_default=True, metavar="FILE|NAME",
              help=f"Arms file (TOML) or a packaged one: {', '.join(sorted(PACKAGED))}.")
@click.option("--endpoint", metavar="URL", default=None,
              help="Attach to a running OpenAI-compatible server (the same for every arm "
              "unless an arm names its own endpoint).")
@click.option("--launch", "launch_cmd", metavar="CMD", default=None,
              help="Start the server per arm: CMD plus the arm's args, with the arm's env; "
              "'{port}' in CMD is a free port (else '--port PORT' is appended).")
@click.option("--prompt-tokens", "prompt_tokens", metavar="N,N,...", default=None,
              help="Prompt sizes in tokens (default: the arms file's, else 8192,16384,32768); "
              "each request must fit the server's max_model_len (the embedded server's: "
              f"{EMBEDDED_MAX_MODEL_LEN}).")
@click.option("--samples", type=int, default=None,
              help="Cold samples per arm and prompt size (default: the arms file's, else 5).")
@click.option("--rounds", type=int, default=None,
              help="Interleaved rounds the samples are spread over (default: one per sample).")
@click.option("--schedule", type=click.Choice(SCHEDULES), default=None,
              help="interleaved (default): every arm's server up at once, samples in rounds "
              "A B, then B A. blocks: one server at a time, for deployments that hold one: each "
              "block starts the arm's server (--launch CMD, or the embedded one), waits for "
              "/health, warms up, takes --samples cold samples per prompt size (an arm's last "
              "block also probes, shares a prefix and decodes) and stops it; blocks run "
              "A B B A (see --blocks) and the receipt sets the drift between an arm's blocks "
              "beside the arms' differences.")
@click.option("--blocks", type=int, default=None, metavar="N",
              help="With --schedule blocks: blocks per arm, in passes over the arms that "
              "alternate direction (default 2: A B B A; 4: A B B A A B B A).")
@click.option("--tokenizer", metavar="PATH_OR_NAME", default=None,
              help="Count prompt tokens with this tokenizer: a tokenizer.json or a folder "
              "holding one, else a transformers model folder or name in the local cache "
              "(pip install 'kdabench[serve]'). Default: the server's /tokenize, else "
              "calibration against the usage.prompt_tokens the server reports.")
@click.option("--warmups", type=int, default=None,
              help="Warmups per arm and prompt size, and uncounted P1/P2 pairs per shared-prefix "
                   "case (default 1).")
@click.option("--decode-window", "decode_window_s", type=float, default=None, metavar="S",
              help="Seconds of decode measured per arm (default: the arms file's, else 2).")
@click.option("--shared-prefix", "shared_prefix", metavar="P1:SHARED,...", default=None,
              help="Shared-prefix cases: P1's tokens and how many of them P2 shares (default: "
              "the arms file's, else 8192:4096,65536:57344). A case longer than the largest "
              "prompt size is skipped, and the receipt says so.")
@click.option("--shared-prefix-tokens", type=int, default=None, metavar="N",
              help="One shared-prefix case instead: P1 of N tokens, P2 sharing its first half.")
@click.option("--model", type=click.Choice(PRESET_NAMES), default=None,
              help="Model preset of the embedded server, or '--model PRESET' appended to the "
              "--launch command (see kdabench serve-local --help). Default: the server's "
              "(kimi-linear-tp4 on a GPU, tiny on a CPU).")
@click.option("--baseline", metavar="ARM", default=None,
              help="The arm every other is read against: per prompt size its median cold "
              "TTFT over the baseline's, per shared-prefix case its P2's, each with a "
              "bootstrap 95% interval (default: the arms file's; local: final-only).")
@click.option("--drift-bound", type=float, default=None,
              help="Max |logprob(cold) - logprob(cached)| the probes allow (default 0.05).")
@click.option("--seed", type=int, default=None, help="Seed of prompt filler and bootstrap.")
@click.option("--api", type=click.Choice(APIS), default=None,
              help="OpenAI endpoint timed: /v1/completions, or /v1/chat/completions with the "
              "prompt as one user message (default: the arms file's, else completions).")
@click.option("--health-timeout", "health_timeout_s", type=float, default=None, metavar="S",
              help="Seconds to wait for a server's /health (default 120).")
@click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True, metavar="NAME",
              help="Environment variable holding the API key; sent, never written.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False),
              default=None, help="Folder for the receipt and server logs (default: "
              "$KDABENCH_OUT, else .kdabench/ in the current directory; curated evidence goes "
              "to results/ with --out results/).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def serve_sweep(arms_spec: str, endpoint: str | None, launch_cmd: str | None,
                prompt_tokens: str | None, samples: int | None, rounds: int | None,
                warmups: int | None, decode_window_s: float | None,
                shared_prefix: str | None, shared_prefix_tokens: int | None, model: str | None,
                baseline: str | None, drift_bound: float | None, seed: int | None,
                api: str | None, health_timeout_s: float | None, api_key_env: str, out_dir: Path | None,
                schedule: str | None, blocks: int | None, tokenizer: str | None,
                as_json: bool) -> None:
    """Measure cold TTFT, prefill rate and decode of a server across flag arms.

    Every arm's server runs at once (the embedded reference server by default, one per
    arm, on the GPU with kdabench's Triton kernel where CUDA is present, else on the CPU;
    or --launch CMD per arm; or --endpoint URL; with --schedule blocks, one at a time).
    Per arm: warmups (not counted), exact-answer and cache probes, activation patterns
    over the server log before timing and after; then cold samples in interleaved rounds (A B C, then C B A, ...),
    every prompt unique from its first tokens, with zero cached tokens checked from the
    usage and /metrics (a cached sample is discarded and reported; where the server
    reports neither, the arm is "unverified": cold by construction, not verified by the
    server). A stream cut short is a failed sample. TTFT runs from
    sending the request to the first chunk carrying generated text. Medians come with
    seeded bootstrap 95% intervals; rate = prompt tokens / median TTFT. Shared-prefix
    cases (P2 sharing 4,096 of P1's 8,192 tokens, and 57,344 of 65,536) show what
    checkpoint export buys; decode is tokens/s over a fixed window,
    normalised by the speculative acceptance length. The receipt (kind "serve-sweep")
    keeps every raw sample; API keys are never written.

    Exit 0 when every probe and check passes or is unverified; 1 when one fails or a
    server dies (the receipt is then partial); 2 for bad input (an arms file that does not load, options
    that do not fit, an endpoint where nothing listens, arms that differ in env or args
    on one attached server, prompts longer than a server's max_model_len: checked before any
    request is timed, and no receipt is written).
    """
    if endpoint and launch_cmd:
        raise UserError("give --endpoint URL or --launch CMD, not both")
    try:
        arms = load_arms(arms_spec)
        options = SweepOptions.resolve(arms.sweep, {
            "prompt_tokens": _sizes(prompt_tokens), "samples": samples, "rounds": rounds,
            "warmups": warmups, "decode_window_s": decode_window_s,
            "shared_prefix": _pairs(shared_prefix),
            "shared_prefix_tokens": shared_prefix_tokens, "drift_bound": drift_bound,
            "seed": seed, "health_timeout_s": health_timeout_s, "api": api,
            "schedule": schedule, "blocks": blocks, "baseline": baseline,
        })
        mode = "launch" if launch_cmd else "attach" if endpoint else "embedded"
        if mode == "embedded" and any(arm.endpoint for arm in arms.arms):
            mode = "attach"
        sweep = Sweep(arms, options, mode=mode, launch=launch_cmd, endpoint=endpoint,
                      out_dir=out_dir, api_key=os.environ.get(api_key_env) or None,
                      api_key_env=api_key_env, command_line=list(sys.argv),
                      tokenizer=tokenizer, model=model)
    except (ArmsError, SweepError, ReceiptError, TypeError) as error:
        raise UserError(str(error)) from error

    result = _run_live(sweep, quiet=as_json)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        console = Console(highlight=False, soft_wrap=True)
        if not console.is_terminal:  # a pipe or a file: do not cut the tables at 80 columns
            console = Console(highlight=False, soft_wrap=True, width=120)
        _render(console, sweep, result)
    if not result.ok:
        bad = [c["id"] for c in result.cases if not case_ok(c)]
        what = (f"a server failed ({result.failures[0]['arm']}: "
                f"{result.failures[0]['phase']})" if result.failures
                else f"{len(bad)} case(s) did not pass: {', '.join(bad[:4])}")
        arms = unverified_arms(result.cases)
        if arms:
            what += f"; {len(arms)} arm(s) {UNVERIFIED}"
        raise Finding(f"{what}; receipt ({result.receipt['status']}): {result.receipt_path}")


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


_STATUS_STYLE = {UNVERIFIED: "yellow"}  # a live row's status; any other is red


def _live_table(sweep: Sweep) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for column, justify in (("arm", "left"), ("prompt", "right"), ("n", "right"),
                            ("discarded", "right"), ("failed", "right"),
                            ("median TTFT ms", "right"),
                            ("rate tok/s", "right"), ("", "left")):
        table.add_column(column, justify=justify, no_wrap=True)
    for row in sweep.live_rows():
        table.add_row(escape(row["arm"]), str(row["prompt_tokens"]), str(row["n"]),
                      str(row["discarded"]) if row["discarded"] else "",
                      str(row["failed"]) if row["failed"] else "",
                      _fmt(row["median_ms"]), _fmt(row["rate_tok_s"], ",.0f"),
                      Text(row["status"], style=_STATUS_STYLE.get(row["status"], "red"))
                      if row["status"] else "")
    return table


def _run_live(sweep: Sweep, *, quiet: bool) -> SweepResult:
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    console.print(f"serve-sweep · {len(sweep.arms.arms)} arms ({escape(sweep.arms.name)}) · "
                  f"{sweep.mode} · prompts {', '.join(map(str, sweep.options.prompt_tokens))} · "
                  f"receipt {escape(str(sweep.path))}")
    status = Text("starting")

    def render() -> Group:
        return Group(_live_table(sweep), status)

    try:
        with _live(console, render(), quiet=quiet) as live:
            def on_event(message: str) -> None:
                status.plain = message
                if "FAILED" in message or "discarded" in message:
                    live.console.print(Text(message, style="red"))
                live.update(render())

            sweep.on_event = on_event
            sweep.on_update = lambda: live.update(render())
            try:
                result = sweep.run()
            except SweepError:
                live.transient = True  # bad input, nothing measured: no table to leave
                raise
            status.plain = "done"
            live.update(render())
    except SweepError as error:
        raise UserError(str(error)) from error
    except KeyboardInterrupt:
        print_error(f"interrupted: the partial receipt is {sweep.path}", style="bold yellow")
        raise click.exceptions.Exit(130) from None
    except OSError as error:
        raise UserError(f"cannot write the receipt {sweep.path}: "
                        f"{error.strerror or error}") from error
    return result


@contextlib.contextmanager
def _live(console: Console, renderable: Group, *, quiet: bool) -> Iterator[Live]:
    """A rich Live display on ``console``; in a pipe, its final render ends with a newline."""
    live = Live(renderable, console=console, refresh_per_second=4, transient=quiet,
                redirect_stdout=False, redirect_stderr=False)
    try:
        with live:
            yield live
    finally:
        if not console.is_terminal and not live.transient:
            console.line()  # a pipe gets the final render without its last newline


def _runs_on_lines(servers: dict[str, Any]) -> list[str]:
    """What the arms' servers said they run on (their /version), one line per description."""
    arms_of: dict[str, list[str]] = {}
    for arm, record in servers.items():
        runs_on = record.get("runs_on") or {}
        if runs_on.get("status") == "reported":
            device = runs_on.get("device") or "an unnamed device"
            details = ", ".join(f"{label} {runs_on[key]}" for key, label in (
                ("compute_capability", "compute capability"), ("driver_version", "driver"))
                if runs_on.get(key))
            parts = [f"{device} ({details})" if details else device] + [
                f"{label} {runs_on[key]}" for key, label in (
                    ("backend", "backend"), ("model", "model"), ("torch", "torch"),
                    ("triton", "Triton")) if runs_on.get(key)]
            what = " · ".join(parts)
        else:
            what = "not reported (the server's /version does not say)"
        arms_of.setdefault(what, []).append(arm)
    return [f"runs on: {what} ({', '.join(arms)})" for what, arms in arms_of.items()]


def _render(console: Console, sweep: Sweep, result: SweepResult) -> None:
    cases = result.cases
    for line in _runs_on_lines(result.receipt["config"].get("servers") or {}):
        console.print(escape(line))
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for case in cases:
        by_kind.setdefault(case["kind"], []).append(case)
    table = Table(title="cold TTFT (median, bootstrap 95% CI)", box=box.SIMPLE_HEAD)
    for column in ("arm", "prompt", "n", "median ms", "95% CI ms", "rate tok/s", "verdict"):
        table.add_column(column, justify="left" if column == "arm" else "right", no_wrap=True)
    for case in by_kind.get("cold-ttft", []):
        ci = case["ci95_ms"]
        table.add_row(escape(case["arm"]), str(case["prompt_tokens_requested"]),
                      str(case["n"]), _fmt(case["median_ms"]),
                      "-" if ci is None else f"{ci[0]:.1f}-{ci[1]:.1f}",
                      _fmt(case["rate_tok_s"], ",.0f"), _verdict(case))
    console.print(table)
    extra = Table(title="probes, decode", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    for column in ("arm", "activation", "probes", "drift", "tok/s", "accept", "steps/s"):
        extra.add_column(column, justify="left" if column in ("arm", "activation") else "right",
                         no_wrap=True)
    extra.caption = "decode tok/s, acceptance length, steps/s"
    for state in sweep.states:
        name = state.arm.name
        probe = next((c for c in by_kind.get("probe", []) if c["arm"] == name), None)
        decode = next((c for c in by_kind.get("decode", []) if c["arm"] == name), None)
        extra.add_row(
            escape(name), state.activation_status,
            _verdict(probe) if probe else "-",
            _fmt(probe["drift"], ".2g") if probe and probe["drift"] is not None else "-",
            _fmt(decode["tokens_per_s"]) if decode else "-",
            _fmt(decode["acceptance_length"], ".2f") if decode else "-",
            _fmt(decode["steps_per_s"]) if decode else "-",
        )
    console.print(extra)
    _render_shared_prefix(console, by_kind.get("shared-prefix", []),
                          result.receipt["config"].get("shared_prefix_skipped", []))
    _render_contrasts(console, result.contrasts())
    for failure in result.failures:
        console.print(f"[red]server failure[/red] {escape(failure['arm'])} during "
                      f"{escape(failure['phase'])}: {escape(failure['message'])}")
    for case in cases:
        if case["verdict"] != "pass" and case["kind"] != "failure":
            console.print(f"{_verdict(case)} {escape(case['id'])}: "
                          f"{escape(str(case.get('message')))}")
    summary = result.receipt["summary"]
    unsure = sum(unverified(case) for case in cases)
    console.print(f"receipt {escape(str(result.receipt_path))} ({result.receipt['status']}) · "
                  f"sha256 {result.receipt['sha256'][:16]}… · {summary['total']} cases: "
                  f"{summary['pass']} pass, {summary['fail']} fail, {summary['error']} error, "
                  f"{unsure} {UNVERIFIED}"
                  + (f", {summary['skip'] - unsure} skip" if summary["skip"] > unsure else ""))
    if result.ok:
        console.print(_closing_line(cases))


def _render_shared_prefix(console: Console, cases: list[dict[str, Any]],
                          skipped: list[dict[str, Any]]) -> None:
    """P2's TTFT per shared-prefix case and arm; the cases skipped, and why."""
    if cases:
        table = Table(title="shared prefix: P2 after P1 (median TTFT, bootstrap 95% CI)",
                      box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for column in ("arm", "P1 tokens", "shared", "n", "P2 median ms", "95% CI ms",
                       "P1 median ms", "P2 cached"):
            table.add_column(column, justify="left" if column == "arm" else "right",
                             no_wrap=True)
        for case in sorted(cases, key=lambda c: c["total_tokens"]):
            ci = case.get("p2_ci95_ms")
            cached = [c for c in case["p2_cached_tokens"] if c is not None]
            table.add_row(escape(case["arm"]), str(case["total_tokens"]),
                          str(case["shared_tokens"]), str(len(case["p2_ttft_ms"])),
                          _fmt(case["p2_median_ms"]),
                          "-" if ci is None else f"{ci[0]:.1f}-{ci[1]:.1f}",
                          _fmt(case["p1_median_ms"]), _fmt(median(cached), ".0f"))
        console.print(table)
    for case in skipped:
        console.print(f"shared prefix {case['total_tokens']}:{case['shared_tokens']} "
                      f"skipped: {escape(case['reason'])}")


def _render_contrasts(console: Console, rows: list[Contrast]) -> None:
    """Each arm against the baseline: median over median, and the ratio's interval."""
    if not rows:
        return
    table = Table(title=f"against {rows[0].baseline} (arm median / baseline median, "
                  "bootstrap 95% CI; under 1: the arm is faster)", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    for column in ("arm", "case", "arm ms", "baseline ms", "ratio", "95% CI", "change"):
        table.add_column(column, justify="left" if column in ("arm", "case") else "right",
                         no_wrap=True)
    for row in rows:
        ci = row.ci95
        table.add_row(escape(row.arm), escape(row.label), _fmt(row.arm_median_ms),
                      _fmt(row.baseline_median_ms), _fmt(row.ratio, ".3f"),
                      "-" if ci is None else f"{ci[0]:.3f}-{ci[1]:.3f}",
                      "-" if row.ratio is None else _change(row.ratio))
    console.print(table)


def _change(ratio: float) -> str:
    """+2.1% for a ratio of 1.021; "4.3x sooner" where the arm takes under half the time."""
    if ratio > 0 and ratio < 0.5:
        return f"{1 / ratio:.1f}x sooner"
    return f"{(ratio - 1) * 100:+.1f}%"


def _closing_line(cases: list[dict[str, Any]]) -> str:
    """The last line of a sweep where nothing failed: all pass, or which arms are unverified."""
    arms = unverified_arms(cases)
    if not arms:
        return "[green]all probes and checks pass[/green]"
    return (f"[yellow]nothing failed; {len(arms)} arm(s) {UNVERIFIED} "
            f"({escape(', '.join(arms))}): the server reports no cached tokens, so their "
            "samples are cold by construction, not verified by the server[/yellow]")


def _verdict(case: dict[str, Any]) -> str:
    if unverified(case):
        return f"[yellow]{UNVERIFIED}[/yellow]"
    colour = "green" if case["verdict"] == "pass" else "red"
    return f"[{colour}]{case['verdict']}[/{colour}]"
