"""The qualification matrix: a TOML file of axes and scenarios, expanded into cases.

A matrix file (``kdabench/data/qualify.toml`` is the default) holds::

    schema = "kdabench.matrix.v1"
    name = "default"
    seed = 0                                   # mixed into every case's data seed
    backends = ["triton"]                      # the backends this matrix qualifies
    tolerances = { output = 5e-3, state = 3e-3 }
    timing = { warmup = 3, reps = 15 }         # GPU tier: CUDA-event samples per case

    [layouts.R16]                              # a batch of sequence lengths, named for case ids
    lengths = [1, 15, 16, 17, 1024]            # listed lengths first ...
    count = 16                                 # ... then seeded random ones up to `count`
    random = [1, 300]                          # drawn from this range (inclusive)

    [[group]]                                  # one block of cases: list-valued axes are crossed
    scenario = "accuracy"
    tiers = ["gpu"]
    capacity = [1, 2, 4]
    heads = [4, 8]
    layout = ["R16"]

Every axis takes a value or a list of values; a group expands to the product of its lists
(in the order of :data:`AXES`), axes left out take their defaults. Each case gets an id
that reads like the case (``accuracy-C4-H8-K128-L8192x1-unaligned-precomputed-lb5``) and
an ``index``: its position in the expansion for its tier. Ids are unique per tier.

Errors a user can make in the file (TOML syntax, unknown axes, scenarios or layouts, bad
values) raise :class:`MatrixError` with one line that names the file and the group.

Modules: `axes` (the vocabulary: axes, variants, scenarios), `loading` (reading and checking a
file), `cases` (expanded cases, the matrix, case ids, selection by tier and shard).
"""

from kdabench.kernels.contract import (
    CAPACITIES,
    GATE_MODES,
    HEAD_DIMS,
    INDEX_DTYPES,
    MIN_LOWER_BOUND,
)
from kdabench.matrix.axes import (
    AXES,
    CONTRACT_VARIANTS,
    DEFAULT_MATRIX,
    DEFAULT_TIMING,
    DEFAULT_TOLERANCES,
    FAULT_VARIANTS,
    GATE_AXES,
    INVALID_FOURTH_VARIANTS,
    KERNEL_AXES,
    OFFSET_MODES,
    SCENARIOS,
    SCHEMA,
    TIERS,
    TWO_SEQUENCE_VARIANTS,
    Axis,
    MatrixError,
    Scenario,
)
from kdabench.matrix.cases import (
    Case,
    Matrix,
    case_id_for,
    check_shard,
    parse_shard,
    select_cases,
)
from kdabench.matrix.loading import load_matrix, parse_matrix

__all__ = [
    "AXES", "CAPACITIES", "CONTRACT_VARIANTS", "DEFAULT_MATRIX", "DEFAULT_TIMING",
    "DEFAULT_TOLERANCES", "FAULT_VARIANTS", "GATE_AXES", "GATE_MODES", "HEAD_DIMS",
    "INDEX_DTYPES", "INVALID_FOURTH_VARIANTS", "KERNEL_AXES", "MIN_LOWER_BOUND", "OFFSET_MODES",
    "SCENARIOS", "SCHEMA", "TIERS", "TWO_SEQUENCE_VARIANTS", "Axis", "Case", "Matrix",
    "MatrixError", "Scenario", "case_id_for", "check_shard", "load_matrix", "parse_matrix",
    "parse_shard", "select_cases",
]
