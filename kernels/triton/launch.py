"""Launching the Triton kernels for a binding, the workspaces they need, and the devices they run on."""

from __future__ import annotations

import torch
import triton

from .. import streams
from .prefill import kda_checkpoint_kernel, kda_output_kernel, kda_state_pass_kernel
from .prepare import kda_chunk_prepare_kernel
from .prepare_blocks import (
    kda_chunk_blocks_kernel,
    kda_chunk_decay_kernel,
    kda_chunk_inverse_kernel,
    kda_chunk_solve_kernel,
)
from .segments import kda_segment_scan_kernel, kda_segment_transition_kernel
from .validate import kda_clash_kernel, kda_validate_kernel

GATE_CODES = {"precomputed": 0, "sigmoid": 1, "softplus": 2}
VALIDATE_BLOCK = 64
SEARCH_BLOCK = 256
FILL_ROWS = 64
SUB_CHUNK = 16
KEY_SLICE = 32  # split stage 1: key columns per product step of the blocks kernel
# The blocks kernel's products are [16, KEY_SLICE] x [KEY_SLICE, CHUNK]: 4 warps split the CHUNK
# columns. H200, chunk 64 (kernels/NOTES.md, v11): slices of 32 at 4 warps beat 16 by 6-7% (8192x8
# 121 -> 114 us, 8192x32 463 -> 430); 8 warps are 1.6-1.8x slower at any slice.
BLOCKS_WARPS = 4
SOLVE_COLUMNS = 64  # split stage 1: W or U columns per solve program
SCAN_ROWS = 32  # parallel segments: rows of the previous edge state per scan product
OUTPUT_BLOCK_V = 64  # split output: V columns per output program
CHECKPOINT_BLOCK_V = 32  # V columns per checkpoint program
# The split pipeline runs stage 1 and the pass in ranges of chunks, a range's pass overlapping
# the next range's stage 1; each range costs 4 launches and an event. A range pays for itself
# once a sequence slot holds this many chunks per range: under CUDA-graph capture, where a
# launch costs nothing on replay, or eager, where each costs ~25 us of host time (H200,
# kernels/NOTES.md, v11). At most SPLIT_RANGES ranges (ws_carry's rows).
SPLIT_RANGES = 8
CHUNKS_PER_RANGE_CAPTURED = 64
CHUNKS_PER_RANGE_EAGER = 256
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
                        chunk_size: int, device: torch.device, operand_dtype: str = "float32",
                        pipeline: str = "fused", segments: int = 1) -> dict[str, torch.Tensor]:
    """The per-plan workspaces of the two-stage prefill (operands in `operand_dtype`); the split
    pipeline adds the solve's matrix (ws_A), the chunk-start states (ws_S) and the state
    carried from one range's pass to the next (ws_carry); parallel segments (segments.py) add
    the edge states (ws_carry), each range's transition (ws_trans) and offset (ws_bias), and
    the initial states copied for the pass (ws_entry)."""
    chunks = chunk_slots(max_tokens, max_seqs, chunk_size)
    rows = chunks * chunk_size
    f32 = {"dtype": torch.float32, "device": device}
    ops = {"dtype": getattr(torch, operand_dtype), "device": device}
    workspaces = {
        "chunk_offsets": torch.zeros(max_seqs + 1, dtype=torch.int32, device=device),
        "ws_G": torch.empty(num_heads, rows, head_dim, **f32),
        "ws_QG": torch.empty(num_heads, rows, head_dim, **ops),
        "ws_KD": torch.empty(num_heads, rows, head_dim, **ops),
        "ws_GL": torch.empty(num_heads, chunks, head_dim, **f32),
        "ws_W": torch.empty(num_heads, rows, head_dim, **ops),
        "ws_U": torch.empty(num_heads, rows, head_dim, **f32),
        "ws_Aqk": torch.empty(num_heads, rows, chunk_size, **ops),
    }
    edges = max(SPLIT_RANGES if pipeline == "split" else 0, segments - 1)
    if pipeline == "split":
        workspaces["ws_A"] = torch.empty(num_heads, rows, chunk_size, **f32)
        workspaces["ws_S"] = torch.empty(num_heads, chunks, head_dim, head_dim, **ops)
    if edges:
        workspaces["ws_carry"] = torch.empty(edges, num_heads, head_dim, head_dim, **f32)
    if segments > 1:
        for name in ("ws_trans", "ws_bias", "ws_entry"):
            workspaces[name] = torch.empty(segments - 1, num_heads, head_dim, head_dim, **f32)
    return workspaces


def validate(binding) -> None:
    """Launch the validation prologue: one program writes the error code and chunk offsets,
    then one program per pair of write-slot tiles ORs in the clashes (validate.py)."""
    plan = binding.plan
    meta_capacity = binding.cu_seqlens.numel() - 1
    capacity = plan.caps.max_checkpoints
    kda_validate_kernel[(1,)](
        binding.cu_seqlens, binding.num_seqs, binding.initial_state_indices,
        binding.final_state_indices, binding.checkpoint_offsets,
        binding.checkpoint_state_indices, plan.error_code, plan.workspaces["chunk_offsets"],
        meta_capacity, binding.q.shape[0], binding.state_pool.shape[0],
        CK=capacity, CHUNK=plan.config.chunk_size, BLOCK=VALIDATE_BLOCK, num_warps=4,
    )
    write_tiles = triton.cdiv(meta_capacity * (1 + capacity), VALIDATE_BLOCK)
    kda_clash_kernel[(write_tiles, write_tiles + triton.cdiv(meta_capacity, VALIDATE_BLOCK))](
        binding.initial_state_indices, binding.final_state_indices,
        binding.checkpoint_state_indices, binding.num_seqs, plan.error_code, meta_capacity,
        CK=capacity, BLOCK=VALIDATE_BLOCK, num_warps=4,
    )


def prefill(binding) -> None:
    """Launch stage 1 (per chunk and head; the split pipeline per sub-block and column block
    too), stage 2 (per sequence, V block and head), the interior checkpoints (per checkpoint,
    V block and head, unless the pass forms them: config.checkpoints) and, split, the output
    (per chunk, V block and head)."""
    plan = binding.plan
    caps, config, ws = plan.caps, plan.config, plan.workspaces
    H, K = caps.num_heads, caps.head_dim
    split = config.pipeline == "split"
    meta_capacity = binding.cu_seqlens.numel() - 1
    stride_slots = chunk_slots(caps.max_tokens, caps.max_seqs, config.chunk_size)
    bound_slots = chunk_slots(binding.q.shape[0], meta_capacity, config.chunk_size)
    if config.segments > 1:
        if split:
            _split_stage_one(binding, stride_slots, 0, bound_slots)
        else:
            _fused_stage_one(binding, stride_slots, bound_slots)
        _parallel_segments(binding, stride_slots)
    elif split:
        _split_ranges(binding, stride_slots, bound_slots)
    else:
        _fused_stage_one(binding, stride_slots, bound_slots)
        _state_pass(binding, stride_slots, 0, 0, bound_slots)
    if config.checkpoints == "kernel":
        _checkpoint_kernel(binding, stride_slots)
    if split:
        block_v = min(K, OUTPUT_BLOCK_V)
        kda_output_kernel[(bound_slots, K // block_v, H)](
            binding.out, binding.cu_seqlens, binding.num_seqs, ws["chunk_offsets"],
            ws["ws_QG"], ws["ws_Aqk"], ws["ws_U"], ws["ws_S"], plan.error_code, binding.scale,
            stride_slots, H=H, K=K, V=K, BV=block_v, CHUNK=config.chunk_size,
            DOT_PRECISION=config.dot_precision, UPCAST_DOTS=interpreted(),
            SEARCH_BLOCK=SEARCH_BLOCK, num_warps=config.prepare_warps,
        )


def _checkpoint_kernel(binding, stride_slots: int) -> None:
    """Finish each interior checkpoint the pass staged in its slot (per checkpoint, V block and
    head; config.checkpoints "kernel")."""
    plan = binding.plan
    caps, config, ws = plan.caps, plan.config, plan.workspaces
    H, K = caps.num_heads, caps.head_dim
    meta_capacity = binding.cu_seqlens.numel() - 1
    checkpoint_block_v = min(K, CHECKPOINT_BLOCK_V)
    kda_checkpoint_kernel[(meta_capacity * caps.max_checkpoints, K // checkpoint_block_v, H)](
        binding.k, binding.state_pool, binding.cu_seqlens, binding.num_seqs, ws["chunk_offsets"],
        binding.checkpoint_offsets, binding.checkpoint_state_indices, ws["ws_G"], ws["ws_U"],
        plan.error_code, stride_slots, H=H, K=K, V=K, BV=checkpoint_block_v,
        CHUNK=config.chunk_size, CK=caps.max_checkpoints,
        OPERAND_BF16=config.operand_dtype == "bfloat16", QK_L2NORM=caps.qk_l2norm,
        DOT_PRECISION=config.dot_precision, UPCAST_DOTS=interpreted(),
        num_warps=config.prepare_warps,
    )


def _fused_stage_one(binding, stride_slots: int, bound_slots: int) -> None:
    """The fused pipeline's stage 1: one program per chunk and head (prepare.py)."""
    plan = binding.plan
    caps, config, ws = plan.caps, plan.config, plan.workspaces
    H, K = caps.num_heads, caps.head_dim
    kda_chunk_prepare_kernel[(bound_slots, H)](
        binding.q, binding.k, binding.v, binding.g, binding.beta, binding.cu_seqlens,
        binding.num_seqs, ws["chunk_offsets"], binding.A_log, binding.dt_bias,
        plan.error_code, *(ws[name] for name in KERNEL_WORKSPACES), float(caps.lower_bound),
        stride_slots,
        H=H, K=K, V=K, CHUNK=config.chunk_size, SUB=SUB_CHUNK, GATE=GATE_CODES[caps.gate],
        QK_L2NORM=caps.qk_l2norm, BETA_SIGMOID=caps.beta_sigmoid,
        DOT_PRECISION=config.dot_precision, SEARCH_BLOCK=SEARCH_BLOCK,
        num_warps=config.prepare_warps,
    )


def _state_pass(binding, stride_slots: int, part: int, chunk_lo: int, chunk_hi: int, *,
                parallel: bool = False) -> None:
    """The state pass over global chunks [chunk_lo, chunk_hi), range number `part`: every
    sequence's chunks in that range, from its initial state or the state range part - 1
    left in ws_carry. parallel: every one of `part` ranges at once (segments.py; the chunk
    bounds are cut on the device)."""
    plan = binding.plan
    caps, config, ws = plan.caps, plan.config, plan.workspaces
    H, K = caps.num_heads, caps.head_dim
    meta_capacity = binding.cu_seqlens.numel() - 1
    ranges = part if parallel else 1
    spare = ws["ws_U"]  # stands for the workspaces a variant does not read
    kda_state_pass_kernel[(meta_capacity * ranges, triton.cdiv(K, config.block_v), H)](
        binding.out, binding.state_pool, binding.cu_seqlens,
        binding.num_seqs, ws["chunk_offsets"], binding.initial_state_indices,
        binding.final_state_indices, binding.checkpoint_offsets,
        binding.checkpoint_state_indices, *(ws[name] for name in KERNEL_WORKSPACES),
        *(ws.get(name, spare) for name in ("ws_S", "ws_carry", "ws_entry")),
        plan.error_code, binding.scale, binding.out.shape[0], meta_capacity, stride_slots,
        part, chunk_lo, chunk_hi,
        H=H, K=K, V=K, BV=config.block_v, CHUNK=config.chunk_size, CK=caps.max_checkpoints,
        DOT_PRECISION=config.dot_precision, UPCAST_DOTS=interpreted(),
        SPLIT_OUTPUT=config.pipeline == "split", FILL_ROWS=FILL_ROWS, PARALLEL=parallel,
        CHECKPOINTS_IN_PASS=config.checkpoints == "pass",
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


def _parallel_segments(binding, stride_slots: int) -> None:
    """The state pass in config.segments ranges at once (segments.py): each range's transition
    and offset, the scan over the range edges, then every range's pass from its edge state."""
    plan = binding.plan
    caps, config, ws = plan.caps, plan.config, plan.workspaces
    H, K = caps.num_heads, caps.head_dim
    segments, block = config.segments, config.block_v
    kda_segment_transition_kernel[(segments - 1, 2 * K // block, H)](
        binding.state_pool, ws["chunk_offsets"], binding.num_seqs, binding.initial_state_indices,
        ws["ws_KD"], ws["ws_GL"], ws["ws_W"], ws["ws_U"], ws["ws_trans"], ws["ws_bias"],
        ws["ws_entry"], plan.error_code, stride_slots, segments,
        H=H, K=K, V=K, BV=block, CHUNK=config.chunk_size, DOT_PRECISION=config.dot_precision,
        UPCAST_DOTS=interpreted(), SEARCH_BLOCK=SEARCH_BLOCK,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    kda_segment_scan_kernel[(K // block, H)](
        ws["ws_trans"], ws["ws_bias"], ws["ws_carry"], plan.error_code, segments,
        H=H, K=K, V=K, BV=block, KB=SCAN_ROWS, num_warps=config.num_warps,
    )
    _state_pass(binding, stride_slots, segments, 0, 0, parallel=True)


def _split_ranges(binding, stride_slots: int, bound_slots: int) -> None:
    """The split pipeline's stage 1 and state pass in ranges of chunks (split_range_count):
    on a GPU the pass of one range runs on a side stream while stage 1 makes the next range's
    operands (streams.run_in_ranges), so the serial pass hides behind the parallel work (its
    programs fill only sequences x V blocks x heads SMs). Without a GPU the ranges run one
    after the other."""
    side = _side_stream(binding.q.device)
    capturing = side is not None and torch.cuda.is_current_stream_capturing()
    ranges = split_range_count(bound_slots, binding.cu_seqlens.numel() - 1, capturing)
    streams.run_in_ranges(
        bound_slots, ranges, binding.plan.workspaces["ws_carry"].shape[0],
        lambda lo, hi: _split_stage_one(binding, stride_slots, lo, hi - lo),
        lambda part, lo, hi: _state_pass(binding, stride_slots, part, lo, hi), side)


def split_range_count(bound_slots: int, meta_capacity: int, capturing: bool) -> int:
    """How many ranges the split pipeline cuts `bound_slots` chunks into: one per
    CHUNKS_PER_RANGE_* chunks of a sequence slot, at most SPLIT_RANGES."""
    per_range = CHUNKS_PER_RANGE_CAPTURED if capturing else CHUNKS_PER_RANGE_EAGER
    return streams.range_count(bound_slots, meta_capacity, per_range, SPLIT_RANGES)


def _side_stream(device: torch.device) -> torch.cuda.Stream | None:
    """The device's side stream for the split pipeline's pass; None off CUDA (the
    interpreter)."""
    if device.type != "cuda" or interpreted():
        return None
    return streams.side_stream(device)


def _split_stage_one(binding, stride_slots: int, chunk_base: int, count: int) -> None:
    """The split pipeline's stage 1 for global chunks chunk_base .. chunk_base + count - 1:
    decay, blocks and solve kernels (prepare_blocks.py), with the chunk inverse between the
    last two for config.solve "inverse" (a chunk of one sub-block is its own inverse)."""
    plan = binding.plan
    caps, config, ws = plan.caps, plan.config, plan.workspaces
    H, K = caps.num_heads, caps.head_dim
    located = (binding.cu_seqlens, binding.num_seqs, ws["chunk_offsets"])
    solve_columns = min(K, SOLVE_COLUMNS)
    kda_chunk_decay_kernel[(count, H)](
        binding.g, binding.A_log, binding.dt_bias, *located, plan.error_code, ws["ws_G"],
        ws["ws_GL"], float(caps.lower_bound), stride_slots, chunk_base,
        H=H, K=K, CHUNK=config.chunk_size, GATE=GATE_CODES[caps.gate], SEARCH_BLOCK=SEARCH_BLOCK,
        num_warps=config.prepare_warps,
    )
    kda_chunk_blocks_kernel[(count, H, config.chunk_size // SUB_CHUNK)](
        binding.q, binding.k, binding.beta, *located, plan.error_code, ws["ws_G"], ws["ws_QG"],
        ws["ws_KD"], ws["ws_A"], ws["ws_Aqk"], stride_slots, chunk_base,
        H=H, K=K, CHUNK=config.chunk_size, SUB=SUB_CHUNK, KS=min(K, KEY_SLICE),
        QK_L2NORM=caps.qk_l2norm, BETA_SIGMOID=caps.beta_sigmoid,
        DOT_PRECISION=config.dot_precision, SEARCH_BLOCK=SEARCH_BLOCK, num_warps=BLOCKS_WARPS,
    )
    inverse = config.solve == "inverse"
    if inverse and config.chunk_size > SUB_CHUNK:
        kda_chunk_inverse_kernel[(count, H)](
            *located, plan.error_code, ws["ws_A"], stride_slots, chunk_base,
            CHUNK=config.chunk_size, SUB=SUB_CHUNK, DOT_PRECISION=config.dot_precision,
            SEARCH_BLOCK=SEARCH_BLOCK, num_warps=config.prepare_warps,
        )
    # W and U in separate programs by substitution, together from the inverse
    kda_chunk_solve_kernel[(count, H, (1 if inverse else 2) * K // solve_columns)](
        binding.k, binding.v, binding.beta, *located, plan.error_code, ws["ws_G"], ws["ws_A"],
        ws["ws_W"], ws["ws_U"], stride_slots, chunk_base,
        H=H, K=K, V=K, CHUNK=config.chunk_size, SUB=SUB_CHUNK, BC=solve_columns,
        QK_L2NORM=caps.qk_l2norm, BETA_SIGMOID=caps.beta_sigmoid,
        DOT_PRECISION=config.dot_precision, SEARCH_BLOCK=SEARCH_BLOCK, INVERSE=inverse,
        num_warps=config.prepare_warps,
    )
