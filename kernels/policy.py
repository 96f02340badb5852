"""Kernel configuration for a planned call (a heuristic until profiles exist)."""

from __future__ import annotations

from .config import Caps, KernelConfig


def heuristic_config(caps: Caps) -> KernelConfig:
    """Split V finer when few (sequence, head) programs would otherwise run."""
    block_v = 32 if caps.head_dim >= 64 else caps.head_dim
    return KernelConfig(block_v=block_v, num_warps=4)
