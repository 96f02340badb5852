"""The bench's sanity check: kdabench's output against each peer's (fla's, cuDNN's) on input
set 0, and every other kdabench column's against kdabench's, as relative Frobenius errors;
above :data:`SANITY_TOLERANCE` a case fails (the contenders compute the same function, so a
miss means a misuse of one API, a wrong config or a wrong backend, which must not look fast)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kdabench.bench.backend import (
    CUDNN,
    FLA,
    KDABENCH,
    KDABENCH_BASELINE,
    KDABENCH_C1,
    Outputs,
)

SANITY_TOLERANCE = 5e-2
SANITY_CHECKED = {"output": "kdabench output differs from fla's",  # sanity key: what a miss is
                  "cudnn_output": "kdabench output differs from cudnn's",
                  "baseline_output": f"{KDABENCH_BASELINE} output differs from kdabench's"}


def relative_error(found: Any, reference: Any) -> float:
    """||found - reference|| / ||reference|| (Frobenius, float64); inf when not finite."""
    found, reference = found.double(), reference.double()
    if tuple(found.shape) != tuple(reference.shape):
        raise ValueError(f"shapes differ: {tuple(found.shape)} against {tuple(reference.shape)}")
    norm = float(reference.norm())
    error = float((found - reference).norm())
    value = error / norm if norm else error
    return value if math.isfinite(value) else math.inf


def sanity(outputs: Outputs, backend_kernels: Sequence[str]) -> dict[str, Any]:
    """Relative errors: kdabench against fla and cudnn, capacity 1, the baseline and each
    further backend's kernel (``backend_kernels``) against kdabench (None where a kernel did
    not run)."""
    found: dict[str, Any] = {"tolerance": SANITY_TOLERANCE, "output": None,
                             "final_state": None, "cudnn_output": None,
                             "cudnn_final_state": None, "c1_vs_c4_output": None,
                             "baseline_output": None, "backend_output": {},
                             "backend_final_state": {}}
    ours = outputs.output.get(KDABENCH)
    if ours is not None and FLA in outputs.output:
        found["output"] = relative_error(ours, outputs.output[FLA])
        found["final_state"] = relative_error(outputs.final_state[KDABENCH],
                                              outputs.final_state[FLA])
    if ours is not None and CUDNN in outputs.output:
        found["cudnn_output"] = relative_error(ours, outputs.output[CUDNN])
        found["cudnn_final_state"] = relative_error(outputs.final_state[KDABENCH],
                                                    outputs.final_state[CUDNN])
    if ours is not None and KDABENCH_C1 in outputs.output:
        found["c1_vs_c4_output"] = relative_error(outputs.output[KDABENCH_C1], ours)
    if ours is not None and KDABENCH_BASELINE in outputs.output:
        found["baseline_output"] = relative_error(outputs.output[KDABENCH_BASELINE], ours)
    for kernel in backend_kernels:
        ran = ours is not None and kernel in outputs.output
        found["backend_output"][kernel] = relative_error(
            outputs.output[kernel], ours) if ran else None
        found["backend_final_state"][kernel] = relative_error(
            outputs.final_state[kernel], outputs.final_state[KDABENCH]) if ran else None
    return found


def sanity_problems(found: dict[str, Any]) -> list[str]:
    """The sanity checks a case fails: each checked error above :data:`SANITY_TOLERANCE`."""
    checked = [(what, found.get(key)) for key, what in SANITY_CHECKED.items()]
    checked += [(f"{kernel} output differs from kdabench's", error)
                for kernel, error in (found.get("backend_output") or {}).items()]
    return [f"{what} by {error:.3g} (relative), over {SANITY_TOLERANCE:g}"
            for what, error in checked if error is not None and not error <= SANITY_TOLERANCE]
