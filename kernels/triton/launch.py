"""Launching the Triton kernels for a binding, the workspaces they need, and the devices they run on."""

from __future__ import annotations

import torch
import triton

from .prefill import kda_state_pass_kernel
from .prepare import kda_chunk_prepare_kernel
from .validate import kda_validate_kernel

GATE_CODES = {"precomputed": 0, "sigmoid": 1, "softplus": 2}
VALIDATE_BLOCK = 64
SEARCH_BLOCK = 256
FILL_ROWS = 64
SUB_CHUNK = 16
KERNEL_WORKSPACES = ("ws_G", "ws_QG", "ws_KD", "ws_GL", "ws_W", "ws_U", "ws_Aqk")  # argument order


def interpreted() -> bool:
    """True when the kernels were built for the Triton interpreter (TRITON_INTERPRET=1)."""
    return type(kda_state_pass_kernel).__name__ == "InterpretedFunction"


def device_ineligibility(device: torch.device) -> list[str]:
    """Reasons the Triton backend cannot run on this device (empty when it can)."""
    if device.type == "cpu":
        if interpreted():
            return []
        reason = ("CPU tensors run only under the Triton interpreter: set TRITON_INTERPRET=1 "
                  "before importing kdabench.kernels")
        return [reason]
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


def chunk_slots(max_tokens: int, max_seqs: int, chunk_size: int) -> int:
    """Upper bound on the chunks of any packed batch: sum(ceil(len / c)) <= T / c + N."""
    return max_tokens // chunk_size + max_seqs


def allocate_workspaces(num_heads: int, head_dim: int, max_tokens: int, max_seqs: int,
                        chunk_size: int, device: torch.device,
                        operand_dtype: str = "float32") -> dict[str, torch.Tensor]:
    """The per-plan workspaces of the two-stage prefill (operands in `operand_dtype`)."""
    chunks = chunk_slots(max_tokens, max_seqs, chunk_size)
    rows = chunks * chunk_size
    f32 = {"dtype": torch.float32, "device": device}
    ops = {"dtype": getattr(torch, operand_dtype), "device": device}
    return {
        "chunk_offsets": torch.zeros(max_seqs + 1, dtype=torch.int32, device=device),
        "ws_G": torch.empty(num_heads, rows, head_dim, **f32),
        "ws_QG": torch.empty(num_heads, rows, head_dim, **ops),
        "ws_KD": torch.empty(num_heads, rows, head_dim, **ops),
        "ws_GL": torch.empty(num_heads, chunks, head_dim, **f32),
        "ws_W": torch.empty(num_heads, rows, head_dim, **ops),
        "ws_U": torch.empty(num_heads, rows, head_dim, **f32),
        "ws_Aqk": torch.empty(num_heads, rows, chunk_size, **ops),
    }


def validate(binding) -> None:
    """Launch the one-program validation prologue; it writes the error code and chunk offsets."""
    plan = binding.plan
    kda_validate_kernel[(1,)](
        binding.cu_seqlens, binding.num_seqs, binding.initial_state_indices,
        binding.final_state_indices, binding.checkpoint_offsets,
        binding.checkpoint_state_indices, plan.error_code, plan.workspaces["chunk_offsets"],
        binding.cu_seqlens.numel() - 1, binding.q.shape[0], binding.state_pool.shape[0],
        CK=plan.caps.max_checkpoints, CHUNK=plan.config.chunk_size, BLOCK=VALIDATE_BLOCK,
        num_warps=4,
    )


def prefill(binding) -> None:
    """Launch stage 1 (per chunk and head) and stage 2 (per sequence, V block and head)."""
    plan = binding.plan
    caps, config, ws = plan.caps, plan.config, plan.workspaces
    meta_capacity = binding.cu_seqlens.numel() - 1
    stride_slots = chunk_slots(caps.max_tokens, caps.max_seqs, config.chunk_size)
    bound_slots = chunk_slots(binding.q.shape[0], meta_capacity, config.chunk_size)
    workspaces = [ws[name] for name in KERNEL_WORKSPACES]
    kda_chunk_prepare_kernel[(bound_slots, caps.num_heads)](
        binding.q, binding.k, binding.v, binding.g, binding.beta, binding.cu_seqlens,
        binding.num_seqs, ws["chunk_offsets"], binding.A_log, binding.dt_bias, plan.error_code,
        *workspaces, float(caps.lower_bound), stride_slots,
        H=caps.num_heads, K=caps.head_dim, V=caps.head_dim, CHUNK=config.chunk_size,
        SUB=SUB_CHUNK, GATE=GATE_CODES[caps.gate], QK_L2NORM=caps.qk_l2norm,
        BETA_SIGMOID=caps.beta_sigmoid,
        DOT_PRECISION=config.dot_precision, SEARCH_BLOCK=SEARCH_BLOCK,
        num_warps=config.prepare_warps,
    )
    grid = (meta_capacity, triton.cdiv(caps.head_dim, config.block_v), caps.num_heads)
    kda_state_pass_kernel[grid](
        binding.k, binding.out, binding.state_pool, binding.cu_seqlens,
        binding.num_seqs, ws["chunk_offsets"], binding.initial_state_indices,
        binding.final_state_indices, binding.checkpoint_offsets,
        binding.checkpoint_state_indices, *workspaces, plan.error_code, binding.scale,
        binding.out.shape[0], meta_capacity, stride_slots,
        H=caps.num_heads, K=caps.head_dim, V=caps.head_dim, BV=config.block_v,
        CHUNK=config.chunk_size, CK=caps.max_checkpoints, QK_L2NORM=caps.qk_l2norm,
        DOT_PRECISION=config.dot_precision, UPCAST_DOTS=interpreted(), FILL_ROWS=FILL_ROWS,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
