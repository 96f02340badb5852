"""Running a qualification matrix: one runner per scenario, the run loop, and the receipt.

    from kdabench.matrix import load_matrix
    from kdabench.qualify import Qualification

    run = Qualification(load_matrix(), tier="cpu")
    result = run.run(on_case=print)          # writes .kdabench/qualify-<device>-<time>.json
    result.ok, result.receipt_path, result.by_scenario

Every case builds seeded inputs (kdabench.inputs) and metadata (slot indices, checkpoint
offsets) from its id, runs the kernel and checks it: outputs, final states and every
checkpoint against the float64 recurrence on the same device (relative Frobenius error,
tolerances from the matrix, recorded beside the measured error), pool slots that nothing
should write compared bit for bit, and for rejected metadata the exact error code (from the
fault table and from kdabench.oracles.metadata), an untouched pool and an all-NaN output.

A case's record: id, index, scenario, params, shape, errors, tolerances, checks, verdict
(pass / fail / error), message, median_ms and samples_ms (GPU: CUDA events around the call;
CPU tier: None and []), kernel_config, config_source and policy_mode (what plan() resolves
for the call: the config, where it came from, e.g. "profile nvidia-h200.json (query v1 ...)"
or "heuristic (no profile entry for ...)", and the mode; None for cases that plan no kernel
call; a profile-configs case lists every config it forced, with mode None). The receipt's
config records the policy mode of the run ($KDABENCH_POLICY_MODE, else AUTO).

The CPU tier runs the Triton kernels under the interpreter: `prepare_tier("cpu")` sets
TRITON_INTERPRET=1, which works only before `kdabench.kernels` is first imported, so this
package imports the kernels lazily.

Each record also splits its wall time (`wall_s`) into `compile_s` (kernel compiles, as
`compile_clock` measures them) and `run_s`; the config's `time` holds the totals.

The modules: `metadata` (one call's metadata and how valid metadata is drawn), `faults`
(mutations that break exactly one metadata rule), `harness` (what the runners share: the
context, the outcome, one kernel call, the checks), `scenarios` (a package: one runner per
scenario, a module per family, and RUNNERS, the table of them), `profile_configs` (the runner
that forces each config of the device's profile in turn), `compile_clock` (compile seconds),
`run` (tiers, the run loop, the receipt, summaries), `assign` (which worker runs which case),
`worker` (one worker process's entry), `merge` (joining the workers' or shards' receipts) and
`parallel` (worker processes, several per GPU or N on the CPU, merged into one receipt).
"""

from kdabench.qualify.faults import (
    BAD_OFFSET,
    DUPLICATE,
    FAULT_BITS,
    FAULTS,
    FOURTH_BITS,
    MALFORMED,
    OUT_OF_RANGE,
    RANDOM_MUTATIONS,
)
from kdabench.qualify.harness import SENTINEL, Context, Outcome, check_rejected, check_valid
from kdabench.qualify.merge import merge_qualify_receipts
from kdabench.qualify.metadata import CHUNK, CannotBuild, Metadata, build_metadata, choose_offsets
from kdabench.qualify.parallel import (
    MULTICAST_OFF,
    ParallelQualification,
    WorkerFailed,
    default_workers,
    parse_gpus,
    visible_gpus,
)
from kdabench.qualify.profile_configs import config_label, run_profile_configs
from kdabench.qualify.run import (
    Qualification,
    QualifyError,
    QualifyResult,
    default_tier,
    fmt_error,
    prepare_tier,
    run_case,
    summarize_by_scenario,
)
from kdabench.qualify.scenarios import (
    INT32_LINE,
    RUNNERS,
    run_accuracy,
    run_contract,
    run_fault,
    run_fuzz,
    run_graph,
    run_inactive,
    run_int32_boundary,
    run_invalid_fourth,
    run_mirror,
    run_poisoned,
    run_prefix,
)

__all__ = [
    "BAD_OFFSET", "CHUNK", "DUPLICATE", "FAULTS", "FAULT_BITS", "FOURTH_BITS", "INT32_LINE",
    "MALFORMED", "MULTICAST_OFF", "OUT_OF_RANGE", "RANDOM_MUTATIONS", "RUNNERS", "SENTINEL",
    "CannotBuild", "Context", "Metadata", "Outcome", "ParallelQualification", "Qualification",
    "QualifyError", "QualifyResult", "WorkerFailed",
    "build_metadata", "check_rejected", "check_valid", "choose_offsets", "config_label",
    "default_tier", "default_workers", "fmt_error", "merge_qualify_receipts", "parse_gpus",
    "prepare_tier", "run_accuracy",
    "run_case", "run_contract", "run_fault", "run_fuzz", "run_graph", "run_inactive",
    "run_int32_boundary", "run_invalid_fourth", "run_mirror", "run_poisoned", "run_prefix",
    "run_profile_configs", "summarize_by_scenario", "visible_gpus",
]
