"""A backend's fuzzing split over worker processes (on a GPU sharing it; on the CPU, where
the Triton interpreter keeps a core busy per process, one per core): each worker fuzzes
from its own seed (worker i: seed + i * SEED_STRIDE, so worker 0 draws what a one-process run
draws), compiles while the others do, and checks its sets on its own CPU core; their results
are merged into one BackendRun (kdabench.fuzz.run.merge_runs). Only worker 0 draws sets past
the 2^31-element line (:func:`worker_limits`): a rig for them holds a pool of over 2^31
elements and its copy per capacity (about 50 GiB for the GPU limits), which eight processes
could not all hold on one GPU.

    run = fuzz_backend(campaign, "triton", on_progress)  # in-process when workers == 1

A worker that dies is a failed set with its log tail as the finding: a crash while running
metadata is what the fuzzer looks for.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from kdabench.environment import usable_cpus
from kdabench.fuzz.generate import Limits
from kdabench.fuzz.run import BackendRun, Campaign, merge_runs

WORKER_MODULE = "kdabench.fuzz.worker"
SEED_STRIDE = 1_000_000
LOG_TAIL_LINES = 20


HIGH_SLOT_WORKER = 0
MAX_CPU_WORKERS = 8


def cpu_workers(cpus: int | None = None) -> int:
    """Workers for a CPU run: one per core this process may use (its affinity, and a cgroup
    quota where one is set; each worker keeps a core busy in the Triton interpreter), at most
    MAX_CPU_WORKERS."""
    if cpus is None:
        cpus = usable_cpus()
    return max(1, min(MAX_CPU_WORKERS, cpus))


def worker_limits(limits: Limits, index: int) -> Limits:
    """Worker ``index``'s limits: the campaign's, with no high-slot sets but in worker 0."""
    return limits if index == HIGH_SLOT_WORKER else replace(limits, high_share=0.0)


def worker_seeds(seed: int, workers: int) -> list[int]:
    """The seed of each worker: worker 0 keeps the campaign's."""
    return [seed + index * SEED_STRIDE for index in range(workers)]


def worker_counts(count: int | None, workers: int) -> list[int | None]:
    """Sets per worker: `count` split as evenly as it goes (None: no count, only seconds)."""
    if count is None:
        return [None] * workers
    share = math.ceil(count / workers)
    return [max(0, min(share, count - index * share)) for index in range(workers)]


class _Barrier:
    """Starts the workers' clocks together: each says "warm" (or ends) once, and when all have,
    every one still running gets a line on stdin."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.arrived = 0
        self.lock = threading.Lock()

    def arrive(self) -> None:
        with self.lock:
            self.arrived += 1
            if self.arrived != len(self.procs):
                return
        for proc in self.procs:
            with contextlib.suppress(OSError, ValueError):  # a worker that already ended
                proc.stdin.write("go\n")
                proc.stdin.flush()


def _command(campaign: Campaign, backend: str, index: int, seed: int, count: int | None,
             result: Path) -> list[str]:
    tier = "gpu" if campaign.device.type == "cuda" else "cpu"
    command = [sys.executable, "-m", WORKER_MODULE, "--tier", tier, "--backend", backend,
               "--seed", str(seed),
               "--tag", f"{backend}-w{index}", "--findings", str(campaign.findings_dir),
               "--result", str(result), "--warm-part", f"{index}/{campaign.workers}"]
    if count is not None:
        command += ["--count", str(count)]
    if campaign.seconds is not None:
        command += ["--seconds", str(campaign.seconds)]
    return command


def _died(backend: str, index: int, code: int, log: Path) -> BackendRun:
    try:
        tail = "\n".join(log.read_text(errors="replace").rstrip().splitlines()[-LOG_TAIL_LINES:])
    except OSError:
        tail = "(no log)"
    run = BackendRun(backend, failed=1)
    run.findings.append({"check": "worker", "message": f"worker {index} exited with status "
                         f"{code}", "log_tail": tail})
    return run


def run_backend_parallel(campaign: Campaign, backend: str,
                         on_progress: Callable[[str, int], None] | None = None) -> BackendRun:
    """Fuzz `backend` in `campaign.workers` processes on the campaign's device."""
    seeds = worker_seeds(campaign.seed, campaign.workers)
    counts = worker_counts(campaign.count, campaign.workers)
    done = [0] * campaign.workers
    lock = threading.Lock()
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    campaign.findings_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kdabench-fuzz-") as work:
        folder = Path(work)
        procs, logs, results, readers = [], [], [], []
        barrier = _Barrier()
        for index, (seed, count) in enumerate(zip(seeds, counts, strict=True)):
            if count == 0:
                continue
            result, log = folder / f"w{index}.json", folder / f"w{index}.log"
            with log.open("w") as stderr:
                proc = subprocess.Popen(_command(campaign, backend, index, seed, count, result),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=stderr, text=True, env=env)
            procs.append((index, proc))
            barrier.procs.append(proc)
            logs.append(log)
            results.append(result)

        def read(proc: subprocess.Popen, index: int) -> None:
            warm = False
            for line in proc.stdout:
                if line.startswith("warm") and not warm:
                    warm = True
                    barrier.arrive()
                elif line.startswith("sets "):
                    with lock:
                        done[index] = int(line.split()[1])
                        total = sum(done)
                    if on_progress is not None:
                        on_progress(backend, total)
            if not warm:  # ended (skipped, or died) before its warm-up was done
                barrier.arrive()

        for index, proc in procs:
            readers.append(threading.Thread(target=read, args=(proc, index), daemon=True))
            readers[-1].start()
        runs = []
        for (index, proc), log, result, reader in zip(procs, logs, results, readers,
                                                      strict=True):
            code = proc.wait()
            reader.join()
            if code == 0 and result.exists():
                runs.append(BackendRun.from_json(json.loads(result.read_text())))
            else:
                runs.append(_died(backend, index, code, log))
    skipped = [run for run in runs if run.skipped]
    if skipped and len(skipped) == len(runs):
        return skipped[0]
    return merge_runs([run for run in runs if not run.skipped])


def fuzz_backend(campaign: Campaign, backend: str,
                 on_progress: Callable[[str, int], None] | None = None) -> BackendRun:
    """Fuzz `backend` in this process (one worker) or in `campaign.workers` processes."""
    if campaign.workers > 1:
        return run_backend_parallel(campaign, backend, on_progress)
    return campaign.run_backend(backend, on_progress)
