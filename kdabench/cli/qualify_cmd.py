"""`kdabench qualify`: run the qualification matrix and leave a receipt.

kdabench.qualify (torch) is imported inside the command, so `kdabench --help` stays light.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kdabench.cli.errors import Finding, UserError, print_error, user_errors
from kdabench.cli.progress import run_cases_with_progress
from kdabench.matrix import TIERS, MatrixError, load_matrix, parse_shard, select_cases
from kdabench.receipts import ReceiptError

if TYPE_CHECKING:
    from kdabench.qualify import Qualification, QualifyResult

FAILURES_SHOWN = 20


@click.command("qualify")
@click.option("--tier", type=click.Choice(TIERS), default=None,
              help="gpu: the qualification (needs a CUDA GPU). cpu: small shapes, Triton "
              "kernels under the interpreter, every load and store bounds-checked. Default: "
              "gpu when a GPU is present, else cpu.")
@click.option("--backend", metavar="NAME", default=None,
              help="Kernel backend to qualify (default: the matrix's first, 'triton'); "
              "cute-s<N> qualifies the cute backend with its chunk pass's key split pinned to N, "
              "cute-wgmma with its pass on warpgroup MMA (sm_90a) (the config each case ran is "
              "in the receipt).")
@click.option("--matrix", "matrix_path", type=click.Path(path_type=Path), default=None,
              help="A matrix TOML file of your own (default: the packaged matrix).")
@click.option("--shard", metavar="I/N", default=None,
              help="Run shard I of N (cases whose index % N == I - 1); join the shard "
              "receipts with `kdabench merge`.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder for the receipt (default: $KDABENCH_OUT, else .kdabench/ in the "
              "current directory; curated evidence goes to results/ with --out results/).")
@click.option("--filter", "contains", metavar="SUBSTR", default=None,
              help="Only the cases whose id contains SUBSTR.")
@click.option("--list", "list_only", is_flag=True,
              help="Print the expanded cases (index and id) and run nothing.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the result summary (or, with --list, the cases) as JSON on stdout.")
@click.option("--gpus", metavar="all|0,1,...", default=None,
              help="GPU tier on these GPUs (default: the first one); the worker processes "
              "are dealt to them in turn.")
@click.option("--workers", type=int, metavar="N", default=None,
              help="Run the cases in N worker processes and merge their receipts into one. "
              "GPU tier: default min(8, CPU cores / 2) and at least one per GPU, several "
              "sharing a GPU (Triton compiles run side by side); 1 runs in this process. "
              "CPU tier: default 1 (this process); N > 1 runs N interpreter processes.")
@click.option("--tp", "tensor_parallel", type=int, metavar="N", default=None,
              help="Run only the tensor-parallel case: one layer's heads split over N ranks "
              "(GPU tier: NCCL, one GPU each; CPU tier: gloo), checked bit for bit against "
              "one process and against float64; writes its own receipt.")
def qualify(tier: str | None, backend: str | None, matrix_path: Path | None, shard: str | None,
            out_dir: Path | None, contains: str | None, list_only: bool, as_json: bool,
            gpus: str | None, workers: int | None, tensor_parallel: int | None) -> None:
    """Run the qualification matrix and write a receipt (kind "qualify").

    Each case runs the kernel and checks it: outputs, final states and every checkpoint
    against a float64 recurrence, aligned checkpoints bit for bit against prefix runs,
    rejected metadata (its error bit, an untouched pool, an all-NaN output), CUDA-graph
    replay and slots past the 2^31-element line (GPU). The receipt is written as cases
    finish, so an interrupted run leaves a partial one; `kdabench verify` checks it.

    The GPU tier runs in worker processes by default (--workers), several sharing a GPU,
    with cases that compile the same kernels in one worker and long cases spread; their
    receipts are merged into one, and a worker that dies fails the run with its log tail.
    Each case records wall_s split into compile_s (kernel compiles) and run_s; the config's
    "time" holds the totals and the wall time of the whole run. --tp N runs the
    tensor-parallel case alone.

    Exit 0 when every case passes; 1 when a case fails or errors, or a worker dies; 2 for
    bad input (a matrix file that does not load, a bad --shard, --tier gpu without a GPU,
    --gpus naming more GPUs than the machine has).
    """
    if tensor_parallel is not None:
        given = [name for name, value in (("--gpus", gpus), ("--workers", workers))
                 if value is not None]
        if given:
            raise UserError(f"{given[0]} and --tp do not combine; give one of them")
        if shard is not None or list_only:
            raise UserError(f"--tp runs one case; leave out "
                            f"{'--shard' if shard is not None else '--list'}")
        _finish(_run_tensor_parallel(tensor_parallel, tier, backend, matrix_path, contains,
                                     out_dir), as_json)
        return
    from kdabench.qualify import Qualification, QualifyError, default_tier

    tier = tier or ("gpu" if gpus is not None else default_tier())
    if _in_workers(tier, gpus, workers, shard, list_only):
        _finish(_run_parallel(tier, backend, matrix_path, out_dir, contains, gpus, workers),
                as_json)
        return
    with user_errors(MatrixError, QualifyError):
        matrix = load_matrix(matrix_path)
        shard_spec = parse_shard(shard) if shard is not None else None
        if list_only:
            _list(select_cases(matrix.expand(tier), shard=shard_spec, contains=contains),
                  as_json)
            return
        try:
            run = Qualification(matrix, tier=tier, backend=backend, shard=shard_spec,
                                contains=contains, out_dir=out_dir)
        except (ReceiptError, ValueError) as error:
            raise UserError(str(error)) from error

    _finish(_run_with_progress(run), as_json)


def _finish(result: QualifyResult, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        _render(Console(highlight=False, soft_wrap=True), result)
    if not result.ok:
        failed = len([c for c in result.cases if c["verdict"] != "pass"])
        raise Finding(f"{failed} of {len(result.cases)} cases did not pass; "
                      f"receipt: {result.receipt_path}")


def _in_workers(tier: str, gpus: str | None, workers: int | None, shard: str | None,
                list_only: bool) -> bool:
    """Whether the run goes to worker processes: the GPU tier unless --workers 1, the CPU
    tier with --workers N > 1; never a lone --shard or --list (UserError if asked for)."""
    given = [name for name, value in (("--gpus", gpus), ("--workers", workers))
             if value is not None]
    if given and (shard is not None or list_only):
        raise UserError(f"{given[0]} runs the shards itself; leave out "
                        f"{'--shard' if shard is not None else '--list'}")
    if shard is not None or list_only:
        return False
    if gpus is not None:
        return True
    if workers is not None:
        return workers != 1
    return tier == "gpu"


def _run_parallel(tier: str, backend: str | None, matrix_path: Path | None,
                  out_dir: Path | None, contains: str | None, gpus: str | None,
                  workers: int | None) -> QualifyResult:
    from kdabench.qualify import QualifyError
    from kdabench.qualify.parallel import ParallelQualification

    with user_errors(MatrixError, QualifyError):
        run = ParallelQualification(
            load_matrix(matrix_path), tier=tier, backend=backend, contains=contains,
            out_dir=out_dir, matrix_path=matrix_path, gpus=gpus, workers=workers)
    return _run_workers_with_progress(run)


def _run_tensor_parallel(world_size: int, tier: str | None, backend: str | None,
                         matrix_path: Path | None, contains: str | None,
                         out_dir: Path | None) -> QualifyResult:
    from kdabench.qualify import default_tier
    from kdabench.tensor_parallel import qualify_tensor_parallel

    if matrix_path is not None or contains is not None or backend not in (None, "triton"):
        raise UserError("--tp runs one fixed case on the triton backend; leave out "
                        "--matrix, --filter and --backend")
    tier = tier or default_tier()
    if world_size < 1:
        raise UserError(f"--tp must be at least 1, got {world_size}")
    if tier == "gpu":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count < world_size:
            raise UserError(f"--tp {world_size} on the GPU tier needs {world_size} GPUs and "
                            f"this machine has {count}; use --tier cpu for gloo ranks")
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    console.print(f"qualify · tensor-parallel · {world_size} ranks · {tier} tier · "
                  f"{'nccl' if tier == 'gpu' else 'gloo'}")
    try:
        return qualify_tensor_parallel(world_size, tier=tier, out_dir=out_dir)
    except ValueError as error:
        raise UserError(str(error)) from error


def _run_workers_with_progress(run) -> QualifyResult:
    from kdabench.qualify.parallel import WorkerFailed

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    where = f" on {len(run.gpus)} GPU(s)" if run.gpus else ""
    console.print(f"qualify · {run.tier} tier · {run.backend} · {len(run.cases)} cases · "
                  f"{run.count} worker processes{where} · receipt in "
                  f"{escape(str(run.out_dir))}")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[status]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        tasks: dict[str, Any] = {}
        reported: set[str] = set()

        def on_start(workers) -> None:
            for worker in workers:
                tasks[worker.label] = progress.add_task(escape(worker.label),
                                                        total=worker.cases, status="")

        def on_poll(workers) -> None:
            for worker in workers:
                for case_id in worker.failed_ids:
                    if case_id not in reported:
                        reported.add(case_id)
                        progress.console.print(f"[red]NOT PASS[/red] {escape(worker.label)}: "
                                               f"{escape(case_id)}")
                status = ("running" if worker.returncode is None
                          else f"exit {worker.returncode}")
                if worker.failed:
                    status += f" · [red]{worker.failed} not pass[/red]"
                progress.update(tasks[worker.label], completed=worker.done, status=status)

        try:
            result = run.run(on_start=on_start, on_poll=on_poll)
        except KeyboardInterrupt:
            progress.stop()
            print_error("interrupted: the workers were stopped; no merged receipt",
                        style="bold yellow")
            raise click.exceptions.Exit(130) from None
        except WorkerFailed as error:
            progress.stop()
            for label, code, tail in error.failures:
                console.print(f"[red]worker {escape(label)} failed (exit {code})[/red]; "
                              "its log ends:")
                console.print(tail, markup=False)
            raise Finding(str(error)) from None
        except ReceiptError as error:
            raise Finding(f"the shard receipts do not merge: {error}") from None
        except OSError as error:
            raise UserError(f"cannot write the merged receipt into {run.out_dir}: "
                            f"{error.strerror or error}") from error
    return result


def _list(cases: list, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([{"index": c.index, "id": c.id, "scenario": c.scenario}
                               for c in cases], indent=2))
        return
    for case in cases:
        click.echo(f"{case.index:4d}  {case.id}")
    click.echo(f"{len(cases)} cases", err=True)


def _run_with_progress(run: Qualification) -> QualifyResult:
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    console.print(f"qualify · {run.tier} tier · {run.backend} · {len(run.cases)} cases · "
                  f"receipt {escape(str(run.path))}")
    return run_cases_with_progress(console, run, total=len(run.cases), first="starting",
                                   label=lambda case: case.id[:60], receipt=str(run.path))


def _render(console: Console, result: QualifyResult) -> None:
    from kdabench.qualify import fmt_error

    table = Table(title=f"qualify · {result.receipt['config']['tier']} tier · "
                  f"{escape(str(result.receipt['device'].get('name')))}", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    table.add_column("scenario", no_wrap=True, min_width=14)
    for column in ("cases", "pass", "fail", "error", "out err", "state err"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("median ms", justify="right", no_wrap=True)
    table.caption = "err: worst relative Frobenius error against float64"
    for scenario, row in result.by_scenario.items():
        bad = row["fail"] + row["error"]
        table.add_row(
            escape(scenario), str(row["cases"]), f"[green]{row['pass']}[/green]",
            f"[red]{row['fail']}[/red]" if row["fail"] else "0",
            f"[red]{row['error']}[/red]" if row["error"] else "0",
            fmt_error(row["worst_output_error"]), fmt_error(row["worst_state_error"]),
            "-" if row["median_ms"] is None else f"{row['median_ms']:.3f}",
            style="red" if bad else None,
        )
    console.print(table)
    failures = [c for c in result.cases if c["verdict"] != "pass"]
    for case in failures[:FAILURES_SHOWN]:
        console.print(f"[red]{case['verdict']}[/red] {escape(case['id'])}: "
                      f"{escape(str(case.get('message')))}")
    if len(failures) > FAILURES_SHOWN:
        console.print(f"... and {len(failures) - FAILURES_SHOWN} more (see the receipt)")
    summary = result.summary
    console.print(f"receipt {escape(str(result.receipt_path))} · sha256 "
                  f"{result.receipt['sha256'][:16]}… · {summary['total']} cases: "
                  f"{summary['pass']} pass, {summary['fail']} fail, {summary['error']} error")
    timing = result.receipt["config"].get("time")
    if timing:
        wall = "-" if timing["wall_s"] is None else f"{timing['wall_s']:.1f} s"
        console.print(f"time: wall {wall} · {timing['workers']} worker(s) · summed over "
                      f"cases: compile {timing['compile_s']:.1f} s, run {timing['run_s']:.1f} s")
    if result.ok:
        console.print(f"[green]all {summary['total']} cases pass[/green]")
