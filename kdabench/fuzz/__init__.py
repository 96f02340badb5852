"""Metadata fuzzing of the KDA prefill at scale: seeded sets, full checks, shrunk findings.

    from kdabench.fuzz import CPU_LIMITS, Campaign

The modules: `classes` (the fault classes and their bits), `sets` (one set's metadata),
`mutations` (a fault class applied to a valid set), `generate` (the seeded stream of valid
and faulty sets), `rig` (a plan's device buffers, reused by every set), `check` (run one set
and check it against the metadata oracle and the float64 recurrence), `shrink` (greedy
shrinking of a failing set), `cases` (JSON case files and their replay), `corpus` (the seed
corpus of one case per fault class), `run` (a campaign over backends), `parallel` and
`worker` (a backend's sets in worker processes sharing the device), `receipt` (the "fuzz"
receipt). Every expected error code comes from
kdabench.oracles.metadata.expected_error_code, never from the kernel.
"""

from kdabench.fuzz.cases import SCHEMA, CaseError, Shape, case_files, load_case, replay
from kdabench.fuzz.check import FAULTY_CHECKS, VALID_CHECKS, Failure, SetResult, run_set
from kdabench.fuzz.classes import FAULT_CLASSES, FaultClass
from kdabench.fuzz.generate import Limits, faulty_set, generate, valid_set
from kdabench.fuzz.run import CPU_LIMITS, GPU_LIMITS, BackendRun, Campaign
from kdabench.fuzz.sets import FuzzSet
from kdabench.fuzz.shrink import shrink

__all__ = [
    "CPU_LIMITS", "FAULTY_CHECKS", "FAULT_CLASSES", "GPU_LIMITS", "SCHEMA", "VALID_CHECKS",
    "BackendRun", "Campaign", "CaseError", "Failure", "FaultClass", "FuzzSet", "Limits",
    "SetResult", "Shape", "case_files", "faulty_set", "generate", "load_case", "replay",
    "run_set", "shrink", "valid_set",
]
