"""The bench run: each shape's kernels timed per mode, the sanity check, the receipt, plots.

    from kdabench.bench import Bench, load_shapes

    result = Bench(load_shapes(None)).run()     # the receipt goes to .kdabench/ ($KDABENCH_OUT)
    result.receipt_path, result.summary, result.plots

Per shape, on the same input sets in one process: ``fla`` (when present and asked for),
``kdabench`` (capacity 4, four active checkpoints per sequence), ``kdabench-c1``
(capacity 1, one active checkpoint per sequence) and, with a baseline policy mode,
``kdabench-baseline`` (``kdabench`` with its config resolved under that mode), all on the
first kernel backend asked for (``backends``, default triton), then ``kdabench-<backend>``
for each further backend (as ``kdabench``, e.g. ``kdabench-cute``), each in every mode asked
for: ``eager`` (a call per sample) and ``graph`` (a CUDA-graph replay per sample). Eager is
compared with eager and graph with graph; graph replay measures the GPU work, eager adds
each API's host work between launches.

Definitions (per shape and mode; all medians of the raw samples, which are kept):
    ratio            fla median / kdabench median (above 1: kdabench is faster)
    export overhead  kdabench median / kdabench-c1 median - 1: what exporting four
                     checkpoints at capacity 4 costs over one at capacity 1
    tokens/s         T / median
    to floor         median / floor (kdabench.bench.work: bytes and FLOPs at the rates
                     measured in the same run)
    policy gain      kdabench-baseline median / kdabench median (above 1: the policy mode's
                     configs are faster than the baseline policy mode's); where both plans
                     resolved the same config (``same_config``) it measures noise only
    backend ratios   per further backend's kernel: fla median / its median and kdabench
                     median / its median (above 1: that backend is the faster)
Sanity check: kdabench's output against fla's on input set 0, relative Frobenius error;
above 5e-2 the case fails (the two compute the same function: a miss means a misuse of
one API); likewise kdabench-baseline's and each further backend's output against kdabench's,
so a wrong config or backend cannot look fast. The final states and capacity 1 against
capacity 4 are recorded alongside.

Receipt (kind "bench"): one case per shape with the fields :mod:`kdabench.report` reads
(``shape`` label, ``T``, ``H``, ``seqs``, ``floor_ms``, ``kernels`` = the primary mode's
{kernel: {median_ms, samples_ms}}; primary is graph when measured, else eager) plus
``index`` (the shape's position in the shapes file),
``modes`` = {mode: {kernel: {median_ms, samples_ms, tokens_per_s, to_floor}}},
``ratio_fla_over_kdabench``, ``export_overhead`` = {mode: value}, ``floor``, ``sanity``,
``graph_notes``, ``input_sets``, with ``breakdown_calls`` > 0 ``breakdown`` = {kernel:
{calls, gpu_us, kernels_us}} (kdabench.bench.breakdown: where each kernel's GPU time goes),
``kernel_configs`` = {kernel: {kernel_config,
config_source, policy_mode[, split_ranges]}} (what each kdabench plan resolved; a cute plan's
source says whether its kernels came from an ahead-of-time build or a JIT compile; a split
plan's ``split_ranges`` = {eager, graph}: the ranges of chunks it runs in), with a baseline,
``policy_gain`` = {mode: value} and ``same_config``, and with further backends,
``backend_ratios`` = {kernel: {ratio_fla_over, ratio_kdabench_over: {mode: value}}}. The
config holds the options (``policy_mode`` and ``baseline_policy`` among them: AUTO,
HEURISTIC_ONLY or PREPLANNED_ONLY, see kdabench.kernels.policy; ``baseline_policy`` null
without a baseline; ``backends``, first one first, and ``backend_kernels`` = {backend:
kernel}), the shapes file,
the ceilings, the formulas, and at the end ``bench_summary`` (medians over the shapes,
kdabench.bench.summary). A sharded run (``shard`` = (I, N)) times only the shapes whose
position % N == I - 1 and records ``shard`` = "I/N" in its config;
:func:`kdabench.bench.merge.merge_bench_receipts` joins the shard receipts into one.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdabench.bench.backend import (
    DEFAULT_BACKENDS,
    FLA,
    KDABENCH,
    KDABENCH_BASELINE,
    KDABENCH_C1,
    MODES,
    Backend,
    backend_kernel,
)
from kdabench.bench.breakdown import breakdown_record
from kdabench.bench.shapes import BenchShape, ShapeSet
from kdabench.bench.summary import (
    backend_metrics,
    median_or_none,
    policy_metrics,
    shape_metrics,
    summarize,
)
from kdabench.bench.work import BYTES_FORMULA, FLOPS_FORMULA, floor
from kdabench.matrix import MatrixError, check_shard
from kdabench.receipts import free_receipt_path, new_receipt, receipt_dir, sanitize

AGAINST = ("fla", "none")
SANITY_TOLERANCE = 5e-2
SANITY_CHECKED = {"output": "kdabench output differs from fla's",  # sanity key: what a miss is
                  "baseline_output": f"{KDABENCH_BASELINE} output differs from kdabench's"}
DEFAULT_REPS = 100
DEFAULT_WARMUP = 10


class BenchError(ValueError):
    """A bench that cannot start (no GPU, bad options); one line."""


def relative_error(found: Any, reference: Any) -> float:
    """||found - reference|| / ||reference|| (Frobenius, float64); inf when not finite."""
    found, reference = found.double(), reference.double()
    if tuple(found.shape) != tuple(reference.shape):
        raise ValueError(f"shapes differ: {tuple(found.shape)} against {tuple(reference.shape)}")
    norm = float(reference.norm())
    error = float((found - reference).norm())
    value = error / norm if norm else error
    return value if math.isfinite(value) else math.inf


def sanity_problems(sanity: dict[str, Any]) -> list[str]:
    """The sanity checks a case fails: each checked error above :data:`SANITY_TOLERANCE`."""
    checked = [(what, sanity.get(key)) for key, what in SANITY_CHECKED.items()]
    checked += [(f"{kernel} output differs from kdabench's", error)
                for kernel, error in (sanity.get("backend_output") or {}).items()]
    return [f"{what} by {error:.3g} (relative), over {SANITY_TOLERANCE:g}"
            for what, error in checked if error is not None and not error <= SANITY_TOLERANCE]


@dataclass
class BenchResult:
    """What a run found and where it left the receipt and plots."""

    receipt_path: Path
    receipt: dict[str, Any]
    cases: list[dict[str, Any]]
    summary: dict[str, Any]
    plots: list[Path] = field(default_factory=list)
    fla_skipped: str | None = None
    plot_error: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.cases) and all(c["verdict"] in ("pass", "skip") for c in self.cases)

    def to_dict(self) -> dict[str, Any]:
        return sanitize({
            "ok": self.ok, "receipt": str(self.receipt_path), "sha256": self.receipt["sha256"],
            "status": self.receipt["status"], "device": self.receipt["device"].get("name"),
            "modes": self.receipt["config"]["modes"], "fla_skipped": self.fla_skipped,
            "backends": self.receipt["config"]["backends"],
            "policy_mode": self.receipt["config"].get("policy_mode"),
            "baseline_policy": self.receipt["config"].get("baseline_policy"),
            "ceilings": {k: self.receipt["config"]["ceilings"].get(k)
                         for k in ("copy_bytes_per_s", "matmul_flops_per_s")},
            "summary": self.summary, "plots": [str(p) for p in self.plots],
            "plot_error": self.plot_error,
            "shapes": [{"shape": c["shape"], "verdict": c["verdict"],
                        "message": c.get("message"),
                        "median_ms": {mode: {k: v.get("median_ms") for k, v in kernels.items()}
                                      for mode, kernels in (c.get("modes") or {}).items()},
                        "ratio_fla_over_kdabench": c.get("ratio_fla_over_kdabench"),
                        "export_overhead": c.get("export_overhead"),
                        "policy_gain": c.get("policy_gain"),
                        "same_config": c.get("same_config"),
                        "backend_ratios": c.get("backend_ratios"),
                        "floor_ms": c.get("floor_ms"), "breakdown": c.get("breakdown"),
                        "config_sources": {k: v.get("config_source") for k, v in
                                           (c.get("kernel_configs") or {}).items()},
                        "sanity": c.get("sanity")} for c in self.cases],
        })


class Bench:
    """One bench run: checks the options on construction (raises :class:`BenchError`),
    then :meth:`run` measures the ceilings, every shape, and writes receipt and plots."""

    def __init__(self, shapes: ShapeSet, *, backend: Backend | None = None,
                 against: str = "fla", modes: Sequence[str] = MODES, reps: int = DEFAULT_REPS,
                 warmup: int = DEFAULT_WARMUP, out_dir: str | os.PathLike | None = None,
                 plot: bool = True, command_line: Sequence[str] | None = None,
                 created_at: str | None = None, policy_mode: str | None = None,
                 baseline_policy: str | None = None,
                 backends: Sequence[str] = DEFAULT_BACKENDS, breakdown: int = 0,
                 shard: tuple[int, int] | None = None) -> None:
        if against not in AGAINST:
            raise BenchError(f"--against must be one of {', '.join(AGAINST)}, got {against!r}")
        modes = list(dict.fromkeys(modes))
        bad = [m for m in modes if m not in MODES]
        if bad or not modes:
            raise BenchError(f"--modes takes a comma-separated subset of {','.join(MODES)}, got "
                             f"{','.join(modes) or 'nothing'}")
        if reps < 1 or warmup < 0:
            raise BenchError(f"--reps must be >= 1 (got {reps}) and warmup >= 0 (got {warmup})")
        if breakdown < 0:
            raise BenchError(f"--breakdown must be >= 0 calls (0: none), got {breakdown}")
        self.shard = shard
        self.selected = _select_shapes(shapes, shard)
        self.policy_mode = _policy_mode(policy_mode)
        self.baseline_policy = _baseline_policy(baseline_policy, self.policy_mode)
        self.backends = _backends(backends)
        if backend is None:
            from kdabench.bench.cuda import CudaBackend

            backend = CudaBackend()
        reason = backend.unavailable()
        if reason:
            raise BenchError(reason)
        if breakdown and getattr(backend, "profiler", None) is None:
            raise BenchError("--breakdown needs a backend with a kernel profiler; this one "
                             "has none")
        for name in self.backends:  # fail here, not at the first shape
            reason = backend.backend_unavailable(name, shapes)
            if reason:
                raise BenchError(f"--backends {name}: {reason}")
        self.shapes, self.backend, self.against = shapes, backend, against
        self.modes = [m for m in MODES if m in modes]
        self.reps, self.warmup, self.plot = reps, warmup, plot
        self.breakdown = breakdown
        self.fla_skipped = backend.fla_unavailable() if against == "fla" else None
        self.kernels = [KDABENCH, KDABENCH_C1]
        if self.baseline_policy is not None:
            self.kernels.append(KDABENCH_BASELINE)
        self.backend_kernels = {name: backend_kernel(name) for name in self.backends[1:]}
        self.kernels += self.backend_kernels.values()
        if against == "fla" and self.fla_skipped is None:
            self.kernels.insert(0, FLA)
        self.out_dir = receipt_dir(out_dir)
        self.command_line, self.created_at = command_line, created_at

    @property
    def primary_mode(self) -> str:
        return "graph" if "graph" in self.modes else "eager"

    def config(self, ceilings: Any) -> dict[str, Any]:
        config = {
            "shapes_name": self.shapes.name,
            "shapes_origin": "default" if self.shapes.origin == "default" else "file",
            "shapes_sha256": self.shapes.sha256, "shapes": self.shapes.document,
            "against": self.against, "fla_skipped": self.fla_skipped,
            "kernels": self.kernels, "modes": self.modes, "primary_mode": self.primary_mode,
            "reps": self.reps, "warmup": self.warmup, "breakdown_calls": self.breakdown,
            "policy_mode": self.policy_mode,
            "baseline_policy": self.baseline_policy, "backends": self.backends,
            "backend_kernels": {self.backends[0]: KDABENCH, **self.backend_kernels},
            "ceilings": ceilings.to_dict(), "bytes_formula": BYTES_FORMULA,
            "flops_formula": FLOPS_FORMULA, "sanity_tolerance": SANITY_TOLERANCE,
            "definitions": {
                "ratio_fla_over_kdabench": "fla median / kdabench median, same mode",
                "export_overhead": ("kdabench (capacity 4, four active checkpoints) median / "
                                    "kdabench-c1 (capacity 1, one active checkpoint) median "
                                    "- 1, same mode"),
                "to_floor": "median / floor_ms",
                "floor_ms": "max(bytes / copy rate, FLOPs / bf16 matmul rate)",
                "sanity": "relative Frobenius error of kdabench's output against fla's",
                "policy_gain": ("kdabench-baseline (capacity 4, config under baseline_policy) "
                                "median / kdabench median, same mode"),
                "backends": ("kdabench, kdabench-c1 and kdabench-baseline run on backends[0]; "
                             "kdabench-<backend> (capacity 4, four active checkpoints) on each "
                             "further backend"),
                "backend_ratios": ("per kdabench-<backend>: ratio_fla_over = fla median / its "
                                   "median, ratio_kdabench_over = kdabench median / its "
                                   "median, same mode"),
                "backend_output": ("relative Frobenius error of each kdabench-<backend>'s "
                                   "output against kdabench's"),
                "breakdown": ("per kernel, after its timed samples: breakdown_calls eager "
                              "calls under torch.profiler; gpu_us = the GPU time per call, "
                              "kernels_us = each GPU kernel's mean microseconds per call"),
            },
        }
        if self.shard is not None:
            config["shard"] = f"{self.shard[0]}/{self.shard[1]}"
        return config

    def run(self, *, on_start: Callable[[BenchShape], None] | None = None,
            on_case: Callable[[dict[str, Any]], None] | None = None) -> BenchResult:
        ceilings = self.backend.ceilings()
        builder = new_receipt("bench", config=self.config(ceilings),
                              command_line=self.command_line, device=self.backend.identity(),
                              created_at=self.created_at)
        path = free_receipt_path(self.out_dir, builder.filename(), self.shard)
        records = []
        with builder.writer(path) as writer:
            for index, shape in self.selected:
                if on_start:
                    on_start(shape)
                record = {"index": index, **self.run_shape(shape, ceilings)}
                records.append(writer.add_case(record))
                if on_case:
                    on_case(record)
            summary = summarize(records, self.modes, baseline=self.baseline_policy is not None,
                                backend_kernels=list(self.backend_kernels.values()))
            builder.config["bench_summary"] = sanitize(summary)  # in the "complete" write
        result = BenchResult(path, builder.document("complete"), records, summary,
                             fla_skipped=self.fla_skipped)
        if self.plot:
            from kdabench.bench.plots import plot_receipt

            try:
                result.plots = plot_receipt(result.receipt, path)
            except Exception as error:  # noqa: BLE001 - a plot never loses the receipt
                result.plot_error = f"{type(error).__name__}: {error}"
        return result

    def run_shape(self, shape: BenchShape, ceilings: Any) -> dict[str, Any]:
        """Measure one shape; never raises but for Ctrl-C (a crash is an "error" case)."""
        started = time.perf_counter()
        work = floor(shape.tokens, shape.heads, self.shapes.head_dim, shape.seqs,
                     self.shapes.flop_chunk, ceilings)
        record: dict[str, Any] = {
            "id": shape.label, "shape": shape.label, "T": shape.tokens, "H": shape.heads,
            "seqs": shape.seqs, "seq_len": shape.seq_len, "K": self.shapes.head_dim,
            "V": self.shapes.head_dim, "lower_bound": self.shapes.lower_bound,
            "floor": work, "floor_ms": work["ms"], "primary_mode": self.primary_mode,
        }
        problems: list[str] = []
        notes: list[str] = []
        prepared = None
        try:
            prepared = self.backend.prepare(shape, self.shapes, self.kernels, self.modes,
                                            policy_mode=self.policy_mode,
                                            baseline_policy=self.baseline_policy,
                                            backends=self.backends)
            record.update(input_sets=prepared.input_sets,
                          input_set_bytes=prepared.input_set_bytes, **prepared.details)
            record["sanity"] = sanity = self.sanity(prepared.outputs())
            problems += sanity_problems(sanity)
            modes: dict[str, dict[str, Any]] = {}
            graph_notes: dict[str, str | None] = {}
            for mode in self.modes:
                modes[mode] = {}
                for kernel, calls in prepared.calls.items():
                    runs = calls.eager if mode == "eager" else calls.graph
                    if mode == "graph":
                        graph_notes[kernel] = calls.graph_note
                    if runs is None:
                        notes.append(f"{kernel} has no graph column: {calls.graph_note}")
                        continue
                    samples = [float(s) for s in self.backend.timer(runs, self.warmup,
                                                                    self.reps)]
                    modes[mode][kernel] = {"median_ms": median_or_none(samples),
                                           "samples_ms": samples}
            if self.breakdown:
                record["breakdown"] = {
                    kernel: breakdown_record(self.backend.profiler(calls.eager, self.breakdown),
                                             self.breakdown)
                    for kernel, calls in prepared.calls.items()}
            problems += prepared.check()
            record["modes"] = modes
            record["graph_notes"] = graph_notes
            record["kernels"] = modes.get(self.primary_mode, {})
            record.update(shape_metrics(modes, shape.tokens, work["ms"]))
            if self.baseline_policy is not None:
                record.update(policy_metrics(modes, record.get("kernel_configs")))
            if self.backend_kernels:
                record.update(backend_metrics(modes, list(self.backend_kernels.values())))
            verdict = "fail" if problems else "pass"
        except KeyboardInterrupt:
            raise
        except Exception as error:  # noqa: BLE001 - a crash is a verdict, not the end of the run
            problems.append(f"{type(error).__name__}: {error}")
            verdict = "error"
            record.setdefault("modes", {})
            record.setdefault("kernels", {})
        finally:
            if prepared is not None:
                prepared.release()
        record["verdict"] = verdict
        record["message"] = "; ".join(problems + notes) or None
        record["wall_s"] = round(time.perf_counter() - started, 3)
        return record

    def sanity(self, outputs: Any) -> dict[str, Any]:
        """Relative errors: kdabench against fla, capacity 1, the baseline and each further
        backend against kdabench (None where a kernel did not run)."""
        found: dict[str, Any] = {"tolerance": SANITY_TOLERANCE, "output": None,
                                 "final_state": None, "c1_vs_c4_output": None,
                                 "baseline_output": None, "backend_output": {},
                                 "backend_final_state": {}}
        ours = outputs.output.get(KDABENCH)
        if ours is not None and FLA in outputs.output:
            found["output"] = relative_error(ours, outputs.output[FLA])
            found["final_state"] = relative_error(outputs.final_state[KDABENCH],
                                                  outputs.final_state[FLA])
        if ours is not None and KDABENCH_C1 in outputs.output:
            found["c1_vs_c4_output"] = relative_error(outputs.output[KDABENCH_C1], ours)
        if ours is not None and KDABENCH_BASELINE in outputs.output:
            found["baseline_output"] = relative_error(outputs.output[KDABENCH_BASELINE], ours)
        for kernel in self.backend_kernels.values():
            ran = ours is not None and kernel in outputs.output
            found["backend_output"][kernel] = relative_error(
                outputs.output[kernel], ours) if ran else None
            found["backend_final_state"][kernel] = relative_error(
                outputs.final_state[kernel], outputs.final_state[KDABENCH]) if ran else None
        return found


def _policy_mode(mode: str | None) -> str:
    """The policy mode the plans resolve their configs under (argument, env, AUTO)."""
    from kdabench.kernels import KdaPolicyError, resolve_mode

    try:
        return resolve_mode(mode).value
    except KdaPolicyError as error:
        raise BenchError(f"--policy-mode: {error}") from error


def _baseline_policy(mode: str | None, policy_mode: str) -> str | None:
    """The baseline's policy mode (None: no baseline); it must differ from ``policy_mode``."""
    if mode is None:
        return None
    from kdabench.kernels import KdaPolicyError, resolve_mode

    try:
        baseline = resolve_mode(mode).value  # not None: the mode itself, parsed
    except KdaPolicyError as error:
        raise BenchError(f"--baseline-policy: {error}") from error
    if baseline == policy_mode:
        raise BenchError(f"--baseline-policy {baseline} is the run's policy mode too "
                         "(--policy-mode, else $KDABENCH_POLICY_MODE, else AUTO): pick another "
                         "mode to compare against")
    return baseline


def _backends(names: Sequence[str]) -> list[str]:
    """The kernel backends to time, first one first, each once; an unknown name refused."""
    from kdabench.kernels.config import BACKENDS

    names = list(dict.fromkeys(names))
    bad = [name for name in names if name not in BACKENDS]
    if bad or not names:
        raise BenchError(f"--backends takes a comma-separated list of {', '.join(BACKENDS)} "
                         f"(the first one's columns are kdabench's), got "
                         f"{', '.join(map(repr, bad)) if bad else 'nothing'}")
    return names


def _select_shapes(shapes: ShapeSet, shard: tuple[int, int] | None
                   ) -> list[tuple[int, BenchShape]]:
    """(position in the shapes file, shape) of every shape the run times: those of ``shard``."""
    selected = list(enumerate(shapes.shapes))
    if shard is None:
        return selected
    try:
        index, count = check_shard(*shard)
    except MatrixError as error:
        raise BenchError(str(error)) from None
    selected = [(position, shape) for position, shape in selected if position % count == index - 1]
    if not selected:
        raise BenchError(f"--shard {index}/{count} selects no shape: the shapes file has "
                         f"{len(shapes.shapes)}, so N must be at most that")
    return selected
