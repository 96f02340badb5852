"""Tiers, the run loop and the receipt: a Qualification runs the chosen cases of a matrix on
a tier and writes their records to a receipt as they finish; per-scenario summaries.

Each case record splits its wall time: ``wall_s`` (the whole case), ``compile_s`` (kernel
compiles, see kdabench.qualify.compile_clock), ``run_s`` (the rest) and the kernels it
compiled or found in Triton's on-disk cache. The config's ``time`` holds the totals, the wall
time of the whole run, the worker count and what ``compile_s`` measures."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kdabench import interp_memcheck
from kdabench.kernel_records import KERNEL_RECORD_KEYS, backend_and_config
from kdabench.matrix import Case, Matrix, MatrixError, select_cases
from kdabench.qualify.compile_clock import CLOCK, MEASURES
from kdabench.qualify.harness import Context
from kdabench.qualify.scenarios import RUNNERS
from kdabench.receipts import free_receipt_path, new_receipt, receipt_dir
from kdabench.stats import median


class QualifyError(ValueError):
    """A run that cannot start (no GPU for the GPU tier, unknown backend); one line."""


# --------------------------------------------------------------------------- tiers


def default_tier() -> str:
    """'gpu' when torch sees a CUDA device, else 'cpu'."""
    return "gpu" if torch.cuda.is_available() else "cpu"


def _kernels_interpreted() -> bool | None:
    """Whether the imported kernels are interpreted; None when not imported yet."""
    launch = sys.modules.get("kdabench.kernels.triton.launch")
    return None if launch is None else bool(launch.interpreted())


def prepare_tier(tier: str) -> torch.device:
    """Set the process up for a tier and return its device (raises QualifyError)."""
    interpreted = _kernels_interpreted()
    if tier == "cpu":
        if interpreted is False:
            raise QualifyError(
                "the kernels were already imported compiled for the GPU; run the CPU tier in a "
                "fresh process"
            )
        os.environ["TRITON_INTERPRET"] = "1"
        interp_memcheck.install()  # a kernel reading past a tensor fails its case
        return torch.device("cpu")
    if tier != "gpu":
        raise QualifyError(f"unknown tier {tier!r}; expected cpu or gpu")
    if not torch.cuda.is_available():
        raise QualifyError(
            "--tier gpu needs a CUDA GPU and torch sees none here "
            "(torch.cuda.is_available() is False); run --tier cpu instead"
        )
    if interpreted or (interpreted is None and os.environ.get("TRITON_INTERPRET") == "1"):
        raise QualifyError("TRITON_INTERPRET=1 is set: unset it to run the GPU tier")
    return torch.device("cuda", torch.cuda.current_device())


# --------------------------------------------------------------------------- run loop


def run_case(ctx: Context, case: Case) -> dict[str, Any]:
    """Run one case and return its receipt record (never raises but for Ctrl-C)."""
    started = time.perf_counter()
    compiled_before = CLOCK.reading()
    record = {**case.describe(), "tolerances": dict(case.options["tolerances"])}
    try:
        outcome = RUNNERS[case.scenario](ctx, case)
    except KeyboardInterrupt:
        raise
    except Exception as error:  # noqa: BLE001 - a crash is a verdict, not the end of the run
        record.update(verdict="error", message=f"{type(error).__name__}: {error}",
                      errors={}, checks={}, median_ms=None, samples_ms=[])
        if ctx.gpu and isinstance(error, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
    else:
        samples = outcome.samples_ms
        record.update(
            verdict="fail" if outcome.failures else "pass",
            message="; ".join(outcome.failures[:8]) or outcome.note,
            errors=outcome.errors, checks=outcome.checks, shape=outcome.shape,
            median_ms=round(median(samples), 5) if samples else None,
            samples_ms=samples, **outcome.kernel,
        )
        if outcome.details:
            record["details"] = outcome.details
    for key in KERNEL_RECORD_KEYS:  # cases that plan no kernel call (oracle, contracts)
        record.setdefault(key, None)
    if case.scenario == "int32-boundary" and ctx.gpu:
        torch.cuda.empty_cache()
    wall = time.perf_counter() - started
    compiled = CLOCK.reading() - compiled_before
    record.update(wall_s=round(wall, 3), compile_s=round(compiled.seconds, 3),
                  run_s=round(max(wall - compiled.seconds, 0.0), 3),
                  kernels_compiled=compiled.compiled, kernels_cached=compiled.cached)
    return record


def time_totals(cases: Sequence[Mapping[str, Any]], *, wall_s: float | None, workers: int,
                backend_load_s: float | None) -> dict[str, Any]:
    """The config's ``time``: compile, run and case wall seconds summed over the cases, the
    wall time of the whole run (None when unknown), workers, backend load and what
    compile_s measures."""
    def total(key: str) -> float | int:
        return round(sum(case.get(key) or 0 for case in cases), 3)

    return {"compile_s": total("compile_s"), "run_s": total("run_s"),
            "cases_wall_s": total("wall_s"), "wall_s": wall_s, "workers": workers,
            "kernels_compiled": total("kernels_compiled"),
            "kernels_cached": total("kernels_cached"), "backend_load_s": backend_load_s,
            "measures": MEASURES}


@dataclass
class QualifyResult:
    """The outcome of a run: its cases, the receipt written, the verdict."""

    receipt_path: Path
    receipt: dict[str, Any]
    cases: list[dict[str, Any]]

    @property
    def summary(self) -> dict[str, int]:
        return self.receipt["summary"]

    @property
    def ok(self) -> bool:
        return bool(self.cases) and all(case["verdict"] == "pass" for case in self.cases)

    @property
    def by_scenario(self) -> dict[str, dict[str, Any]]:
        return summarize_by_scenario(self.cases)

    def to_dict(self) -> dict[str, Any]:
        config = self.receipt["config"]
        return {
            "ok": self.ok, "receipt": str(self.receipt_path), "sha256": self.receipt["sha256"],
            "status": self.receipt["status"], "tier": config["tier"],
            "backend": config["backend"], "device": self.receipt["device"].get("name"),
            "summary": self.summary, "scenarios": self.by_scenario,
            "time": config.get("time"),
            "failures": [{"id": c["id"], "verdict": c["verdict"], "message": c.get("message")}
                         for c in self.cases if c["verdict"] != "pass"],
        }


def _worst(values: Iterable[Any]) -> float | None:
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(numbers) if numbers else None


def summarize_by_scenario(cases: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scenario: case counts by verdict, worst output and state errors, median time."""
    table: dict[str, dict[str, Any]] = {}
    for case in cases:
        row = table.setdefault(case["scenario"], {"cases": 0, "pass": 0, "fail": 0, "error": 0,
                                                  "skip": 0, "_out": [], "_state": [], "_ms": []})
        row["cases"] += 1
        row[case["verdict"]] += 1
        errors = case.get("errors") or {}
        row["_out"].append(errors.get("output"))
        row["_state"] += [errors.get(k) for k in ("final_state", "checkpoint", "prefix_unaligned")]
        row["_ms"].append(case.get("median_ms"))
    for row in table.values():
        row["worst_output_error"] = _worst(row.pop("_out"))
        row["worst_state_error"] = _worst(row.pop("_state"))
        times = [t for t in row.pop("_ms") if isinstance(t, (int, float))]
        row["median_ms"] = median(times) if times else None
    return table


def matrix_backend(matrix: Matrix, name: str) -> tuple[str, Any]:
    """The kernel backend a backend name runs on and the config it pins (a name such as
    cute-s2 runs its backend with the config it names, as the bench's does); QualifyError
    where the matrix does not have that backend."""
    kernel_backend, pinned = backend_and_config(name)
    if kernel_backend not in matrix.backends:
        raise QualifyError(f"backend {name!r} is not in the matrix's backends "
                           f"({', '.join(matrix.backends)})")
    return kernel_backend, pinned


class Qualification:
    """One run of a matrix on a tier: the cases chosen, the device, the receipt path.

    Construction checks everything a user can get wrong (tier, backend, shard, filter) and
    raises QualifyError or MatrixError; `run()` then runs the cases and writes the receipt
    (kind "qualify") as they finish, partial if interrupted.
    """

    def __init__(
        self, matrix: Matrix, *, tier: str | None = None, backend: str | None = None,
        shard: tuple[int, int] | None = None, contains: str | None = None,
        out_dir: str | os.PathLike | None = None, command_line: Sequence[str] | None = None,
        created_at: str | None = None, case_indices: Sequence[int] | None = None,
    ) -> None:
        self.matrix = matrix
        self.tier = tier or default_tier()
        self.backend = backend or matrix.backends[0]
        kernel_backend, pinned = matrix_backend(matrix, self.backend)
        if case_indices is None:
            self.cases = select_cases(matrix.expand(self.tier), shard=shard, contains=contains)
        else:
            self.cases = _chosen_cases(matrix, self.tier, contains, shard, case_indices)
        if not self.cases:
            raise MatrixError(f"no {self.tier}-tier case of {matrix.origin} matches "
                              f"{'the filter ' + repr(contains) if contains else 'this shard'}")
        self.device = prepare_tier(self.tier)
        from kdabench.kernels import KdaPolicyError, resolve_mode
        from kdabench.kernels.contract import BACKENDS

        if kernel_backend not in BACKENDS:
            raise QualifyError(f"backend {self.backend!r} is not available here "
                               f"(have: {', '.join(BACKENDS)})")
        if kernel_backend == "cute" and self.tier != "gpu":
            raise QualifyError("the cute backend runs on CUDA GPUs only: qualify it with "
                               "--tier gpu (the CPU tier runs the Triton kernels interpreted)")
        try:
            policy_mode = resolve_mode().value  # $KDABENCH_POLICY_MODE, else AUTO
        except KdaPolicyError as error:
            raise QualifyError(str(error)) from error
        self.shard = shard
        config = {
            "tier": self.tier, "backend": self.backend, "matrix_name": matrix.name,
            "matrix_origin": "default" if matrix.origin == "default" else "file",
            "matrix_sha256": matrix.sha256, "matrix": matrix.document,
            "filter": contains or None,
            "timing": dict(matrix.timing) if self.tier == "gpu" else None,
            "policy_mode": policy_mode,
        }
        if case_indices is not None:  # a worker's part of a run: its cases, named in full
            config["shard"] = {"index": shard[0], "count": shard[1],
                               "cases": sorted(set(case_indices))}
        elif shard is not None:
            config["shard"] = f"{shard[0]}/{shard[1]}"
        from kdabench.environment import device_identity

        self.builder = new_receipt("qualify", config=config, command_line=command_line,
                                   device=device_identity(str(self.device)), created_at=created_at)
        self.path = free_receipt_path(receipt_dir(out_dir), self.builder.filename(), shard)
        self.context = Context(self.device, self.tier, kernel_backend,
                               matrix.timing if self.tier == "gpu" else None, matrix.seed,
                               config=pinned)
        CLOCK.install()
        self.backend_load_s = CLOCK.load_backend(kernel_backend, self.device)

    def run(self, *, on_start: Callable[[Case], None] | None = None,
            on_case: Callable[[dict[str, Any]], None] | None = None) -> QualifyResult:
        records = []
        started = time.perf_counter()
        with self.builder.writer(self.path, every=5 if self.tier == "gpu" else 1) as writer:
            for case in self.cases:
                if on_start:
                    on_start(case)
                record = run_case(self.context, case)
                records.append(writer.add_case(record))
                if on_case:
                    on_case(record)
            self.builder.config["time"] = time_totals(
                records, wall_s=round(time.perf_counter() - started, 3), workers=1,
                backend_load_s=self.backend_load_s)
        return QualifyResult(self.path, self.builder.document("complete"), records)


def _chosen_cases(matrix: Matrix, tier: str, contains: str | None,
                  shard: tuple[int, int] | None, case_indices: Sequence[int]) -> list[Case]:
    """The cases of a worker's part: those of `case_indices` (indices in the tier's
    expansion) that pass the filter; raises QualifyError for an unknown index or no part."""
    if shard is None:
        raise QualifyError("a list of cases needs its part of the run (shard I/N)")
    chosen = set(case_indices)
    cases = [case for case in select_cases(matrix.expand(tier), contains=contains)
             if case.index in chosen]
    unknown = sorted(chosen - {case.index for case in cases})
    if unknown:
        raise QualifyError(f"no {tier}-tier case of {matrix.origin} with index {unknown[0]}"
                           f"{' matches the filter ' + repr(contains) if contains else ''}")
    return cases


def fmt_error(value: Any) -> str:
    """An error for a table: 3 significant digits, '-' when absent."""
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:.2e}" if isinstance(value, (int, float)) else str(value)
