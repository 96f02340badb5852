"""The bench run: each case (a shape under a gate regime) timed per kernel and mode, the
sanity and replay checks, the receipt, plots.

    from kdabench.bench import Bench, load_shapes

    result = Bench(load_shapes(None)).run()     # the receipt goes to .kdabench/ ($KDABENCH_OUT)
    result.receipt_path, result.summary, result.plots

Modules: :mod:`~kdabench.bench.options` checks the options and lists the cases,
:mod:`~kdabench.bench.gates` draws each regime's inputs, :mod:`~kdabench.bench.measure` times
one case, :mod:`~kdabench.bench.sanity` and :mod:`~kdabench.bench.replay` check outputs and
graph replays, :mod:`~kdabench.bench.receipt` assembles the config and the result; this
module runs them in order.

Per case, on the same input sets in one process: ``fla`` (when present and asked for),
``kdabench`` (capacity 4, four active checkpoints per sequence), ``kdabench-c1``
(capacity 1, one active checkpoint per sequence) and, with a baseline policy mode,
``kdabench-baseline`` (``kdabench`` with its config resolved under that mode), all on the
first kernel backend asked for (``backends``, default triton), then ``kdabench-<backend>``
for each further backend (as ``kdabench``, e.g. ``kdabench-cute``), each in every mode asked
for: ``eager`` (a call per sample) and ``graph`` (a CUDA-graph replay per sample). Eager is
compared with eager and graph with graph; graph replay measures the GPU work, eager adds
each API's host work between launches. Every shape runs under each gate regime asked for
(``gates``, default long-memory and fast-decay; :mod:`kdabench.bench.gates`): one case each.

Definitions (per case and mode; all medians of the raw samples, which are kept):
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
capacity 4 are recorded alongside. Replay check: before a kernel's graph time counts, each
input set's graph is replayed once and compared with an eager call on that set; a graph that
does not reproduce it (above the same tolerance) fails the case.

Receipt (kind "bench"): one case per shape and gate regime, id "<shape>/<regime>"
("8192x8x1/fast-decay"), with the fields :mod:`kdabench.report` reads (``shape`` label,
``T``, ``H``, ``seqs``, ``floor_ms``, ``kernels`` = the primary mode's {kernel: {median_ms,
samples_ms}}; primary is graph when measured, else eager) plus ``index`` (the case's
position in the whole run, shape-major: shape position x regimes + regime position),
``gates`` = {name, kind, formula, seed[, file, sha256], measured = {mean, min, max} of the g
drawn}, ``modes`` = {mode: {kernel: {median_ms, samples_ms, tokens_per_s, to_floor}}},
``ratio_fla_over_kdabench``, ``export_overhead`` = {mode: value}, ``floor``, ``sanity``,
``graph_notes``, ``graph_checks`` = {kernel: {sets, errors, max_error, tolerance, problem}}
(with the graph mode), ``input_sets``, with ``breakdown_calls`` > 0 ``breakdown`` = {kernel:
{calls, gpu_us, kernels_us}} (kdabench.bench.breakdown: where each kernel's GPU time goes),
``kernel_configs`` = {kernel: {kernel_config, config_source, policy_mode[, split_ranges]}}
(what each kdabench plan resolved; a cute plan's source says whether its kernels came from an
ahead-of-time build or a JIT compile; a split plan's ``split_ranges`` = {eager, graph}: the
ranges of chunks it runs in), with a baseline, ``policy_gain`` = {mode: value} and
``same_config``, and with further backends, ``backend_ratios`` = {kernel: {ratio_fla_over,
ratio_kdabench_over: {mode: value}}}. The config holds the options (``policy_mode`` and
``baseline_policy`` among them: AUTO, HEURISTIC_ONLY or PREPLANNED_ONLY, see
kdabench.kernels.policy; ``baseline_policy`` null without a baseline; ``backends``, first one
first, and ``backend_kernels`` = {backend: kernel}), the shapes file and ``shape_set``
(default, quick, or file), ``gates`` (each regime's parameters; a file regime's per-channel
mean and std), the ceilings, the formulas, and at the end ``bench_summary`` (medians over
the cases, and per regime, kdabench.bench.summary). A sharded run (``shard`` = (I, N)) times
only the shapes whose position % N == I - 1 (under every regime) and records ``shard`` =
"I/N" in its config; :func:`kdabench.bench.merge.merge_bench_receipts` joins the shard
receipts into one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from kdabench.bench import options
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
from kdabench.bench.gates import DEFAULT_GATES, check_head_dim, parse_gates
from kdabench.bench.measure import measure_case
from kdabench.bench.options import DEFAULT_REPS, DEFAULT_WARMUP, BenchCase, BenchError
from kdabench.bench.receipt import BenchResult, bench_config
from kdabench.bench.shapes import ShapeSet
from kdabench.bench.summary import summarize_by_gates
from kdabench.receipts import free_receipt_path, new_receipt, receipt_dir, sanitize


class Bench:
    """One bench run: checks the options on construction (raises :class:`BenchError`),
    then :meth:`run` measures the ceilings, every case, and writes receipt and plots."""

    def __init__(self, shapes: ShapeSet, *, backend: Backend | None = None,
                 against: str | Sequence[str] = FLA, modes: Sequence[str] = MODES,
                 reps: int = DEFAULT_REPS,
                 warmup: int = DEFAULT_WARMUP, out_dir: str | os.PathLike | None = None,
                 plot: bool = True, command_line: Sequence[str] | None = None,
                 created_at: str | None = None, policy_mode: str | None = None,
                 baseline_policy: str | None = None,
                 backends: Sequence[str] = DEFAULT_BACKENDS, breakdown: int = 0,
                 shard: tuple[int, int] | None = None,
                 gates: Sequence[str] = DEFAULT_GATES) -> None:
        self.peers = options.peers(against)
        self.modes = options.check_counts(modes, reps, warmup, breakdown)
        self.gates = parse_gates(gates)
        check_head_dim(self.gates, shapes.head_dim)
        self.shard = shard
        self.cases: list[BenchCase] = options.select_cases(shapes, self.gates, shard)
        self.policy_mode = options.policy_mode(policy_mode)
        self.baseline_policy = options.baseline_policy(baseline_policy, self.policy_mode)
        self.backends = options.kernel_backends(backends)
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
        self.shapes, self.backend = shapes, backend
        self.reps, self.warmup, self.plot = reps, warmup, plot
        self.breakdown = breakdown
        self.peers_skipped = {peer: reason for peer in self.peers
                              if (reason := backend.peer_unavailable(peer))}
        self.kernels = [peer for peer in self.peers if peer not in self.peers_skipped]
        self.kernels += [KDABENCH, KDABENCH_C1]
        if self.baseline_policy is not None:
            self.kernels.append(KDABENCH_BASELINE)
        self.backend_kernels = {name: backend_kernel(name) for name in self.backends[1:]}
        self.kernels += self.backend_kernels.values()
        self.out_dir = receipt_dir(out_dir)
        self.command_line, self.created_at = command_line, created_at

    @property
    def against(self) -> str:
        """The peers as --against names them: "fla,cudnn", or "none"."""
        return ",".join(self.peers) or options.NO_PEER

    @property
    def fla_skipped(self) -> str | None:
        """Why fla, asked for, was not timed (None: timed, or not asked for)."""
        return self.peers_skipped.get(FLA)

    @property
    def primary_mode(self) -> str:
        return "graph" if "graph" in self.modes else "eager"

    @property
    def shape_count(self) -> int:
        """How many shapes the run times (each under every gate regime)."""
        return len({case.position for case in self.cases})

    def run(self, *, on_start: Callable[[BenchCase], None] | None = None,
            on_case: Callable[[dict[str, Any]], None] | None = None) -> BenchResult:
        started = time.perf_counter()
        ceilings = self.backend.ceilings()
        builder = new_receipt("bench", config=bench_config(self, ceilings),
                              command_line=self.command_line, device=self.backend.identity(),
                              created_at=self.created_at)
        path = free_receipt_path(self.out_dir, builder.filename(), self.shard)
        records = []
        with builder.writer(path) as writer:
            for case in self.cases:
                if on_start:
                    on_start(case)
                record = measure_case(self, case, ceilings)
                records.append(writer.add_case(record))
                if on_case:
                    on_case(record)
            summary = summarize_by_gates(records, self.modes,
                                         [regime.name for regime in self.gates],
                                         baseline=self.baseline_policy is not None,
                                         backend_kernels=list(self.backend_kernels.values()))
            builder.config["bench_summary"] = sanitize(summary)  # in the "complete" write
            builder.config["time"] = {
                "run_wall_s": round(time.perf_counter() - started, 3),
                "definition": "from the ceilings' measurement to the last case, compiles and "
                "autotuning included (imports and plots not)",
                "triton_autotune_cache": os.environ.get("TRITON_CACHE_AUTOTUNING") == "1"}
        result = BenchResult(path, builder.document("complete"), records, summary,
                             peers_skipped=self.peers_skipped)
        if self.plot:
            from kdabench.bench.plots import plot_receipt

            try:
                result.plots = plot_receipt(result.receipt, path)
            except Exception as error:  # noqa: BLE001 - a plot never loses the receipt
                result.plot_error = f"{type(error).__name__}: {error}"
        return result

