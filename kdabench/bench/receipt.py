"""What a bench run leaves: the receipt's config (options, shapes, gate regimes, ceilings,
formulas, definitions) and :class:`BenchResult` (the receipt, its cases and summary, plots)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kdabench.bench.backend import FLA, KDABENCH
from kdabench.bench.sanity import SANITY_TOLERANCE
from kdabench.bench.work import BYTES_FORMULA, FLOPS_FORMULA
from kdabench.receipts import sanitize

if TYPE_CHECKING:
    from kdabench.bench.run import Bench

DEFINITIONS = {
    "ratio_fla_over_kdabench": "fla median / kdabench median, same mode",
    "ratio_cudnn_over_kdabench": ("cudnn (cuDNN frontend's fused sm90 KDA kernel) median / "
                                  "kdabench median, same mode (present when cudnn ran)"),
    "export_overhead": ("kdabench (capacity 4, four active checkpoints) median / "
                        "kdabench-c1 (capacity 1, one active checkpoint) median - 1, same mode"),
    "to_floor": "median / floor_ms",
    "floor_ms": "max(bytes / copy rate, FLOPs / bf16 matmul rate)",
    "sanity": ("relative Frobenius error of kdabench's output against fla's (output, "
               "final_state) and against cudnn's (cudnn_output, cudnn_final_state)"),
    "peers_skipped": "per peer asked for (--against) and not timed: why",
    "policy_gain": ("kdabench-baseline (capacity 4, config under baseline_policy) median / "
                    "kdabench median, same mode"),
    "backends": ("kdabench, kdabench-c1 and kdabench-baseline run on backends[0]; "
                 "kdabench-<backend> (capacity 4, four active checkpoints) on each further "
                 "backend"),
    "backend_ratios": ("per kdabench-<backend>: ratio_fla_over = fla median / its median, "
                       "ratio_kdabench_over = kdabench median / its median, same mode"),
    "backend_output": ("relative Frobenius error of each kdabench-<backend>'s output against "
                       "kdabench's"),
    "breakdown": ("per kernel, after its timed samples: breakdown_calls eager calls under "
                  "torch.profiler; gpu_us = the GPU time per call, kernels_us = each GPU "
                  "kernel's mean microseconds per call"),
    "gates": ("the gate regime of the case's inputs: how the log decay g [T, H, K] is drawn "
              "(formula, seed; measured = mean, min and max of the g drawn), the same g for "
              "every kernel"),
    "graph_checks": ("per kernel, before its graph timing counts: each input set's graph "
                     "replayed once into zeroed outputs (kdabench: also the pool slots of the "
                     "final states and checkpoints) against an eager call on the same set; "
                     "relative Frobenius error per set, above tolerance the case fails"),
}


def bench_config(bench: Bench, ceilings: Any) -> dict[str, Any]:
    """The receipt's config of ``bench`` (its ``bench_summary`` is added at the end)."""
    shapes = bench.shapes
    config = {
        "shapes_name": shapes.name, "shape_set": shapes.set_name or "file",
        "shapes_sha256": shapes.sha256, "shapes": shapes.document,
        "gates": [regime.record(shapes.seed, statistics=True) for regime in bench.gates],
        "against": bench.against, "fla_skipped": bench.fla_skipped,
        "peers": list(bench.peers), "peers_skipped": bench.peers_skipped,
        "kernels": bench.kernels, "modes": bench.modes, "primary_mode": bench.primary_mode,
        "reps": bench.reps, "warmup": bench.warmup, "breakdown_calls": bench.breakdown,
        "policy_mode": bench.policy_mode,
        "baseline_policy": bench.baseline_policy, "backends": bench.backends,
        "backend_kernels": {bench.backends[0]: KDABENCH, **bench.backend_kernels},
        "ceilings": ceilings.to_dict(), "bytes_formula": BYTES_FORMULA,
        "flops_formula": FLOPS_FORMULA, "sanity_tolerance": SANITY_TOLERANCE,
        "definitions": DEFINITIONS,
    }
    if bench.shard is not None:
        config["shard"] = f"{bench.shard[0]}/{bench.shard[1]}"
    return config


@dataclass
class BenchResult:
    """What a run found and where it left the receipt and plots."""

    receipt_path: Path
    receipt: dict[str, Any]
    cases: list[dict[str, Any]]
    summary: dict[str, Any]
    plots: list[Path] = field(default_factory=list)
    peers_skipped: dict[str, str] = field(default_factory=dict)
    plot_error: str | None = None

    @property
    def fla_skipped(self) -> str | None:
        """Why fla, asked for, was not timed (None: timed, or not asked for)."""
        return self.peers_skipped.get(FLA)

    @property
    def ok(self) -> bool:
        return bool(self.cases) and all(c["verdict"] in ("pass", "skip") for c in self.cases)

    def to_dict(self) -> dict[str, Any]:
        config = self.receipt["config"]
        return sanitize({
            "ok": self.ok, "receipt": str(self.receipt_path), "sha256": self.receipt["sha256"],
            "status": self.receipt["status"], "device": self.receipt["device"].get("name"),
            "shape_set": config.get("shape_set"),
            "gates": [regime["name"] for regime in config["gates"]],
            "modes": config["modes"], "fla_skipped": self.fla_skipped,
            "peers": config.get("peers"), "peers_skipped": self.peers_skipped,
            "backends": config["backends"],
            "policy_mode": config.get("policy_mode"),
            "baseline_policy": config.get("baseline_policy"),
            "ceilings": {k: config["ceilings"].get(k)
                         for k in ("copy_bytes_per_s", "matmul_flops_per_s")},
            "summary": self.summary, "plots": [str(p) for p in self.plots],
            "plot_error": self.plot_error,
            "shapes": [{"id": c["id"], "shape": c["shape"], "gates": c["gates"]["name"],
                        "verdict": c["verdict"], "message": c.get("message"),
                        "median_ms": {mode: {k: v.get("median_ms") for k, v in kernels.items()}
                                      for mode, kernels in (c.get("modes") or {}).items()},
                        "ratio_fla_over_kdabench": c.get("ratio_fla_over_kdabench"),
                        "ratio_cudnn_over_kdabench": c.get("ratio_cudnn_over_kdabench"),
                        "export_overhead": c.get("export_overhead"),
                        "policy_gain": c.get("policy_gain"),
                        "same_config": c.get("same_config"),
                        "backend_ratios": c.get("backend_ratios"),
                        "floor_ms": c.get("floor_ms"), "breakdown": c.get("breakdown"),
                        "config_sources": {k: v.get("config_source") for k, v in
                                           (c.get("kernel_configs") or {}).items()},
                        "sanity": c.get("sanity"),
                        "graph_checks": c.get("graph_checks")} for c in self.cases],
        })
