"""`kdabench bench`: kdabench's prefill (on one or more kernel backends) against its peers
(fla's chunk_kda, cuDNN's fused sm90 KDA kernel), per shape and mode, with the floor measured
in the same run, written as a bench receipt and plots.

Modules: `shapes` (the shapes file and the packaged sets), `gates` (the gate regimes: how
the inputs' log decay is drawn), `options` (the checked options and the cases: shape x gate
regime), `work` (bytes, FLOPs, floor), `timing` (the injectable timer, graph capture),
`breakdown` (the injectable kernel profiler: GPU time per kernel), `backend` (what a device
provides), `cuda` (the real one), `cudnn` (cuDNN's kernel as a peer), `replay` (every
graph's replay checked against an eager call), `sanity` (outputs against each other), `measure` (one case), `summary` (per-case
metrics and the summary over the cases), `receipt` (the config and the result), `run` (the
runner), `merge` (joining the shard receipts of a sharded run), `plots` (PNGs beside the
receipt).
"""

from kdabench.bench.backend import (
    CUDNN,
    DEFAULT_BACKENDS,
    FLA,
    KDABENCH,
    KDABENCH_BASELINE,
    KDABENCH_C1,
    MODES,
    PEERS,
    Backend,
    KernelCalls,
    Outputs,
    Prepared,
    backend_kernel,
)
from kdabench.bench.breakdown import Profiler, breakdown_record, cuda_kernel_profiler
from kdabench.bench.gates import (
    DEFAULT_GATES,
    FAST_DECAY,
    LONG_MEMORY,
    GateRegime,
    draw_inputs,
    load_gate_stats,
    parse_gates,
)
from kdabench.bench.merge import merge_bench_receipts
from kdabench.bench.options import NO_PEER, BenchCase, BenchError
from kdabench.bench.receipt import BenchResult
from kdabench.bench.replay import check_replays
from kdabench.bench.run import Bench
from kdabench.bench.sanity import SANITY_TOLERANCE, relative_error
from kdabench.bench.shapes import (
    SHAPE_SETS,
    BenchShape,
    ShapesError,
    ShapeSet,
    load_shapes,
    parse_shapes,
)
from kdabench.bench.summary import (
    backend_metrics,
    policy_metrics,
    shape_metrics,
    summarize,
    summarize_by_gates,
)
from kdabench.bench.timing import Timer, capture_graph, cuda_event_timer
from kdabench.bench.work import Ceilings, count_bytes, count_flops, floor

__all__ = [
    "CUDNN", "DEFAULT_BACKENDS", "DEFAULT_GATES", "FAST_DECAY", "FLA", "KDABENCH",
    "KDABENCH_BASELINE", "KDABENCH_C1", "LONG_MEMORY", "MODES", "NO_PEER", "PEERS",
    "SANITY_TOLERANCE",
    "SHAPE_SETS", "Backend", "Bench", "BenchCase", "BenchError", "BenchResult", "BenchShape",
    "Ceilings", "GateRegime", "KernelCalls", "Outputs", "Prepared", "Profiler", "ShapeSet",
    "ShapesError", "Timer", "backend_kernel", "backend_metrics",
    "breakdown_record", "capture_graph", "check_replays", "count_bytes", "count_flops",
    "cuda_event_timer", "cuda_kernel_profiler", "draw_inputs", "floor", "load_gate_stats",
    "load_shapes", "merge_bench_receipts", "parse_gates", "parse_shapes", "policy_metrics",
    "relative_error", "shape_metrics", "summarize", "summarize_by_gates",
]
