"""Launching the Triton kernels for a binding, and what the device in hand allows."""

from __future__ import annotations

import torch
import triton

from .prefill import GATE_PRECOMPUTED, GATE_SIGMOID, GATE_SOFTPLUS, kda_prefill_kernel
from .validate import kda_validate_kernel

GATE_CODES = {"precomputed": GATE_PRECOMPUTED, "sigmoid": GATE_SIGMOID, "softplus": GATE_SOFTPLUS}
VALIDATE_BLOCK = 64
FILL_ROWS = 64


def interpreted() -> bool:
    """True when the kernels were built for the Triton interpreter (TRITON_INTERPRET=1)."""
    return type(kda_prefill_kernel).__name__ == "InterpretedFunction"


def device_ineligibility(device: torch.device) -> list[str]:
    """Reasons the Triton backend cannot run on this device (empty when it can)."""
    if device.type == "cpu":
        if interpreted():
            return []
        return ["CPU tensors run only under the Triton interpreter: set TRITON_INTERPRET=1 "
                "before importing kdabench.kernels"]
    if device.type != "cuda":
        return [f"device type {device.type!r} is not supported (cuda, or cpu under the interpreter)"]
    if not torch.cuda.is_available():
        return ["no CUDA device is available"]
    if interpreted():
        return ["the kernels were built for the interpreter (TRITON_INTERPRET=1); unset it for CUDA"]
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return [f"compute capability {major}.{minor} lacks bf16 tensor cores (needs >= 8.0)"]
    return []


def validate(binding) -> None:
    """Launch the one-program validation prologue; it writes the plan's error code."""
    caps = binding.plan.caps
    kda_validate_kernel[(1,)](
        binding.cu_seqlens, binding.num_seqs, binding.initial_state_indices,
        binding.final_state_indices, binding.checkpoint_offsets,
        binding.checkpoint_state_indices, binding.plan.error_code,
        binding.cu_seqlens.numel() - 1, binding.q.shape[0], binding.state_pool.shape[0],
        CK=caps.max_checkpoints, BLOCK=VALIDATE_BLOCK, num_warps=4,
    )


def prefill(binding) -> None:
    """Launch the prefill: one program per (sequence slot, V block, head)."""
    plan = binding.plan
    caps, config = plan.caps, plan.config
    meta_capacity = binding.cu_seqlens.numel() - 1
    num_v_blocks = triton.cdiv(caps.head_dim, config.block_v)
    grid = (meta_capacity, num_v_blocks, caps.num_heads)
    kda_prefill_kernel[grid](
        binding.q, binding.k, binding.v, binding.g, binding.beta, binding.out,
        binding.state_pool, binding.cu_seqlens, binding.num_seqs,
        binding.initial_state_indices, binding.final_state_indices,
        binding.checkpoint_offsets, binding.checkpoint_state_indices,
        binding.A_log, binding.dt_bias, plan.error_code,
        binding.scale, float(caps.lower_bound), binding.out.shape[0], meta_capacity,
        H=caps.num_heads, K=caps.head_dim, V=caps.head_dim, BV=config.block_v,
        CHUNK=config.chunk_size, CK=caps.max_checkpoints, GATE=GATE_CODES[caps.gate],
        QK_L2NORM=caps.qk_l2norm, BETA_SIGMOID=caps.beta_sigmoid,
        DOT_PRECISION=config.dot_precision, FILL_ROWS=FILL_ROWS,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
