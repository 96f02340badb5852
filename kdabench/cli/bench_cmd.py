"""`kdabench bench`: kdabench's prefill (per kernel backend) against fla's chunk_kda, with
the floor, as a receipt."""

from __future__ import annotations

import json
from collections.abc import Container
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kdabench.bench.backend import KDABENCH
from kdabench.cli.errors import Finding, print_error, user_errors
from kdabench.cli.progress import run_cases_with_progress
from kdabench.kernels.contract import AUTO_BACKEND

TABLE_WIDTH = 150
BACKEND_COLUMNS_WIDTH = 45  # the four columns of each further backend


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


QUICK = {"shapes": "quick", "modes": "graph", "reps": 20}  # what --quick sets, unless given


@click.command("bench")
@click.option("--shapes", "shapes_spec", metavar="NAME|FILE", default=None,
              help="The shapes to time: a packaged set by name, 'default' (nine shapes, 8192 "
              "to 65536 tokens; kdabench/data/bench-shapes.toml) or 'quick' (three: "
              "8192x8x1, 65536x8x1, 64 sequences of 512 tokens x 8 heads), or a shapes TOML "
              "file of your own (a name wins; write ./quick for a file named quick). Default: "
              "default.")
@click.option("--quick", is_flag=True,
              help="A quick check for kernel work, meant to finish in under a minute on an "
              "H200, Triton compiles included: short for --shapes quick --modes graph --reps "
              "20 (graph replay only, both gate regimes, against fla). --shapes, --modes or "
              "--reps given beside it win; the receipt is an ordinary bench receipt with "
              "shape_set \"quick\".")
@click.option("--gates", "gates_text", metavar="long-memory,fast-decay|FILE",
              default="long-memory,fast-decay", show_default=True,
              help="Gate regimes, comma-separated; every shape runs under each (case ids "
              "read SHAPE/REGIME). long-memory: the usual inputs' decay, about half the "
              "channels slow (memory over thousands of tokens). fast-decay: g = lower_bound * "
              "sigmoid(N(0,1)) per element (-5 * sigmoid: mean about -2.5). FILE: a "
              "gate-stats TOML/JSON of a real model's per-channel log decay, schema "
              "\"kdabench.gate-stats.v1\", mean and std (head_dim numbers each, mean <= 0), "
              "optional name (default: the file's stem); g drawn from N(mean, std) per "
              "channel, clipped to [lower_bound, 0]. fla and kdabench read the same g.")
@click.option("--against", metavar="fla,cudnn|none", default="fla", show_default=True,
              help="Peer kernels to time beside kdabench on the same inputs, comma-separated: "
              "fla (fla's chunk_kda; 'kdabench[bench]') and cudnn (cuDNN frontend's fused sm90 "
              "KDA kernel, CUDA-graph captured like the others; 'kdabench[cudnn]', an sm_90 "
              "GPU). A peer that cannot run here is skipped with its reason; none times "
              "kdabench alone.")
@click.option("--modes", "modes_text", metavar="eager,graph", default=None,
              help="Timing modes: eager calls, CUDA-graph replays, or both. Default: "
              "eager,graph (graph with --quick).")
@click.option("--backends", "backends_text", metavar="auto,triton,cute", default="auto",
              show_default=True,
              help="Kernel backends to time, comma-separated: the first one's plans are the "
              "kdabench columns (capacity 4 and 1, export overhead, baseline); each further one "
              "adds a column kdabench-<backend> (capacity 4) on the same inputs, with fla/it, "
              "first/it and its output against the first's. auto: per shape, the backend the "
              "device's profile measured fastest, as kda_prefill with default options runs "
              "(the 'runs on' column names it). cute-s<N> (cute-s1, cute-s2, ...): the cute "
              "backend with its chunk pass's key split pinned to N (CuteConfig.key_split), to "
              "compare the splits in one run; cute-wgmma: its pass on warpgroup MMA (sm_90a).")
@click.option("--reps", type=int, default=None,
              help="Timed samples per kernel, mode and case (the median is reported; every "
              "sample is kept in the receipt). Default: 100 (20 with --quick).")
@click.option("--breakdown", type=click.IntRange(min=0), default=0, show_default=True,
              metavar="CALLS",
              help="After each case's timing, run CALLS eager calls of every kernel under "
              "torch.profiler and record where its GPU time goes: each GPU kernel it launched, "
              "with its mean microseconds per call (0: no breakdown; 10 is plenty).")
@click.option("--shard", metavar="I/N", default=None,
              help="Run shard I of N of the shapes (position % N == I - 1, under every gate "
              "regime); join the shard receipts with `kdabench merge`.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder for the receipt and plots (default: $KDABENCH_OUT, else .kdabench/ "
              "in the current directory; curated evidence goes to results/ with --out "
              "results/).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("--plot/--no-plot", default=True, show_default=True,
              help="Draw time against T per mode and gate regime as PNGs beside the receipt.")
@click.option("--policy-mode", metavar="AUTO|HEURISTIC_ONLY|PREPLANNED_ONLY", default=None,
              help="How kdabench's plans pick their kernel config: the device's profile "
              "entry else the heuristic (AUTO), the heuristic alone, or profile entries alone "
              "(a shape without one errors). Default: $KDABENCH_POLICY_MODE, else AUTO.")
@click.option("--baseline-policy", metavar="AUTO|HEURISTIC_ONLY|PREPLANNED_ONLY", default=None,
              help="Also time kdabench (capacity 4) with its configs picked under this other "
              "policy mode, on the same inputs, and report the policy gain per case: its time "
              "/ kdabench's (above 1: --policy-mode's configs are faster).")
def bench(shapes_spec: str | None, quick: bool, gates_text: str, against: str,
          modes_text: str | None, backends_text: str, reps: int | None, breakdown: int,
          shard: str | None, out_dir: Path | None, as_json: bool, plot: bool,
          policy_mode: str | None, baseline_policy: str | None) -> None:
    """Time kdabench against fla's chunk_kda per shape and gate regime and write a receipt
    (kind "bench").

    Per shape and gate regime (a case, id SHAPE/REGIME), on the same inputs in one process:
    fla (its final state), kdabench with capacity 4 and four active checkpoints per
    sequence, and kdabench with capacity 1 and one checkpoint (export overhead = capacity 4
    / capacity 1 - 1). Each in eager mode and CUDA-graph replay (compare like with like;
    graph replay measures the GPU work): warm, CUDA events, --reps samples rotating among
    input sets larger than the L2, median. Every captured graph is replayed once per input
    set and checked against an eager call on that set before its time counts (a mismatch
    fails the case). Also per case: fla/kdabench, tokens/s, the floor (bytes over the copy
    bandwidth, FLOPs over the bf16 matmul rate, both measured in this run) and the distance
    to it, and a sanity check of kdabench's output against fla's (fails above 5e-2). Needs a
    CUDA GPU. The receipt records the policy mode, the gate regimes (formula, seed, and per
    case the mean, min and max of the log decay drawn) and, per case, each kdabench plan's
    kernel config and where it came from. For a quick check while working on a kernel:
    --quick. To see whether the tuning profile beats the heuristic in one run:
    --baseline-policy HEURISTIC_ONLY (with the default --policy-mode AUTO).
    By default kdabench runs as kda_prefill does with default options (--backends auto): per
    shape, the backend the device's profile measured fastest; the 'runs on' column and each
    case's kernel_configs name it. To time the Triton and the CuTe backends beside it in one
    run: --backends auto,triton,cute (the cute column's config source says whether its
    kernels came from an ahead-of-time build or a JIT compile). To see where each kernel's
    GPU time goes, kernel by kernel: --breakdown 10. A run too long for one sitting splits into shards: --shard 1/2 and
    --shard 2/2, joined with `kdabench merge`.

    Exit 0 when it ran (speed targets are reported, not asserted); 1 when a sanity or replay
    check fails or a case errors; 2 for bad input (a shapes file or set that does not load,
    a bad gate-stats file, bad --gates, --modes, --reps, --backends or --shard, no CUDA GPU,
    a backend that cannot run here).
    """
    from kdabench.bench import Bench, BenchError, ShapesError, load_shapes
    from kdabench.matrix import MatrixError, parse_shard

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    preset = QUICK if quick else {"shapes": None, "modes": "eager,graph", "reps": 100}
    with user_errors(ShapesError, BenchError, MatrixError):
        shapes = load_shapes(shapes_spec if shapes_spec is not None else preset["shapes"])
        run = Bench(shapes, against=against,
                    modes=_names(modes_text if modes_text is not None else preset["modes"]),
                    reps=reps if reps is not None else preset["reps"],
                    out_dir=out_dir, plot=plot, policy_mode=policy_mode,
                    baseline_policy=baseline_policy, backends=_names(backends_text),
                    breakdown=breakdown, gates=_names(gates_text),
                    shard=parse_shard(shard) if shard is not None else None)
    for peer, reason in run.peers_skipped.items():
        print_error(f"{peer} comparison skipped: {reason}", style="bold yellow")
    result = _run_with_progress(console, run)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        wide = max(Console().width, TABLE_WIDTH + BACKEND_COLUMNS_WIDTH
                   * (len(run.backends) - 1))  # piped logs keep every column
        _render(Console(highlight=False, soft_wrap=True, width=wide), result)
    if result.plot_error:
        print_error(f"the plots were not drawn: {result.plot_error}", style="bold yellow")
    bad = [c for c in result.cases if c["verdict"] not in ("pass", "skip")]
    if bad:
        raise Finding(f"{len(bad)} of {len(result.cases)} cases did not pass: "
                      + "; ".join(f"{c['id']}: {c.get('message')}" for c in bad[:3]))


def _run_with_progress(console: Console, run) -> Any:
    console.print(f"bench · {escape(run.shapes.set_name or run.shapes.origin)}: "
                  f"{run.shape_count} shapes{_shard_words(run.shard)} x gates "
                  f"{escape(', '.join(regime.name for regime in run.gates))} · backends "
                  f"{', '.join(run.backends)} · kernels {', '.join(run.kernels)} · modes "
                  f"{', '.join(run.modes)} · {run.reps} reps · policy {run.policy_mode}"
                  f"{_baseline_words(run.baseline_policy)} · receipt in "
                  f"{escape(str(run.out_dir))}")
    return run_cases_with_progress(console, run, total=len(run.cases),
                                   first="measuring the ceilings", label=lambda case: case.id,
                                   receipt=f"in {run.out_dir}")


def _ms(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.3f}"


def _times(value: Any, suffix: str = "x") -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.2f}{suffix}"


def _percent(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{100 * value:+.1f}%"


def _shard_words(shard: tuple[int, int] | None) -> str:
    return f" (shard {shard[0]}/{shard[1]})" if shard else ""


def _baseline_words(baseline: str | None) -> str:
    return f" (baseline {baseline})" if baseline else ""


def _config_sources(result, heading: str, kernels: Container[str]) -> str:
    """One line: how many plans of ``kernels`` took their config from where, on which backend."""
    counts: dict[str, int] = {}
    backends: dict[str, int] = {}
    for case in result.cases:
        for kernel, entry in (case.get("kernel_configs") or {}).items():
            if kernel not in kernels:
                continue
            source = str(entry.get("config_source") or "unknown")
            kind = source.split(" (")[0]  # "profile nvidia-h200.json", "heuristic", "explicit"
            counts[kind] = counts.get(kind, 0) + 1
            backend = str(entry.get("backend") or "unknown")
            backends[backend] = backends.get(backend, 0) + 1
    found = ", ".join(f"{count} from {escape(kind)}" for kind, count in counts.items())
    ran = ", ".join(f"{count} on {escape(name)}" for name, count in backends.items())
    return f"{heading}: kernel configs {found or 'not recorded'}" + (f" ({ran})" if ran else "")


def _runs_on(case: dict[str, Any]) -> str:
    """The backend an "auto" plan of the case resolved to (kdabench's, capacity 4)."""
    entry = (case.get("kernel_configs") or {}).get(KDABENCH) or {}
    return escape(str(entry.get("backend") or "-"))


def _gain(case: dict[str, Any], mode: str) -> str:
    """The shape's policy gain in ``mode``, starred where both plans shared a config."""
    mark = "*" if case.get("same_config") else " "  # the space keeps the digits aligned
    return _times((case.get("policy_gain") or {}).get(mode)) + mark


def _error(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.1e}"


def _backend_cells(case: dict[str, Any], mode: str, kernel: str, first_row: bool) -> list[str]:
    """A further backend's cells: its median, fla/it, first backend/it, its output error."""
    ratios = (case.get("backend_ratios") or {}).get(kernel) or {}
    error = ((case.get("sanity") or {}).get("backend_output") or {}).get(kernel)
    median = (((case.get("modes") or {}).get(mode) or {}).get(kernel) or {}).get("median_ms")
    return [_ms(median), _times((ratios.get("ratio_fla_over") or {}).get(mode)),
            _times((ratios.get("ratio_kdabench_over") or {}).get(mode)),
            _error(error) if first_row else ""]


def _cudnn_cells(case: dict[str, Any], mode: str, first_row: bool) -> list[str]:
    """cuDNN's cells: its median, cudnn/kdabench, kdabench's output against it."""
    median = (((case.get("modes") or {}).get(mode) or {}).get("cudnn") or {}).get("median_ms")
    error = (case.get("sanity") or {}).get("cudnn_output")
    return [_ms(median), _times((case.get("ratio_cudnn_over_kdabench") or {}).get(mode)),
            _error(error) if first_row else ""]


def _render(console: Console, result) -> None:
    config = result.receipt["config"]
    ceilings = config["ceilings"]
    table = Table(title=f"bench · {escape(str(result.receipt['device'].get('name')))}",
                  box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for column in ("shape", "gates", "mode"):
        table.add_column(column, no_wrap=True)
    baseline = config.get("baseline_policy")
    first, *others = config["backends"]
    further = {name: config["backend_kernels"][name] for name in others}
    cudnn = "cudnn" in config.get("kernels", [])
    auto = first == AUTO_BACKEND
    columns = (["runs on"] if auto else []) + [
               "fla ms", "kdabench ms", "c1 ms", "fla/kdabench", "export ovh", "floor ms",
               "to floor", "Mtok/s", "out err"] + (["policy gain"] if baseline else [])
    columns += ["cudnn ms", "cudnn/kdabench", "cudnn err"] if cudnn else []
    for name in further:
        columns += [f"{name} ms", f"fla/{name}", f"{first}/{name}", f"{name} err"]
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    table.caption = (f"kdabench: capacity 4, four checkpoints; c1: capacity 1, one; export ovh "
                     f"= kdabench/c1 - 1; floor at {ceilings['copy_bytes_per_s'] / 1e12:.2f} "
                     f"TB/s and {ceilings['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s measured "
                     "here; out err: kdabench against fla")
    if cudnn:
        table.caption += ("; cudnn: cuDNN frontend's fused sm90 KDA kernel (final state only), "
                          "cudnn err: kdabench against it")
    if baseline:
        table.caption += (f"; policy gain: kdabench-baseline ({baseline}) / kdabench "
                          f"({config.get('policy_mode')}), * where both used the same config "
                          "(the gain is noise)")
    if further:
        ran = "kdabench, c1 and kdabench-baseline run" if baseline else "kdabench and c1 run"
        table.caption += (f"; {ran} the {first} backend; "
                          + "; ".join(f"{name}: {kernel} (the {name} backend, capacity 4), "
                                      f"{first}/{name} = kdabench/{kernel}, {name} err against "
                                      "kdabench" for name, kernel in further.items()))
    for case in result.cases:
        error = (case.get("sanity") or {}).get("output")
        for index, mode in enumerate(config["modes"]):
            kernels = (case.get("modes") or {}).get(mode) or {}
            ours = kernels.get("kdabench", {})
            rate = ours.get("tokens_per_s")
            table.add_row(
                escape(case["shape"]) if index == 0 else "",
                escape(case["gates"]["name"]) if index == 0 else "", mode,
                *([_runs_on(case) if index == 0 else ""] if auto else []),
                _ms(kernels.get("fla", {}).get("median_ms")), _ms(ours.get("median_ms")),
                _ms(kernels.get("kdabench-c1", {}).get("median_ms")),
                _times((case.get("ratio_fla_over_kdabench") or {}).get(mode)),
                _percent((case.get("export_overhead") or {}).get(mode)),
                _ms(case.get("floor_ms")), _times(ours.get("to_floor")),
                "-" if rate is None else f"{rate / 1e6:.1f}",
                _error(error) if index == 0 else "",
                *([_gain(case, mode)] if baseline else []),
                *(_cudnn_cells(case, mode, index == 0) if cudnn else []),
                *(cell for kernel in further.values()
                  for cell in _backend_cells(case, mode, kernel, index == 0)),
                style="red" if case["verdict"] != "pass" else None,
            )
    console.print(table)
    per_gates = result.summary.get("per_gates") or {}
    for mode, row in result.summary["per_mode"].items():
        console.print(f"{mode}: {_summary_words(row)}")
        if len(per_gates) > 1:
            for regime, found in per_gates.items():
                console.print(f"{mode} · {escape(regime)}: "
                              f"{_summary_words(found['per_mode'][mode])}")
        for name, kernel in further.items():
            found = (row.get("backends") or {}).get(kernel) or {}
            console.print(f"{mode}: {name} backend: median fla/{name} "
                          f"{_times(found.get('median_ratio_fla_over'))} (min "
                          f"{_times(found.get('min_ratio_fla_over'))}) · median {first}/{name} "
                          f"{_times(found.get('median_ratio_kdabench_over'))} (min "
                          f"{_times(found.get('min_ratio_kdabench_over'))}) · median {name}/floor "
                          f"{_times(found.get('median_to_floor'))}")
    if baseline:
        shared = (f"{result.summary.get('same_config_shapes')} of "
                  f"{result.summary.get('config_compared_shapes')} cases share a config")
        for mode, row in result.summary["per_mode"].items():
            console.print(f"{mode}: policy {config.get('policy_mode')} vs {baseline}: median "
                          f"{_times(row.get('median_policy_gain'))}, min "
                          f"{_times(row.get('min_policy_gain'))}, {shared}")
    console.print(_config_sources(result, f"policy {config.get('policy_mode')}",
                                  ("kdabench", "kdabench-c1")))
    if baseline:
        console.print(_config_sources(result, f"baseline {baseline}", ("kdabench-baseline",)))
    for name, kernel in further.items():
        console.print(_config_sources(result, f"backend {name}", (kernel,)))
    if config.get("breakdown_calls"):
        _render_breakdown(console, result)
    for case in result.cases:
        if case.get("message"):
            console.print(f"[yellow]{escape(case['id'])}[/yellow]: {escape(case['message'])}")
    console.print(f"receipt {escape(str(result.receipt_path))} · sha256 "
                  f"{result.receipt['sha256'][:16]}…")
    for path in result.plots:
        console.print(f"plot {escape(str(path))}")


def _summary_words(row: dict[str, Any]) -> str:
    """One mode's medians over some cases, in words."""
    cudnn = ""
    if row.get("median_ratio_cudnn_over_kdabench") is not None:
        cudnn = (f" · median cudnn/kdabench {_times(row['median_ratio_cudnn_over_kdabench'])} "
                 f"(min {_times(row['min_ratio_cudnn_over_kdabench'])})")
    return (f"median fla/kdabench {_times(row['median_ratio_fla_over_kdabench'])} (min "
            f"{_times(row['min_ratio_fla_over_kdabench'])}){cudnn} · median export overhead "
            f"{_percent(row['median_export_overhead'])} · median kdabench/floor "
            f"{_times(row['median_kdabench_to_floor'])}")


def _render_breakdown(console: Console, result) -> None:
    """Per shape and kernel, one line: GPU time per call and its largest GPU kernels."""
    from kdabench.report import breakdown_line

    calls = result.receipt["config"]["breakdown_calls"]
    console.print(f"where the GPU time goes (microseconds per call, mean of {calls} eager calls "
                  "under torch.profiler):")
    for case in result.cases:
        for kernel, record in (case.get("breakdown") or {}).items():
            console.print(f"  {escape(case['id'])} {kernel}: {escape(breakdown_line(record))}")
