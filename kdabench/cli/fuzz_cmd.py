"""`kdabench fuzz`: metadata fuzzing of the prefill, with shrunk findings and a receipt.

kdabench.fuzz (torch) is imported inside the command, so `kdabench --help` stays light.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.progress import Progress, TextColumn, TimeElapsedColumn

from kdabench.cli.errors import Finding, UserError, print_error, user_errors

BACKEND_NAMES = ("triton", "cute")


def _backends(backend: str | None, backends: str | None) -> list[str]:
    if backend and backends:
        raise UserError("give --backend or --backends, not both")
    names = [b.strip() for b in (backends or backend or "triton").split(",") if b.strip()]
    unknown = [b for b in names if b not in BACKEND_NAMES]
    if unknown or not names:
        raise UserError(f"unknown backend(s) {', '.join(unknown) or '(none)'}; "
                        f"expected {' or '.join(BACKEND_NAMES)}")
    return list(dict.fromkeys(names))


def _device():
    from kdabench.qualify import QualifyError, default_tier, prepare_tier

    with user_errors(QualifyError):
        return prepare_tier(default_tier())  # the CPU runs the Triton interpreter


@click.command("fuzz")
@click.option("--backend", default=None, metavar="NAME", help="triton (default) or cute.")
@click.option("--backends", default=None, metavar="A,B",
              help="Several backends, e.g. triton,cute; one that cannot run here is skipped "
              "with its reason.")
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="Sets per backend (default 2000 when --seconds is not given either).")
@click.option("--seconds", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Time budget per backend; with --count, whichever runs out first.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sets.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False),
              default=None, help="Folder for the receipt and its findings (default: "
              "$KDABENCH_OUT, else .kdabench/).")
@click.option("--replay", "replay_path", type=click.Path(path_type=Path), default=None,
              help="Run the JSON case FILE (or every case in a folder) again instead of "
              "fuzzing; exit 1 if any still fails.")
@click.option("--corpus", "corpus_dir", type=click.Path(path_type=Path, file_okay=False),
              default=None, help="Write a seed corpus into this folder (one passing case "
              "per fault class and a valid one) instead of fuzzing.")
@click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
              help="Worker processes per backend, sharing the device, each from its own seed "
              "(worker i: seed + i * 1000000). Default on a GPU: min(8, CPU cores / 2); on "
              "the CPU: min(8, CPU cores).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def fuzz(backend: str | None, backends: str | None, count: int | None, seconds: float | None,
         seed: int, out_dir: Path | None, replay_path: Path | None, corpus_dir: Path | None,
         workers: int | None, as_json: bool) -> None:
    """Fuzz the prefill's runtime metadata and write a receipt (kind "fuzz").

    Seeded sets of metadata, valid ones (ragged batches, short and length-1 sequences,
    offsets at 1 and len - 1, null slots, inactive checkpoints, live count below the bound
    rows, capacity 1/2/4) and faulty ones (every fault class, alone and combined; on a GPU
    also slots past the 2^31-element line), run through plan/bind/run. Each set's expected
    error code comes from the metadata oracle. Valid sets: outputs, final states and
    checkpoints against the float64 recurrence, every slot not named unchanged bit for bit.
    Faulty sets: the exact error bits, an all-NaN output, the whole pool unchanged bit for
    bit. A failing set is shrunk and written as a JSON case beside the receipt. The sets
    run in several worker processes (--workers), on a GPU sharing it, on the CPU a core
    each; the receipt's seconds are the wall time of the timed sets, warm-up compiles apart.

    Exit 0 when nothing failed, 1 for a finding (or a replayed case that still fails), 2 for
    bad input (an unknown backend, a file that is not a case, no backend that can run here).
    """
    if replay_path is not None or corpus_dir is not None:
        if replay_path is not None and corpus_dir is not None:
            raise UserError("give --replay or --corpus, not both")
        if replay_path is not None:
            _replay(replay_path, as_json)
        else:
            _corpus(corpus_dir, _backends(backend, backends)[0], seed, as_json)
        return
    names = _backends(backend, backends)
    device = _device()
    from kdabench.fuzz import CPU_LIMITS, GPU_LIMITS, Campaign
    from kdabench.fuzz.parallel import cpu_workers
    from kdabench.fuzz.receipt import run_campaign
    from kdabench.qualify.parallel import default_workers

    gpu = device.type == "cuda"
    limits = GPU_LIMITS if gpu else CPU_LIMITS
    if count is None and seconds is None:
        count = 2000
    if workers is None:
        workers = default_workers(1) if gpu else cpu_workers()
    campaign = Campaign(names, seed, count, seconds, device, limits,
                        warm=gpu, workers=workers)  # the interpreter compiles nothing
    console = Console(stderr=True, highlight=False)
    with Progress(TextColumn("{task.description}"), TextColumn("{task.completed} sets"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        tasks = {name: progress.add_task(f"fuzz {name}", total=count) for name in names}
        runs, path = run_campaign(
            campaign, out_dir=out_dir,
            on_progress=lambda name, done: progress.update(tasks[name], completed=done))
    records = [run.record() for run in runs]
    if as_json:
        click.echo(json.dumps({"receipt": str(path), "backends": records}, indent=2))
    else:
        for record in records:
            if record["verdict"] == "skip":
                click.echo(f"{record['id']}: skipped: {record['message']}")
                continue
            click.echo(f"{record['id']}: {record['sets']} sets ({record['valid_sets']} valid, "
                       f"{record['faulty_sets']} faulty), {record['sets_per_second']} sets/s, "
                       f"{record['failed_sets']} failed")
            for finding in record["findings"]:
                click.echo(f"  finding {finding.get('file') or '(no case file)'}: "
                           f"{finding['check']}: {finding['message']}")
                if finding.get("log_tail"):  # a worker that died: the end of its log
                    click.echo("    " + finding["log_tail"].replace("\n", "\n    "))
        click.echo(f"receipt: {path}")
    if all(run.skipped for run in runs):
        raise UserError("no backend can run here: " + "; ".join(
            f"{run.backend}: {run.skipped}" for run in runs))
    failed = sum(run.failed for run in runs)
    if failed:
        raise Finding(f"{failed} set(s) failed; receipt: {path}")


def _replay(path: Path, as_json: bool) -> None:
    from kdabench.fuzz import CaseError, case_files, replay

    device = _device()
    with user_errors(CaseError):
        results = replay(case_files(path), device)
    rows = [{"file": str(r.path), "ok": r.result.ok, "expected_error_code": r.result.expected,
             "error_code": r.result.code,
             "failures": [{"check": f.check, "message": f.message} for f in r.result.failures]}
            for r in results]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        for row in rows:
            verdict = "passes" if row["ok"] else "FAILS: " + "; ".join(
                f"{f['check']}: {f['message']}" for f in row["failures"])
            click.echo(f"{row['file']}: {verdict}")
    still = [row for row in rows if not row["ok"]]
    if still:
        raise Finding(f"{len(still)} of {len(rows)} case(s) still fail")


def _corpus(folder: Path, backend: str, seed: int, as_json: bool) -> None:
    from kdabench.fuzz.corpus import write_corpus

    device = _device()
    written, failing = write_corpus(folder, backend, seed, device)
    if as_json:
        click.echo(json.dumps({"written": [str(p) for p in written],
                               "failing": [str(p) for p in failing]}, indent=2))
    else:
        click.echo(f"{len(written)} case(s) written to {folder}")
    if failing:
        print_error(f"{len(failing)} corpus case(s) fail on this device: "
                    + ", ".join(p.name for p in failing))
        raise Finding("the seed corpus holds failing cases")
