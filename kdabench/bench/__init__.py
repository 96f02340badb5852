"""`kdabench bench`: kdabench's prefill (on one or more kernel backends) against fla's
chunk_kda, per shape and mode, with the floor measured in the same run, written as a bench
receipt and plots.

Modules: `shapes` (the shapes file), `work` (bytes, FLOPs, floor), `timing` (the injectable
timer, graph capture), `breakdown` (the injectable kernel profiler: GPU time per kernel),
`backend` (what a device provides), `cuda` (the real one), `summary` (per-shape metrics and
the summary over the shapes), `run` (the runner and receipt), `merge` (joining the shard
receipts of a sharded run), `plots` (PNGs beside the receipt).
"""

from kdabench.bench.backend import (
    DEFAULT_BACKENDS,
    FLA,
    KDABENCH,
    KDABENCH_BASELINE,
    KDABENCH_C1,
    MODES,
    Backend,
    KernelCalls,
    Outputs,
    Prepared,
    backend_kernel,
)
from kdabench.bench.breakdown import (
    Profiler,
    breakdown_line,
    breakdown_record,
    cuda_kernel_profiler,
    short_kernel_name,
)
from kdabench.bench.merge import merge_bench_receipts
from kdabench.bench.run import (
    AGAINST,
    SANITY_TOLERANCE,
    Bench,
    BenchError,
    BenchResult,
    relative_error,
)
from kdabench.bench.shapes import BenchShape, ShapesError, ShapeSet, load_shapes, parse_shapes
from kdabench.bench.summary import backend_metrics, policy_metrics, shape_metrics, summarize
from kdabench.bench.timing import Timer, capture_graph, cuda_event_timer
from kdabench.bench.work import Ceilings, count_bytes, count_flops, floor

__all__ = [
    "AGAINST", "DEFAULT_BACKENDS", "FLA", "KDABENCH", "KDABENCH_BASELINE", "KDABENCH_C1",
    "MODES", "SANITY_TOLERANCE", "Backend", "Bench", "BenchError", "BenchResult", "BenchShape",
    "Ceilings", "KernelCalls", "Outputs", "Prepared", "Profiler", "ShapeSet", "ShapesError",
    "Timer", "backend_kernel", "backend_metrics", "breakdown_line", "breakdown_record",
    "capture_graph", "count_bytes", "count_flops", "cuda_event_timer", "cuda_kernel_profiler",
    "floor", "load_shapes", "merge_bench_receipts", "parse_shapes", "policy_metrics",
    "relative_error", "shape_metrics", "short_kernel_name", "summarize",
]
