"""The matrix's vocabulary: axes with their defaults and labels, fault and contract variants,
and the scenarios with the axes each reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kdabench.kernels.contract import CAPACITIES

SCHEMA = "kdabench.matrix.v1"
TIERS = ("cpu", "gpu")
DEFAULT_MATRIX = "qualify.toml"  # in kdabench/data/

OFFSET_MODES = ("aligned", "unaligned", "first", "last")

DEFAULT_TOLERANCES = {"output": 5e-3, "state": 3e-3}
DEFAULT_TIMING = {"warmup": 3, "reps": 15}


class MatrixError(ValueError):
    """A matrix file, a shard or a filter the tool cannot use; the message is one line."""


# --------------------------------------------------------------------------- axes


@dataclass(frozen=True)
class Axis:
    """One axis: its default and how a value reads in a case id ('' leaves it out)."""

    name: str
    default: Any
    label: Any  # callable value -> str


def _lower_bound_label(value: float) -> str:
    return f"lb{abs(value):g}"


#: Every axis, in expansion and case-id order.
AXES: dict[str, Axis] = {
    axis.name: axis
    for axis in (
        Axis("variant", None, str),
        Axis("capacity", 1, lambda v: f"C{v}"),
        Axis("heads", 4, lambda v: f"H{v}"),
        Axis("head_dim", 64, lambda v: f"K{v}"),
        Axis("layout", None, str),
        Axis("offsets", "unaligned", str),
        Axis("gate", "precomputed", str),
        Axis("lower_bound", -5.0, _lower_bound_label),
        Axis("qk_l2norm", False, lambda v: "l2" if v else ""),
        Axis("beta_sigmoid", False, lambda v: "bsig" if v else ""),
        Axis("index_dtype", "int32", lambda v: "i64" if v == "int64" else ""),
        Axis("seed", 0, lambda v: f"s{v}" if v else ""),
    )
}

KERNEL_AXES = (
    "capacity", "heads", "head_dim", "layout", "offsets", "gate", "lower_bound",
    "qk_l2norm", "beta_sigmoid", "index_dtype", "seed",
)
GATE_AXES = ("gate", "lower_bound", "qk_l2norm", "beta_sigmoid")

#: Fault variants: name -> the smallest capacity the fault can be built with.
FAULT_VARIANTS = {
    "duplicate-final": 1,           # two sequences write one final slot
    "duplicate-final-checkpoint": 1,  # a checkpoint slot is its sequence's final slot
    "duplicate-checkpoint": 2,      # two checkpoints of one sequence share a slot
    "write-aliases-initial": 1,     # a final slot is another sequence's initial slot
    "lengths-decreasing": 1,        # cu_seqlens goes down
    "lengths-nonzero-start": 1,     # cu_seqlens[0] != 0
    "lengths-past-capacity": 1,     # cu_seqlens[-1] > the bound tokens
    "live-count-zero": 1,           # planned run with num_seqs = 0
    "live-count-over-capacity": 1,  # planned run with num_seqs > the metadata capacity
    "slot-range-initial": 1,        # an initial slot == num_slots
    "slot-range-final": 1,          # a final slot past the pool
    "slot-range-checkpoint": 1,     # a checkpoint slot == num_slots
    "slot-negative": 1,             # a final slot of -2 (only -1 is null)
    "offset-zero": 1,               # an active checkpoint at offset 0
    "offset-at-length": 1,          # an active checkpoint at offset len
    "offset-past-length": 1,        # an active checkpoint past the sequence
    "offset-not-increasing": 2,     # active offsets going down
    "offset-equal": 2,              # two active checkpoints at one offset
}
#: Variants built across two sequences, by scenario: their layouts need at least two.
TWO_SEQUENCE_VARIANTS = {
    "fault": frozenset({"duplicate-final", "write-aliases-initial"}),
    "invalid-fourth": frozenset({"aliases-initial"}),
}
INVALID_FOURTH_VARIANTS = (
    "out-of-range", "negative", "duplicate-final", "duplicate-checkpoint", "aliases-initial",
)
CONTRACT_VARIANTS = (
    "plan-refuses-capacity-3", "plan-refuses-head-dim-96", "plan-refuses-lower-bound-6",
    "plan-refuses-unknown-backend", "bind-refuses-wrong-heads",
    "bind-refuses-vector-metadata-for-capacity-2", "decode-names-every-bit",
)


@dataclass(frozen=True)
class Scenario:
    """A scenario: the axes it reads, its variants, its options, and where it can run."""

    name: str
    axes: tuple[str, ...]
    variants: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    gpu_only: bool = False
    capacities: tuple[int, ...] = CAPACITIES


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        # outputs, final states and every checkpoint against the float64 recurrence
        Scenario("accuracy", KERNEL_AXES),
        # checkpoints against kernel runs over each prefix (bitwise where aligned)
        Scenario("prefix", KERNEL_AXES),
        # inactive (-1) checkpoint entries and final slots: ignored, nothing written
        Scenario("inactive", KERNEL_AXES),
        # an output poisoned with NaN before a valid run: every live row written
        Scenario("poisoned", KERNEL_AXES),
        # capacity 4 with a bad fourth destination: rejected, pool untouched, output NaN
        Scenario("invalid-fourth", ("variant", *KERNEL_AXES), INVALID_FOURTH_VARIANTS,
                 capacities=(4,)),
        # one fault class per case: its bit, pool untouched, output NaN
        Scenario("fault", ("variant", *KERNEL_AXES), tuple(FAULT_VARIANTS)),
        # a planned binding captured once in a CUDA graph, replayed with new metadata
        Scenario("graph", KERNEL_AXES, options={"replays": 6}, gpu_only=True),
        # written and read slots past the 2^31-element line of the pool
        Scenario("int32-boundary", KERNEL_AXES, gpu_only=True),
        # every distinct config of the device's profile, each forced, against one oracle run
        Scenario("profile-configs", KERNEL_AXES),
        # seeded random metadata sets, a share of them invalid
        Scenario("fuzz", ("capacity", "heads", "head_dim", *GATE_AXES, "seed"),
                 options={"sets": 24, "invalid_share": 0.35, "max_seqs": 6, "max_len": 48}),
        # the chunk mirror (fp32) against the float64 recurrence: no kernel
        Scenario("mirror", ("heads", "head_dim", "layout", "offsets", *GATE_AXES, "seed")),
        # host-side contracts of plan/bind and the error decoding
        Scenario("contract", ("variant",), CONTRACT_VARIANTS),
    )
}

