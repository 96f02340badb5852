"""A fuzz campaign: per backend, sets from the generator until the budget is spent, each run
and checked; failures shrunk and written as cases; one receipt (kind "fuzz") for the run."""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kdabench.fuzz.cases import Rigs, Shape, case_document, write_case
from kdabench.fuzz.check import FAULTY_CHECKS, VALID_CHECKS, Target, default_target, run_set
from kdabench.fuzz.classes import FAULT_CLASSES
from kdabench.fuzz.generate import Limits, generate
from kdabench.fuzz.rig import INT32_LINE, high_slot_base
from kdabench.fuzz.sets import FuzzSet
from kdabench.fuzz.shrink import shrink
from kdabench.kernels.contract import MetadataFault
from kdabench.matrix import DEFAULT_TOLERANCES

CPU_LIMITS = Limits(heads=1, head_dim=64, max_seqs=3, max_len=40, valid_share=0.1,
                    multi_share=0.4)
GPU_LIMITS = Limits(heads=2, head_dim=64, max_seqs=8, max_len=130, valid_share=0.3,
                    multi_share=0.3, high_share=0.02)
MAX_FINDINGS = 5  # per backend: failing sets shrunk and written; later ones only counted
WARM_TOKENS = (1, 16, 17)  # Triton specialises integers on == 1 and % 16 == 0


@dataclass
class BackendRun:
    """What the campaign found on one backend."""

    backend: str
    skipped: str | None = None
    sets: int = 0
    valid: int = 0
    faulty: int = 0
    high: int = 0
    failed: int = 0
    per_class: Counter = field(default_factory=Counter)
    per_bit: Counter = field(default_factory=Counter)
    per_capacity: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    warmup_seconds: float = 0.0
    started_at: float = 0.0  # epoch seconds at which the timed sets began
    seeds: list[int] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def record(self) -> dict[str, Any]:
        """This backend's case in the receipt."""
        if self.skipped:
            return {"id": self.backend, "verdict": "skip", "message": self.skipped}
        rate = self.sets / self.seconds if self.seconds else None
        return {
            "id": self.backend, "verdict": "pass" if self.ok else "fail",
            "message": f"{self.sets} sets, {self.failed} failed",
            "sets": self.sets, "valid_sets": self.valid, "faulty_sets": self.faulty,
            "high_slot_sets": self.high, "failed_sets": self.failed,
            "per_fault_class": dict(sorted(self.per_class.items())),
            "per_error_bit": dict(sorted(self.per_bit.items())),
            "per_capacity": {str(k): v for k, v in sorted(self.per_capacity.items())},
            "seconds": round(self.seconds, 3), "warmup_seconds": round(self.warmup_seconds, 3),
            "sets_per_second": None if rate is None else round(rate, 2),
            "workers": len(self.seeds), "seeds": self.seeds,
            "findings": self.findings,
        }

    def to_json(self) -> dict[str, Any]:
        """Everything, for a worker to hand to its parent (see :meth:`from_json`)."""
        return {name: dict(value) if isinstance(value, Counter) else value
                for name, value in vars(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BackendRun:
        counters = {"per_class", "per_bit", "per_capacity"}
        run = cls(**{k: Counter(v) if k in counters else v for k, v in data.items()})
        run.per_capacity = Counter({int(k): v for k, v in run.per_capacity.items()})
        return run


def merge_runs(runs: list[BackendRun]) -> BackendRun:
    """One backend's workers as one run: counts summed, findings joined; `seconds` is the
    wall time from the first worker's first timed set to the last worker's last, and
    `warmup_seconds` the longest warm-up."""
    out = BackendRun(runs[0].backend)
    for run in runs:
        for name in ("sets", "valid", "faulty", "high", "failed"):
            setattr(out, name, getattr(out, name) + getattr(run, name))
        for name in ("per_class", "per_bit", "per_capacity"):
            getattr(out, name).update(getattr(run, name))
        out.seeds += run.seeds
        out.findings += run.findings
    timed = [run for run in runs if run.seeds]  # a worker that died timed nothing
    if timed:
        out.started_at = min(run.started_at for run in timed)
        out.seconds = max(run.started_at + run.seconds for run in timed) - out.started_at
    out.warmup_seconds = max(run.warmup_seconds for run in runs)
    return out


def warm_up_runs(bases: tuple[int, ...], part: tuple[int, int] = (0, 1)
                 ) -> list[tuple[int, int, int, int, int, str]]:
    """Part (i, n) of the warm-up's runs, every n-th from i: (capacity, slot base, tokens,
    slots, rows, index dtype), one per integer specialisation of the bound sizes."""
    index, parts = part
    runs = itertools.product((1, 2, 4), bases, WARM_TOKENS, WARM_TOKENS, (1, 2),
                             ("int32", "int64"))
    return list(itertools.islice(runs, index, None, parts))


def warm_up_plan(limits: Limits, high_base: int, part: tuple[int, int] = (0, 1)
                 ) -> list[tuple[int, int, int, int, int, str]]:
    """What one process warms up: its part of the runs on low slots and, when it draws sets
    past the 2^31-element line (``limits.high_share``), every run on high slots (only such a
    process builds the high rigs, whose pools hold over 2^31 elements each)."""
    runs = warm_up_runs((0,), part)
    if limits.high_share:
        runs += warm_up_runs((high_base,))
    return runs


@dataclass
class Campaign:
    """One run's options. target: what runs a binding (kdabench.kernels.run by default)."""

    backends: list[str]
    seed: int
    count: int | None
    seconds: float | None
    device: torch.device
    limits: Limits
    findings_dir: Path = Path("fuzz-findings")
    slot_line: int = INT32_LINE
    warm: bool = True
    target: Target | None = None
    finding_tag: str = ""  # prefix of the finding files (default: the backend)
    workers: int = 1  # worker processes per backend (kdabench.fuzz.parallel)
    warm_part: tuple[int, int] = (0, 1)  # (i, n): this process warms up every n-th run from i
    on_warm: Callable[[], None] | None = None  # called after the warm-up, before the clock

    def config(self) -> dict[str, Any]:
        return {"seed": self.seed, "count": self.count, "seconds": self.seconds,
                "backends": self.backends, "limits": self.limits.to_dict(),
                "slot_line": self.slot_line, "warm": self.warm, "workers": self.workers,
                "high_slot_sets": "drawn by one process only (worker 0 of several): each "
                "capacity's high rig holds a pool past the 2^31-element line and its copy",
                "plans": "the device profile's config on the GPU; on the CPU the heuristic's "
                "with one V block per program (kdabench.fuzz.rig.interpreter_config)",
                "tolerances": dict(DEFAULT_TOLERANCES),
                "fault_classes": {n: {"bit": c.bit.name, "what": c.what}
                                  for n, c in FAULT_CLASSES.items()},
                "checks": {"valid": list(VALID_CHECKS), "faulty": list(FAULTY_CHECKS),
                           "every_set": "every set is run through plan/bind/run and checked "
                           "in full as its kind says (no sampling)"}}

    def run_backend(self, backend: str, on_progress: Callable[[str, int], None] | None = None
                    ) -> BackendRun:
        """Fuzz one backend until `count` sets or `seconds` are spent, whichever comes first."""
        from kdabench import kernels

        out = BackendRun(backend, seeds=[self.seed])
        caps = kernels.Caps(device=self.device, num_heads=self.limits.heads,
                            head_dim=self.limits.head_dim, max_tokens=self.limits.max_tokens,
                            max_seqs=self.limits.max_seqs, max_state_slots=1, backend=backend)
        reasons = kernels.ineligibility(caps)
        if reasons:
            out.skipped = "; ".join(reasons)
            return out
        target = self.target or default_target()
        rigs = Rigs(self.device)
        high = random.Random(f"{self.seed}/high")
        base = high_slot_base(self.limits, self.slot_line)
        started = time.perf_counter()
        if self.warm:
            self._warm_up(backend, rigs, target, base)
        if self.on_warm is not None:
            self.on_warm()
        out.warmup_seconds = time.perf_counter() - started
        out.started_at = time.time()
        started = time.perf_counter()
        for fset in generate(self.limits, self.seed):
            elapsed = time.perf_counter() - started
            if (self.count is not None and out.sets >= self.count) or \
                    (self.seconds is not None and elapsed >= self.seconds):
                break
            slot_base = base if high.random() < self.limits.high_share else 0
            if slot_base:
                fset = fset.rebased(slot_base)
            shape = Shape(self.limits, fset.capacity, self.seed, slot_base)
            rig = rigs.get(backend, shape)
            result = run_set(rig, fset, target)
            out.sets += 1
            out.high += bool(slot_base)
            out.per_capacity[fset.capacity] += 1
            out.per_class.update(fset.faults)
            out.per_bit.update(f.name for f in MetadataFault if result.expected & f)
            if result.expected:
                out.faulty += 1
            else:
                out.valid += 1
            if not result.ok:
                out.failed += 1
                if len(out.findings) < MAX_FINDINGS:
                    out.findings.append(self._finding(backend, rig, shape, fset, result,
                                                      target, len(out.findings)))
            if on_progress is not None:
                on_progress(backend, out.sets)
        out.seconds = time.perf_counter() - started
        return out

    def _warm_up(self, backend: str, rigs: Rigs, target: Target, base: int) -> None:
        """Compile every integer specialisation of the bound sizes before the clock starts
        (this process's part of them: workers split the compiles, and each loads the others'
        from Triton's on-disk cache)."""
        for capacity, slot_base, tokens, slots, rows, dtype in warm_up_plan(self.limits, base,
                                                                            self.warm_part):
            rig = rigs.get(backend, Shape(self.limits, capacity, self.seed, slot_base))
            fset = FuzzSet(capacity, [0, 1] + [1] * (rows - 1), 1, [-1] * rows,
                           [0] + [-1] * (rows - 1), [[1] * capacity] * rows,
                           [[-1] * capacity] * rows, slots, tokens, dtype)
            run_set(rig, fset.rebased(slot_base), target)

    def _finding(self, backend: str, rig, shape: Shape, fset: FuzzSet, result, target,
                 number: int) -> dict[str, Any]:
        check = result.first
        small, tries = shrink(fset, lambda c: run_set(rig, c, target).first == check)
        final = run_set(rig, small, target)
        name = f"{self.finding_tag or backend}-{number + 1:03d}.json"
        path = write_case(self.findings_dir / name, case_document(backend, shape, small, final))
        return {"file": f"{self.findings_dir.name}/{path.name}", "check": check,
                "message": result.failures[0].message, "faults": fset.faults,
                "expected_error_code": result.expected, "error_code": result.code,
                "rows_before": fset.rows, "rows_after": small.rows, "shrink_tries": tries}
