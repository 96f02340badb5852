"""One runner per scenario, a module per family, and RUNNERS, the table from scenario name to
runner.

A runner takes the run's Context and a Case and returns the Outcome it found. The modules:
`accuracy` (valid calls against the float64 recurrence: accuracy, inactive, poisoned, prefix,
mirror), `faults` (metadata broken on purpose: fault, invalid-fourth, fuzz), `gpu` (graph,
int32-boundary) and `contract` (host-side refusals); profile-configs lives in
kdabench.qualify.profile_configs.
"""

from __future__ import annotations

from collections.abc import Callable

from kdabench.matrix import Case
from kdabench.qualify.harness import Context, Outcome
from kdabench.qualify.profile_configs import run_profile_configs
from kdabench.qualify.scenarios.accuracy import (
    run_accuracy,
    run_inactive,
    run_mirror,
    run_poisoned,
    run_prefix,
)
from kdabench.qualify.scenarios.contract import run_contract
from kdabench.qualify.scenarios.faults import run_fault, run_fuzz, run_invalid_fourth
from kdabench.qualify.scenarios.gpu import INT32_LINE, run_graph, run_int32_boundary

RUNNERS: dict[str, Callable[[Context, Case], Outcome]] = {
    "accuracy": run_accuracy,
    "prefix": run_prefix,
    "inactive": run_inactive,
    "poisoned": run_poisoned,
    "invalid-fourth": run_invalid_fourth,
    "fault": run_fault,
    "graph": run_graph,
    "int32-boundary": run_int32_boundary,
    "profile-configs": run_profile_configs,
    "fuzz": run_fuzz,
    "mirror": run_mirror,
    "contract": run_contract,
}

__all__ = [
    "INT32_LINE", "RUNNERS", "run_accuracy", "run_contract", "run_fault", "run_fuzz",
    "run_graph", "run_inactive", "run_int32_boundary", "run_invalid_fourth", "run_mirror",
    "run_poisoned", "run_prefix",
]
