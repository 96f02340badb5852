"""What the kernel supports on a device: the data behind `kdabench kernels info`."""

from __future__ import annotations

import torch

from .config import CHUNK_SIZE, SHARED_MEMORY_BUDGET_BYTES
from .contract import BACKENDS, CAPACITIES, GATE_MODES, HEAD_DIMS, INDEX_DTYPES, MIN_LOWER_BOUND
from .cute import launch as cute_launch
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
    cute_reasons = _cute_ineligibility(name)
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
        "index_dtypes": list(INDEX_DTYPES),
        "chunk_size": CHUNK_SIZE,
        "min_lower_bound": MIN_LOWER_BOUND,
        **_shared_memory(name, not reasons),
        "cute_eligible": not cute_reasons,
        "cute_kernels": (cute_launch.origin(torch.device(name)) if not cute_reasons
                         else "; ".join(cute_reasons)),
    }


def _shared_memory(name: str, eligible: bool) -> dict:
    """The heuristic configs' shared-memory budget and the GPU's own limit per block; None
    for both where the kernels do not run on a GPU (the interpreter has no shared memory)."""
    device = torch.device(name)
    if device.type != "cuda" or not eligible:
        return {"shared_memory_budget_bytes": None, "shared_memory_per_block_bytes": None}
    properties = torch.cuda.get_device_properties(device)
    return {"shared_memory_budget_bytes": SHARED_MEMORY_BUDGET_BYTES,
            "shared_memory_per_block_bytes": getattr(properties, "shared_memory_per_block_optin",
                                                     None)}


def _cute_ineligibility(name: str) -> list[str]:
    """Reasons the cute backend cannot run on device `name` (empty when it can)."""
    try:
        return cute_launch.device_ineligibility(torch.device(name))
    except (RuntimeError, ValueError) as exc:
        return [f"cannot use device {name!r}: {exc}"]
