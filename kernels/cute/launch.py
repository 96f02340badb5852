"""Launching the cute backend's kernels for a binding, and the workspaces they need.

Metadata is copied into the plan's int64 workspaces first (so one compiled variant serves
int32 and int64 callers), the error code is zeroed, then validate and the algorithm's kernels
(CuteConfig.algorithm: the recurrence's input transforms and state pass, or the chunk index,
the chunk preparation with the transforms folded in, and the pass on `mma.sync` or, "wgmma",
on warpgroup MMA, per range of chunk slots)
run on torch's current stream, a ranged call's passes on a side stream joined before it
returns: no host sync, no allocation, capturable in a CUDA graph.
"""

from __future__ import annotations

import torch

from .. import streams
from ..config import Caps, CuteConfig
from .runtime import library_for
from .variants import (
    ALGORITHMS,
    CHUNK,
    KEY_SPLITS,
    WGMMA_ARCHS,
    chunk_index_variant,
    chunk_pass_variant,
    chunk_prep_variant,
    chunk_wgmma_pass_variant,
    key_split_divides,
    prepare_variant,
    state_pass_variant,
    validate_variant,
)

MIN_CAPABILITY = (8, 0)
# The chunk algorithm's preparation and pass run over ranges of chunk slots, each range's pass
# on a side stream overlapping the next range's preparation (kernels/NOTES.md, cute v7). H100,
# key split 4, graph replay: two ranges take 7-9% off one long sequence (8192, 32768 and 65536
# tokens at 8 heads); four or eight gain less or lose (the pass slows beside the preparation);
# at 4 sequences of 2048 two ranges cost 26% (a range's pass holds fewer sequences); eager,
# two ranges lost at 8192 and 65536 tokens. So: two ranges under capture where a sequence slot
# holds at least CHUNKS_PER_RANGE chunks per range, else one; RANGES edge states (chunk_carry's
# rows) bound what a caller may force.
RANGES = 8
POLICY_RANGES = 2
CHUNKS_PER_RANGE = 256


def device_ineligibility(device: torch.device) -> list[str]:
    """Reasons the cute backend cannot run on this device (empty when it can)."""
    if device.type != "cuda":
        return [f"the cute backend runs on CUDA devices only, not {device.type!r}"]
    if not torch.cuda.is_available():
        return ["no CUDA device is available"]
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return [f"compute capability {capability[0]}.{capability[1]} is below 8.0"]
    _, reasons = library_for(device)
    return reasons


def origin(device: torch.device) -> str:
    """Where this device's kernels come from: 'aot <folder> (...)' or 'jit (...)'."""
    library, reasons = library_for(device)
    return library.origin if library is not None else "unavailable: " + "; ".join(reasons)


def config_problems(config: CuteConfig, head_dim: int) -> list[str]:
    """Why `config` names no cute kernel for this head dim (empty when it does)."""
    problems = []
    if config.algorithm not in ALGORITHMS:
        problems.append(f"algorithm {config.algorithm!r} must be one of {ALGORITHMS}")
    if config.key_split not in KEY_SPLITS:
        problems.append(f"key_split {config.key_split} must be one of {KEY_SPLITS}")
    elif not key_split_divides(config.key_split, head_dim):
        problems.append(f"key_split {config.key_split} does not divide the {head_dim // 16} "
                        f"key steps of 16 at head_dim {head_dim}")
    return problems


def chunk_slots(tokens: int, seqs: int) -> int:
    """An upper bound on a batch's 16-token chunks: sum ceil(len / 16) <= T / 16 + N."""
    return (tokens + CHUNK - 1) // CHUNK + seqs


def _chunk_workspaces(caps: Caps, device: torch.device) -> dict[str, torch.Tensor]:
    """Per (chunk, head): W and kd as split bf16 pairs, qg and A_qk as bf16 pairs (int32, in
    the pass's operand order), U (in the pass's accumulator order) and e^G_last [K] in fp32;
    per (sequence, checkpoint, head): an interior checkpoint's key records (as kd) and e^G_p;
    the chunk index; per range edge, the state carried across it ([RANGES, H, V, K])."""
    units = chunk_slots(caps.max_tokens, caps.max_seqs) * caps.num_heads
    checkpoints = caps.max_seqs * caps.max_checkpoints * caps.num_heads
    k = caps.head_dim
    i32 = {"dtype": torch.int32, "device": device}
    f32 = {"dtype": torch.float32, "device": device}
    return {
        "chunk_W": torch.empty(units * CHUNK * k, **i32),
        "chunk_QG": torch.empty(units * CHUNK * k // 2, **i32),
        "chunk_KD": torch.empty(units * CHUNK * k, **i32),
        "chunk_A": torch.empty(units * CHUNK * CHUNK // 2, **i32),
        "chunk_U": torch.empty(units * CHUNK * k, **f32),
        "chunk_GL": torch.empty(units * k, **f32),
        "checkpoint_K": torch.empty(checkpoints * CHUNK * k, **i32),
        "checkpoint_G": torch.empty(checkpoints * k, **f32),
        "chunk_index": torch.zeros(caps.max_seqs + 1, dtype=torch.int64, device=device),
        # the state where one range's pass leaves the sequence across its end edge
        "chunk_carry": torch.empty(RANGES * caps.num_heads * k * k, **f32),
    }


def allocate_workspaces(caps: Caps, config: CuteConfig,
                        device: torch.device) -> dict[str, torch.Tensor]:
    """int64 metadata; the recurrence's fp32 transformed inputs [T, H, K] (q, k, the decay)
    and [T, H] (beta), or the chunk algorithm's workspaces."""
    rows = caps.max_tokens * caps.num_heads
    f32 = {"dtype": torch.float32, "device": device}
    i64 = {"dtype": torch.int64, "device": device}
    metadata = caps.max_seqs * caps.max_checkpoints
    if config.algorithm != "recurrence":
        inputs = _chunk_workspaces(caps, device)
    else:
        inputs = {name: torch.empty(rows * caps.head_dim, **f32) for name in ("wq", "wk", "wd")}
        inputs["wb"] = torch.empty(rows, **f32)
    return {**inputs,
        "cu": torch.zeros(caps.max_seqs + 1, **i64),
        "init": torch.zeros(caps.max_seqs, **i64),
        "final": torch.zeros(caps.max_seqs, **i64),
        "ck_off": torch.zeros(metadata, **i64),
        "ck_idx": torch.zeros(metadata, **i64),
    }


def _variants(binding):
    """validate, then the algorithm's kernels, in launch order."""
    caps = binding.plan.caps
    transforms = (caps.head_dim, caps.gate, caps.qk_l2norm, caps.beta_sigmoid, binding.q.dtype,
                  binding.g.dtype, binding.beta.dtype, binding.A_log.dtype)
    validate = validate_variant(caps.max_checkpoints)
    if binding.plan.config.algorithm == "chunk":
        return (validate, chunk_index_variant(),
                chunk_prep_variant(*transforms, binding.v.dtype),
                chunk_pass_variant(caps.head_dim, caps.max_checkpoints, binding.out.dtype,
                                   binding.plan.config.key_split))
    if binding.plan.config.algorithm == "wgmma":
        return (validate, chunk_index_variant(),
                chunk_prep_variant(*transforms, binding.v.dtype, wgmma=True),
                chunk_wgmma_pass_variant(caps.head_dim, caps.max_checkpoints,
                                         binding.out.dtype))
    return (validate, prepare_variant(*transforms),
            state_pass_variant(caps.head_dim, caps.max_checkpoints, binding.v.dtype,
                               binding.out.dtype))


def binding_problems(binding) -> list[str]:
    """Why this binding's dtypes have no compiled function here (empty when they all do)."""
    problems = []
    if binding.q.dtype != binding.k.dtype:
        problems.append(f"q is {binding.q.dtype} and k {binding.k.dtype}: the cute backend "
                        "needs one dtype for both")
    if binding.A_log.dtype != binding.dt_bias.dtype:
        problems.append(f"A_log is {binding.A_log.dtype} and dt_bias {binding.dt_bias.dtype}: "
                        "the cute backend needs one dtype for both")
    if problems:
        return problems
    library, reasons = library_for(binding.plan.device)
    if library is None:
        return reasons
    if binding.plan.config.algorithm == "wgmma" and library.arch not in WGMMA_ARCHS:
        return [f"the wgmma pass runs on {', '.join(WGMMA_ARCHS)} only, not {library.arch}"]
    try:
        variants = _variants(binding)
    except ValueError as exc:
        return [str(exc)]
    return [why for why in map(library.missing, variants) if why]


def run(binding) -> None:
    """Copy the metadata, zero the code, and launch validate and the algorithm's kernels."""
    plan = binding.plan
    caps, ws = plan.caps, plan.workspaces
    library, reasons = library_for(plan.device)
    if library is None:
        raise RuntimeError("; ".join(reasons))
    import tvm_ffi

    validate, *algorithm = (library.function(v) for v in _variants(binding))
    m, c = binding.cu_seqlens.numel() - 1, caps.max_checkpoints
    cu, init, final = ws["cu"][: m + 1], ws["init"][:m], ws["final"][:m]
    ck_off, ck_idx = ws["ck_off"][: m * c], ws["ck_idx"][: m * c]
    cu.copy_(binding.cu_seqlens)
    init.copy_(binding.initial_state_indices)
    final.copy_(binding.final_state_indices)
    ck_off.copy_(binding.checkpoint_offsets.reshape(-1))
    ck_idx.copy_(binding.checkpoint_state_indices.reshape(-1))
    plan.error_code.zero_()
    metadata = (cu, binding.num_seqs, init, final, ck_off, ck_idx)
    with tvm_ffi.use_torch_stream():
        validate(*metadata, plan.error_code, m, binding.q.shape[0], binding.state_pool.shape[0])
        if plan.config.algorithm == "recurrence":
            _run_recurrence(binding, algorithm, metadata)
        else:
            _run_chunked(binding, algorithm, metadata)


def _inputs(binding) -> tuple[torch.Tensor, ...]:
    """q, k, g, beta, A_log and dt_bias, flat, as the input transforms take them."""
    return (binding.q.view(-1), binding.k.view(-1), binding.g.view(-1), binding.beta.view(-1),
            binding.A_log.view(-1), binding.dt_bias.view(-1))


def _run_recurrence(binding, kernels, metadata) -> None:
    """The input transforms into fp32 workspaces, then the token-by-token state pass."""
    prepare, state_pass = kernels
    plan = binding.plan
    ws, H, m = plan.workspaces, plan.caps.num_heads, binding.cu_seqlens.numel() - 1
    tokens = binding.q.shape[0]
    transformed = (ws["wq"], ws["wk"], ws["wd"], ws["wb"])
    if tokens:
        prepare(*_inputs(binding), *transformed, tokens * H, H, binding.scale,
                float(plan.caps.lower_bound))
    state_pass(binding.v.view(-1), binding.out.view(-1), binding.state_pool.view(-1),
               *transformed, *metadata, plan.error_code, H, binding.out.shape[0], m)


def range_count(slots: int, meta_capacity: int, capturing: bool) -> int:
    """How many ranges the chunk algorithm cuts `slots` chunk slots into: under CUDA-graph
    capture one per CHUNKS_PER_RANGE chunks of a sequence slot, at most POLICY_RANGES; eager,
    one."""
    return streams.range_count(slots, meta_capacity, CHUNKS_PER_RANGE if capturing else None,
                               POLICY_RANGES)


def _run_chunked(binding, kernels, metadata) -> None:
    """The chunk index, then per range of chunk slots (range_count) the preparation of every
    (chunk, head) in it from the raw inputs and its pass, each pass on the side stream where
    there are several (streams.run_in_ranges)."""
    import tvm_ffi

    index, prep, chunk_pass = kernels
    plan = binding.plan
    ws, H, m = plan.workspaces, plan.caps.num_heads, binding.cu_seqlens.numel() - 1
    tokens = binding.q.shape[0]
    cu, live, ck_off, ck_idx = metadata[0], metadata[1], metadata[4], metadata[5]
    co = ws["chunk_index"][: m + 1]
    chunk_ws = (ws["chunk_W"].view(-1, 4), ws["chunk_QG"].view(-1, 2),
                ws["chunk_KD"].view(-1, 4), ws["chunk_A"].view(-1, 2),
                ws["chunk_U"].view(-1, 8), ws["chunk_GL"].view(-1, 2),
                ws["checkpoint_K"].view(-1, 4), ws["checkpoint_G"].view(-1, 2))
    index(cu, live, plan.error_code, co)
    slots = chunk_slots(tokens, m)
    ranges = range_count(slots, m, torch.cuda.is_current_stream_capturing()) if tokens else 1
    q, k, g, beta, a_log, dt_bias = _inputs(binding)

    def prepare(chunk_lo: int, chunk_hi: int) -> None:
        if tokens:
            prep(q, k, binding.v.view(-1), g, beta, a_log, dt_bias, cu, live,
                 plan.error_code, co, ck_off, ck_idx, *chunk_ws, H, plan.caps.max_checkpoints,
                 chunk_lo, chunk_hi - chunk_lo, binding.scale, float(plan.caps.lower_bound))

    def run_pass(edge: int, chunk_lo: int, chunk_hi: int) -> None:
        chunk_pass(binding.out.view(-1), binding.state_pool.view(-1), ws["chunk_carry"],
                   *metadata, plan.error_code, co, *chunk_ws, H, binding.out.shape[0], m,
                   edge, chunk_lo, chunk_hi)

    streams.run_in_ranges(slots, ranges, RANGES, prepare, run_pass,
                          streams.side_stream(binding.q.device),
                          lambda side: tvm_ffi.use_torch_stream(torch.cuda.stream(side)))
