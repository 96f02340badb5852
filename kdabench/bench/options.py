"""The options of a bench run, checked: what it compares against, modes, reps, policy modes,
kernel backends, shard, and the cases it times (shape x gate regime).

Every check raises :class:`BenchError` with one line naming the option.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kdabench.bench.backend import MODES, PEERS
from kdabench.bench.shapes import BenchShape, ShapeSet
from kdabench.kernel_records import CUTE_SPLIT_PREFIX, CUTE_WGMMA
from kdabench.matrix import MatrixError, check_shard

NO_PEER = "none"
DEFAULT_REPS = 100
DEFAULT_WARMUP = 10


class BenchError(ValueError):
    """A bench that cannot start (no GPU, bad options); one line."""


@dataclass(frozen=True)
class BenchCase:
    """One timed case: a shape (``position`` in the shapes file) under one gate regime;
    ``index`` is its position among all the run's cases (shape-major), sharded or not."""

    index: int
    position: int
    shape: BenchShape
    gates: Any  # kdabench.bench.gates.GateRegime

    @property
    def id(self) -> str:
        """"8192x8x1/fast-decay"."""
        return f"{self.shape.label}/{self.gates.name}"


def peers(against: str | Sequence[str]) -> tuple[str, ...]:
    """The peer kernels to time beside kdabench, in PEERS order: ``against`` is a comma-
    separated subset of PEERS (or a sequence of names), or "none"."""
    names = [n.strip() for n in (against.split(",") if isinstance(against, str) else against)]
    names = [n for n in names if n]
    if names == [NO_PEER]:
        return ()
    bad = [n for n in names if n not in PEERS]
    if bad or not names:
        raise BenchError(f"--against takes a comma-separated subset of {','.join(PEERS)}, or "
                         f"{NO_PEER}; got {','.join(names) or 'nothing'}")
    return tuple(p for p in PEERS if p in names)


def check_counts(modes: Sequence[str], reps: int, warmup: int, breakdown: int) -> list[str]:
    """The modes to time, in MODES order, once the simple options are checked."""
    modes = list(dict.fromkeys(modes))
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise BenchError(f"--modes takes a comma-separated subset of {','.join(MODES)}, got "
                         f"{','.join(modes) or 'nothing'}")
    if reps < 1 or warmup < 0:
        raise BenchError(f"--reps must be >= 1 (got {reps}) and warmup >= 0 (got {warmup})")
    if breakdown < 0:
        raise BenchError(f"--breakdown must be >= 0 calls (0: none), got {breakdown}")
    return [m for m in MODES if m in modes]


def policy_mode(mode: str | None) -> str:
    """The policy mode the plans resolve their configs under (argument, env, AUTO)."""
    from kdabench.kernels import KdaPolicyError, resolve_mode

    try:
        return resolve_mode(mode).value
    except KdaPolicyError as error:
        raise BenchError(f"--policy-mode: {error}") from error


def baseline_policy(mode: str | None, policy: str) -> str | None:
    """The baseline's policy mode (None: no baseline); it must differ from ``policy``."""
    if mode is None:
        return None
    from kdabench.kernels import KdaPolicyError, resolve_mode

    try:
        baseline = resolve_mode(mode).value  # not None: the mode itself, parsed
    except KdaPolicyError as error:
        raise BenchError(f"--baseline-policy: {error}") from error
    if baseline == policy:
        raise BenchError(f"--baseline-policy {baseline} is the run's policy mode too "
                         "(--policy-mode, else $KDABENCH_POLICY_MODE, else AUTO): pick another "
                         "mode to compare against")
    return baseline


def kernel_backends(names: Sequence[str]) -> list[str]:
    """The kernel backends to time, first one first, each once; an unknown name refused.

    "auto" is what `kda_prefill` does with default options: per shape, the backend the
    device's profile measured fastest (the case records which one ran). "cute-s<N>" is the
    cute backend with its chunk pass's key split pinned to N (CuteConfig.key_split),
    "cute-wgmma" with its pass on warpgroup MMA (sm_90a)."""
    from kdabench.kernels.config import AUTO_BACKEND, BACKENDS
    from kdabench.kernels.cute.variants import KEY_SPLITS

    names = list(dict.fromkeys(names))
    splits = tuple(f"{CUTE_SPLIT_PREFIX}{split}" for split in KEY_SPLITS)
    known = (AUTO_BACKEND, *BACKENDS, *splits, CUTE_WGMMA)
    bad = [name for name in names if name not in known]
    if bad or not names:
        raise BenchError(f"--backends takes a comma-separated list of {', '.join(known)} "
                         f"(the first one's columns are kdabench's), got "
                         f"{', '.join(map(repr, bad)) if bad else 'nothing'}")
    return names


def select_cases(shapes: ShapeSet, regimes: Sequence[Any],
                 shard: tuple[int, int] | None) -> list[BenchCase]:
    """Every case the run times: each shape of ``shard`` (position % N == I - 1) under each
    regime, shape-major."""
    positions = range(len(shapes.shapes))
    if shard is not None:
        try:
            index, count = check_shard(*shard)
        except MatrixError as error:
            raise BenchError(str(error)) from None
        positions = [p for p in positions if p % count == index - 1]
        if not positions:
            raise BenchError(f"--shard {index}/{count} selects no shape: the shapes file has "
                             f"{len(shapes.shapes)}, so N must be at most that")
    return [BenchCase(position * len(regimes) + number, position, shapes.shapes[position],
                      regime)
            for position in positions for number, regime in enumerate(regimes)]
