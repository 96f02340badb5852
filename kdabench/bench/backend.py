"""What the bench runner needs from a device: the :class:`Backend` protocol.

The CUDA backend (:mod:`kdabench.bench.cuda`) builds real kernels; tests inject a fake one
with deterministic timings so the whole pipeline runs on a CPU.

Kernel names: ``kdabench`` (capacity 4, four active checkpoints per sequence),
``kdabench-c1`` (capacity 1, one active checkpoint per sequence), ``kdabench-baseline``
(as ``kdabench``, its config resolved under the baseline policy mode), all three on the
first kernel backend asked for; ``kdabench-<backend>`` (:func:`backend_kernel`; as ``kdabench``
on each further backend, e.g. ``kdabench-cute``); the peers: ``fla`` (``fla.ops.kda.chunk_kda``
with its final state) and ``cudnn`` (cuDNN frontend's fused sm90 KDA kernel,
:mod:`kdabench.bench.cudnn`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kdabench.bench.breakdown import Profiler
from kdabench.bench.shapes import BenchShape, ShapeSet
from kdabench.bench.timing import Timer
from kdabench.bench.work import Ceilings

if TYPE_CHECKING:
    from kdabench.bench.gates import GateRegime

KDABENCH = "kdabench"
KDABENCH_C1 = "kdabench-c1"
KDABENCH_BASELINE = "kdabench-baseline"
FLA = "fla"
CUDNN = "cudnn"
PEERS = (FLA, CUDNN)  # other KDA kernels timed beside kdabench (--against)
MODES = ("eager", "graph")
DEFAULT_BACKENDS = ("auto",)  # what kda_prefill runs with default options


def import_failure(package: str, error: Exception, extra: str, purpose: str) -> str:
    """Why a peer's ``package`` did not import, in one line: absent (and the optional extra
    that installs it, for ``purpose``), or installed and broken."""
    if isinstance(error, ModuleNotFoundError):
        return (f"{package} is not installed ({error}); install the optional extra "
                f"'{extra}' {purpose}")
    return f"{package} does not import: {type(error).__name__}: {error}"


def backend_kernel(backend: str) -> str:
    """The kernel name of a further backend's column: ``kdabench-<backend>``."""
    return f"{KDABENCH}-{backend}"


@dataclass
class KernelCalls:
    """The runs of one kernel at one shape: an eager call per input set and, when captured,
    a graph replay per input set (``graph`` None: ``graph_note`` says why). ``replay_check``
    (:func:`kdabench.bench.replay.check_replays`): every set's replay against an eager call on
    that set; with a ``problem`` the graphs are not timed and the case fails."""

    eager: list[Callable[[], Any]]
    graph: list[Callable[[], Any]] | None = None
    graph_note: str | None = None
    replay_check: dict[str, Any] | None = None


@dataclass
class Outputs:
    """One run of each kernel on input set 0: output [T, H, V] and final states
    [N, H, V, K] (V-first, as the kdabench pool holds them)."""

    output: dict[str, Any] = field(default_factory=dict)
    final_state: dict[str, Any] = field(default_factory=dict)


@dataclass
class Prepared:
    """A case made ready: input sets allocated, kernels bound, graphs captured;
    ``gate_stats``: the mean, min and max of the log decay g drawn (input set 0)."""

    input_sets: int
    input_set_bytes: int
    calls: dict[str, KernelCalls]
    outputs: Callable[[], Outputs]
    check: Callable[[], list[str]]  # problems found after the runs (kernel error codes)
    release: Callable[[], None]
    details: dict[str, Any] = field(default_factory=dict)
    gate_stats: dict[str, float] = field(default_factory=dict)


class Backend(Protocol):
    timer: Timer
    profiler: Profiler | None  # None: no --breakdown here

    def unavailable(self) -> str | None:
        """Why this backend cannot run here (None when it can)."""

    def identity(self) -> dict[str, Any]:
        """The device identity for the receipt."""

    def peer_unavailable(self, peer: str) -> str | None:
        """Why peer kernel ``peer`` (one of PEERS) cannot be called (None when it can)."""

    def backend_unavailable(self, backend: str, shapes: ShapeSet) -> str | None:
        """Why kernel backend ``backend`` cannot plan ``shapes`` here (None when it can)."""

    def ceilings(self) -> Ceilings:
        """Measure the copy bandwidth and the bf16 matmul rate."""

    def prepare(self, shape: BenchShape, shapes: ShapeSet, kernels: Sequence[str],
                modes: Sequence[str], gates: GateRegime, policy_mode: str | None = None,
                baseline_policy: str | None = None,
                backends: Sequence[str] = DEFAULT_BACKENDS) -> Prepared:
        """Allocate inputs (g drawn under the regime ``gates``,
        :func:`kdabench.bench.gates.draw_inputs`), bind and warm the kernels, capture graphs
        for ``modes`` and check every replay; the
        kdabench plans resolve their configs under ``policy_mode`` (kdabench-baseline's under
        ``baseline_policy``), on ``backends[0]`` (``kdabench-<backend>`` on its backend), and
        ``details`` carries ``kernel_configs`` = {kernel: kdabench.kernel_records.plan_record}."""
