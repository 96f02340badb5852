"""Qualification across worker processes: several per GPU (the GPU tier's default), or N
interpreter processes on the CPU.

    from kdabench.qualify.parallel import ParallelQualification

    run = ParallelQualification(matrix, tier="gpu")  # default_workers() on the first GPU
    result = run.run(on_poll=print)     # a QualifyResult over the merged receipt
    result.ok, result.receipt_path

The cases are split with :func:`kdabench.qualify.assign.plan_workers` (cases that compile the
same kernels together, long cases spread) and each part runs in a fresh `python -m
kdabench.qualify.worker` process (never through the CLI), which writes its receipt. Several
workers share a GPU: a Triton compile is single-threaded CPU work and Triton's on-disk cache is
shared between the processes, so compiles run side by side while the GPU runs the others'
cases. Workers are dealt to the GPUs in turn; a GPU worker sees only its GPU
(CUDA_VISIBLE_DEVICES) and every worker runs with NVLink multicast off (:data:`MULTICAST_OFF`).
A CPU worker sees no GPU and runs the kernels under the Triton interpreter, which is how this
path is tested without GPUs. The CUDA-event samples of workers sharing a GPU are taken while
the other workers use it.

The workers' receipts are joined with :func:`kdabench.qualify.merge.merge_qualify_receipts`
(``config["merged_from"]`` lists each part's receipt hash, cases and device; ``config["time"]``
the compile, run and case wall totals and the wall time of the whole run) and the merged config
gains ``config["workers"]``: per worker its label, part, the CUDA_VISIBLE_DEVICES it ran with,
the device name and uuid, exit status and wall time. The merged receipt is written to the
receipt folder (``out_dir``, else $KDABENCH_OUT, else ./.kdabench) as
``qualify-<device>-<time>.json``; the parts' receipts and worker logs live in a temporary
folder, removed when the run succeeds and kept (its path in the error) when a worker fails.

A worker that exits with a finding (status 1: a failed case) still leaves a complete
receipt and is merged; a worker that dies, or leaves no complete receipt, fails the run
with :class:`WorkerFailed`, which carries each failed worker's log tail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kdabench.environment import usable_cpus
from kdabench.matrix import Case, Matrix, MatrixError, select_cases
from kdabench.qualify.assign import plan_workers
from kdabench.qualify.merge import merge_qualify_receipts
from kdabench.qualify.run import QualifyError, QualifyResult, matrix_backend
from kdabench.receipts import (
    atomic_write_bytes,
    free_receipt_path,
    load_receipt,
    receipt_dir,
    receipt_filename,
    render_receipt,
    seal,
)

#: Set in every worker's environment: NVLink multicast (NVLS) off for NCCL, symmetric
#: memory and NVSHMEM, as the lent multi-GPU machines require.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

LOG_TAIL_LINES = 40
#: What a worker runs (`python -m`): kdabench.qualify.worker, not the CLI.
WORKER_MODULE = "kdabench.qualify.worker"
#: At most this many workers by default: beyond it the GPU, not the compiles, is the limit.
MAX_DEFAULT_WORKERS = 8


def default_workers(gpus: int, cpus: int | None = None) -> int:
    """Workers for a GPU-tier run on `gpus` GPUs: one per two CPU cores this process may use
    (a compile takes a core, the worker's own Python another), at most MAX_DEFAULT_WORKERS,
    at least one per GPU."""
    cpus = cpus if cpus is not None else usable_cpus()
    return max(gpus, min(MAX_DEFAULT_WORKERS, cpus // 2))


class WorkerFailed(RuntimeError):
    """One or more workers died or left no complete receipt; `failures` holds
    (label, exit status, log tail) per failed worker and `folder` the kept work folder."""

    def __init__(self, failures: list[tuple[str, int | None, str]], folder: Path) -> None:
        self.failures = failures
        self.folder = folder
        names = ", ".join(f"{label} (exit {code})" for label, code, _ in failures)
        super().__init__(f"{len(failures)} worker(s) failed: {names}; logs and shard "
                         f"receipts kept in {folder}")


# --------------------------------------------------------------------------- choosing GPUs


def visible_gpus() -> list[str]:
    """The CUDA_VISIBLE_DEVICES value that selects each GPU this process sees, in order."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    if inherited is None or not inherited.strip():
        return [str(index) for index in range(count)]
    return [entry.strip() for entry in inherited.split(",")][:count]


def parse_gpus(spec: str, visible: Sequence[str]) -> list[str]:
    """GPUs for `--gpus`: "all" or a comma list of indices among `visible` -> their
    CUDA_VISIBLE_DEVICES values. Raises QualifyError (bad input) otherwise."""
    if not visible:
        raise QualifyError("--gpus needs CUDA GPUs and torch sees none here; "
                           "use --workers N for CPU worker processes")
    if spec.strip() == "all":
        return list(visible)
    try:
        indices = [int(part) for part in spec.split(",")]
    except ValueError:
        raise QualifyError(f"--gpus {spec!r}: expected 'all' or GPU indices such as 0,1") \
            from None
    if len(set(indices)) != len(indices):
        raise QualifyError(f"--gpus {spec!r} names a GPU twice")
    missing = [index for index in indices if not 0 <= index < len(visible)]
    if missing:
        raise QualifyError(
            f"--gpus {spec!r} asks for GPU {', '.join(map(str, missing))} but this machine "
            f"has {len(visible)} GPU(s) (0..{len(visible) - 1}); use --gpus all")
    return [visible[index] for index in indices]


# --------------------------------------------------------------------------- workers


@dataclass
class Worker:
    """One worker process: its part of the run, its cases (indices in the tier's expansion),
    its GPU (None: a CPU worker), its folder and log."""

    shard: tuple[int, int]
    gpu: str | None
    folder: Path
    case_indices: list[int]
    process: subprocess.Popen | None = None
    started: float = 0.0
    wall_s: float | None = None
    returncode: int | None = None
    done: int = 0
    failed: int = 0
    failed_ids: list[str] = field(default_factory=list)

    @property
    def cases(self) -> int:
        return len(self.case_indices)

    @property
    def label(self) -> str:
        where = f"gpu {self.gpu}" if self.gpu is not None else f"worker {self.shard[0]}"
        return f"{where} · shard {self.shard[0]}/{self.shard[1]}"

    @property
    def log_path(self) -> Path:
        return self.folder / "worker.log"

    @property
    def receipt_path(self) -> Path | None:
        found = sorted(self.folder.glob("qualify-*.json"))
        return found[0] if found else None

    def poll(self) -> bool:
        """Refresh progress from the partial receipt; True while the process runs."""
        if self.process is not None and self.returncode is None:
            code = self.process.poll()
            if code is not None:
                self.returncode = code
                self.wall_s = round(time.monotonic() - self.started, 3)
        self._read_progress()
        return self.process is not None and self.returncode is None

    def _read_progress(self) -> None:
        path = self.receipt_path
        if path is None:
            return
        try:
            cases = json.loads(path.read_text()).get("cases", [])
        except (OSError, ValueError):
            return  # between writes; the next poll reads it
        self.done = len(cases)
        self.failed_ids = [c["id"] for c in cases if c.get("verdict") != "pass"]
        self.failed = len(self.failed_ids)

    def complete(self) -> bool:
        """Exited 0 or 1 (a finding) and left a complete receipt."""
        if self.returncode not in (0, 1) or self.receipt_path is None:
            return False
        try:
            return load_receipt(self.receipt_path).get("status") == "complete"
        except Exception:  # noqa: BLE001 - an unreadable receipt is a failed worker
            return False

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.rstrip().splitlines()[-lines:])


def worker_environment(gpu: str | None, workers: int) -> dict[str, str]:
    """The environment of one worker: its GPU alone (or none), multicast off, and on the CPU
    the Triton interpreter; an even share of the cores for torch's CPU threads."""
    env = {**os.environ, **MULTICAST_OFF, "PYTHONUNBUFFERED": "1", "COLUMNS": "160"}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
        env.pop("TRITON_INTERPRET", None)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["TRITON_INTERPRET"] = "1"
    env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cpus() // workers)))
    return env


# --------------------------------------------------------------------------- the run


class ParallelQualification:
    """A qualification split over worker processes, merged into one receipt.

    GPU tier: `gpus` ("all" or "0,1"; default: the first GPU torch sees) and `workers` (in
    all, dealt to the GPUs in turn; default :func:`default_workers`). CPU tier: `workers`
    (required). Construction checks what a user can get wrong and raises QualifyError or
    MatrixError. There are never more workers than selected cases.
    """

    def __init__(
        self, matrix: Matrix, *, tier: str, backend: str | None = None,
        contains: str | None = None, out_dir: str | os.PathLike | None = None,
        matrix_path: str | os.PathLike | None = None, gpus: str | None = None,
        workers: int | None = None, command_line: Sequence[str] | None = None,
        python: str = sys.executable,
    ) -> None:
        if gpus is not None and tier != "gpu":
            raise QualifyError("--gpus runs the GPU tier; leave out --tier cpu or use --workers")
        if workers is not None and workers < 1:
            raise QualifyError(f"--workers must be at least 1, got {workers}")
        if tier == "cpu" and workers is None:
            raise QualifyError("the CPU tier in worker processes needs --workers N")
        backend = backend or matrix.backends[0]
        matrix_backend(matrix, backend)
        self.matrix, self.tier, self.backend, self.contains = matrix, tier, backend, contains
        self.matrix_path = None if matrix_path is None else Path(matrix_path).resolve()
        self.out_dir = receipt_dir(out_dir)
        self.command_line = list(sys.argv) if command_line is None else list(command_line)
        self.python = python
        self.cases: list[Case] = select_cases(matrix.expand(tier), contains=contains)
        if not self.cases:
            raise MatrixError(f"no {tier}-tier case of {matrix.origin} matches "
                              f"{'the filter ' + repr(contains) if contains else 'this run'}")
        self.gpus: list[str] = _chosen_gpus(gpus) if tier == "gpu" else []
        if workers is None:
            workers = default_workers(len(self.gpus))
        if workers < len(self.gpus):
            raise QualifyError(f"--workers {workers} is fewer than the {len(self.gpus)} GPUs "
                               "asked for; give at least one worker per GPU")
        self.parts = plan_workers(self.cases, min(workers, len(self.cases)))
        self.count = len(self.parts)

    def worker_command(self, worker: Worker) -> list[str]:
        """The command line of `worker`: the worker module, never the CLI."""
        command = [self.python, "-m", WORKER_MODULE, "--tier", self.tier, "--backend", self.backend,
                   "--part", f"{worker.shard[0]}/{worker.shard[1]}",
                   "--cases", ",".join(map(str, worker.case_indices)),
                   "--out", str(worker.folder)]
        if self.matrix_path is not None:
            command += ["--matrix", str(self.matrix_path)]
        if self.contains is not None:
            command += ["--filter", self.contains]
        return command

    def _workers(self, root: Path) -> list[Worker]:
        workers = []
        for number, part in enumerate(self.parts, start=1):
            gpu = self.gpus[(number - 1) % len(self.gpus)] if self.gpus else None
            workers.append(Worker((number, self.count), gpu,
                                  root / f"shard{number}of{self.count}",
                                  [case.index for case in part]))
        return workers

    def run(self, *, on_start: Callable[[list[Worker]], None] | None = None,
            on_poll: Callable[[list[Worker]], None] | None = None,
            poll_s: float = 0.5) -> QualifyResult:
        """Start the workers, wait for them (calling `on_poll` with their progress), merge
        their receipts and write the merged one. Raises WorkerFailed when a worker fails;
        Ctrl-C stops the workers and propagates."""
        started = time.monotonic()
        root = Path(tempfile.mkdtemp(prefix="kdabench-qualify-workers-"))
        workers = self._workers(root)
        if on_start:
            on_start(workers)
        try:
            for worker in workers:
                worker.folder.mkdir(parents=True)
                with worker.log_path.open("wb") as log:
                    worker.started = time.monotonic()
                    worker.process = subprocess.Popen(
                        self.worker_command(worker), stdout=log,
                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        env=worker_environment(worker.gpu, self.count))
            while True:
                running = [worker.poll() for worker in workers]
                if on_poll:
                    on_poll(workers)
                if not any(running):
                    break
                time.sleep(poll_s)
        except BaseException:
            _stop(workers)
            raise
        failed = [w for w in workers if not w.complete()]
        if failed:
            raise WorkerFailed([(w.label, w.returncode, w.log_tail()) for w in failed], root)
        result = self._merge(workers, round(time.monotonic() - started, 3))
        shutil.rmtree(root, ignore_errors=True)
        return result

    def _merge(self, workers: list[Worker], wall_s: float) -> QualifyResult:
        docs = [load_receipt(worker.receipt_path) for worker in workers]
        merged = merge_qualify_receipts(docs, labels=[w.label for w in workers],
                                        command_line=self.command_line, wall_s=wall_s)
        merged["config"]["workers"] = [
            {"label": w.label, "shard": f"{w.shard[0]}/{w.shard[1]}",
             "cuda_visible_devices": w.gpu, "device_name": doc["device"].get("name"),
             "device_uuid": doc["device"].get("uuid"), "cases": len(doc["cases"]),
             "returncode": w.returncode, "wall_s": w.wall_s}
            for w, doc in zip(workers, docs, strict=True)
        ]
        merged["config"]["parallel"] = {"mode": "gpus" if self.tier == "gpu" else "workers",
                                        "count": self.count, "gpus": len(self.gpus),
                                        "assignment": "compile groups, longest first",
                                        "multicast_off": MULTICAST_OFF}
        merged = seal(merged)
        filename = receipt_filename("qualify", merged["device"], merged["created_at"])
        path = free_receipt_path(self.out_dir, filename)
        atomic_write_bytes(path, render_receipt(merged))
        return QualifyResult(path, merged, merged["cases"])


def _chosen_gpus(spec: str | None) -> list[str]:
    """The GPUs of a GPU-tier run: those `spec` names ("all", "0,1"), else the first visible
    one (the one a process without CUDA_VISIBLE_DEVICES of its own would use)."""
    visible = visible_gpus()
    if spec is not None:
        return parse_gpus(spec, visible)
    if not visible:
        raise QualifyError("--tier gpu needs a CUDA GPU and torch sees none here "
                           "(torch.cuda.is_available() is False); run --tier cpu instead")
    return visible[:1]


def _stop(workers: list[Worker]) -> None:
    """Terminate the workers this run started (each by its own handle), then wait."""
    for worker in workers:
        if worker.process is not None and worker.process.poll() is None:
            worker.process.terminate()
    for worker in workers:
        if worker.process is not None:
            try:
                worker.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()

