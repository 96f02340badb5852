"""What the kernel supports on a device: the data behind `kdabench kernels info`."""

from __future__ import annotations

import torch

from .config import (
    BACKENDS,
    CAPACITIES,
    CHUNK_SIZE,
    GATE_MODES,
    HEAD_DIMS,
    MIN_LOWER_BOUND,
    SHARED_MEMORY_BUDGET_BYTES,
)
from .triton import launch


def default_device() -> str:
    """cuda:0 when a GPU is present, else cpu."""
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def support_report(device: str | None = None) -> dict:
    """A JSON-serialisable account of what a plan on `device` supports, and why not if it cannot."""
    name = device or default_device()
    try:
        reasons = launch.device_ineligibility(torch.device(name))
    except (RuntimeError, ValueError) as exc:
        reasons = [f"cannot use device {name!r}: {exc}"]
    return {
        "backend": BACKENDS[0],
        "backends": list(BACKENDS),
        "device": name,
        "eligible": not reasons,
        "reasons": reasons,
        "interpreter": launch.interpreted(),
        "capacities": list(CAPACITIES),
        "head_dims": list(HEAD_DIMS),
        "gate_modes": list(GATE_MODES),
        "index_dtypes": ["int32", "int64"],
        "chunk_size": CHUNK_SIZE,
        "min_lower_bound": MIN_LOWER_BOUND,
        "shared_memory_budget_bytes": SHARED_MEMORY_BUDGET_BYTES,
    }
