"""One case of a bench run measured: a shape under one gate regime, every kernel in every
mode, the sanity check, the replay checks, the per-case metrics; a crash is an "error" case."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kdabench.bench.breakdown import breakdown_record
from kdabench.bench.options import BenchCase
from kdabench.bench.sanity import sanity, sanity_problems
from kdabench.bench.summary import backend_metrics, policy_metrics, shape_metrics
from kdabench.bench.work import floor
from kdabench.stats import median

if TYPE_CHECKING:
    from kdabench.bench.run import Bench


def measure_case(bench: Bench, case: BenchCase, ceilings: Any) -> dict[str, Any]:
    """The case record of ``case`` (:mod:`kdabench.bench.run` lists its fields); never raises
    but for Ctrl-C."""
    started = time.perf_counter()
    shape, shapes = case.shape, bench.shapes
    work = floor(shape.tokens, shape.heads, shapes.head_dim, shape.seqs, shapes.flop_chunk,
                 ceilings)
    record: dict[str, Any] = {
        "id": case.id, "index": case.index, "shape": shape.label, "T": shape.tokens,
        "H": shape.heads, "seqs": shape.seqs, "seq_len": shape.seq_len, "K": shapes.head_dim,
        "V": shapes.head_dim, "lower_bound": shapes.lower_bound,
        "gates": case.gates.record(shapes.seed), "floor": work, "floor_ms": work["ms"],
        "primary_mode": bench.primary_mode,
    }
    problems: list[str] = []
    notes: list[str] = []
    prepared = None
    try:
        prepared = bench.backend.prepare(shape, shapes, bench.kernels, bench.modes,
                                         gates=case.gates, policy_mode=bench.policy_mode,
                                         baseline_policy=bench.baseline_policy,
                                         backends=bench.backends)
        record["gates"]["measured"] = prepared.gate_stats
        record.update(input_sets=prepared.input_sets,
                      input_set_bytes=prepared.input_set_bytes, **prepared.details)
        record["sanity"] = found = sanity(prepared.outputs(), list(bench.backend_kernels.values()))
        problems += sanity_problems(found)
        if "graph" in bench.modes:
            record["graph_checks"] = {kernel: calls.replay_check
                                      for kernel, calls in prepared.calls.items()
                                      if calls.replay_check is not None}
        modes: dict[str, dict[str, Any]] = {}
        graph_notes: dict[str, str | None] = {}
        for mode in bench.modes:
            modes[mode] = {}
            for kernel, calls in prepared.calls.items():
                runs = calls.eager if mode == "eager" else calls.graph
                if mode == "graph":
                    graph_notes[kernel] = calls.graph_note
                if runs is None:
                    if calls.replay_check and calls.replay_check.get("problem"):
                        problems.append(f"{kernel}: {calls.graph_note}")
                    else:
                        notes.append(f"{kernel} has no graph column: {calls.graph_note}")
                    continue
                samples = [float(s) for s in bench.backend.timer(runs, bench.warmup, bench.reps)]
                modes[mode][kernel] = {"median_ms": median(samples),
                                       "samples_ms": samples}
        if bench.breakdown:
            record["breakdown"] = {
                kernel: breakdown_record(bench.backend.profiler(calls.eager, bench.breakdown),
                                         bench.breakdown)
                for kernel, calls in prepared.calls.items()}
        problems += prepared.check()
        record["modes"] = modes
        record["graph_notes"] = graph_notes
        record["kernels"] = modes.get(bench.primary_mode, {})
        record.update(shape_metrics(modes, shape.tokens, work["ms"]))
        if bench.baseline_policy is not None:
            record.update(policy_metrics(modes, record.get("kernel_configs")))
        if bench.backend_kernels:
            record.update(backend_metrics(modes, list(bench.backend_kernels.values())))
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
