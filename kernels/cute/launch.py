"""Launching the cute backend's kernels for a binding, and the workspaces they need.

Metadata is copied into the plan's int64 workspaces first (so one compiled variant serves
int32 and int64 callers), the error code is zeroed, then validate, prepare and the state pass
run on torch's current stream: no host sync, no allocation, capturable in a CUDA graph.
"""

from __future__ import annotations

import torch

from ..config import Caps
from .runtime import library_for
from .variants import prepare_variant, state_pass_variant, validate_variant

MIN_CAPABILITY = (8, 0)


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


def allocate_workspaces(caps: Caps, device: torch.device) -> dict[str, torch.Tensor]:
    """fp32 transformed inputs [T, H, K] (q, k, exp(g)) and [T, H] (beta), int64 metadata."""
    rows = caps.max_tokens * caps.num_heads
    f32 = {"dtype": torch.float32, "device": device}
    i64 = {"dtype": torch.int64, "device": device}
    metadata = caps.max_seqs * caps.max_checkpoints
    return {
        "wq": torch.empty(rows * caps.head_dim, **f32),
        "wk": torch.empty(rows * caps.head_dim, **f32),
        "wd": torch.empty(rows * caps.head_dim, **f32),
        "wb": torch.empty(rows, **f32),
        "cu": torch.zeros(caps.max_seqs + 1, **i64),
        "init": torch.zeros(caps.max_seqs, **i64),
        "final": torch.zeros(caps.max_seqs, **i64),
        "ck_off": torch.zeros(metadata, **i64),
        "ck_idx": torch.zeros(metadata, **i64),
    }


def _variants(binding):
    caps = binding.plan.caps
    gate_params = binding.A_log.dtype
    return (
        validate_variant(caps.max_checkpoints),
        prepare_variant(caps.head_dim, caps.gate, caps.qk_l2norm, caps.beta_sigmoid,
                        binding.q.dtype, binding.g.dtype, binding.beta.dtype, gate_params),
        state_pass_variant(caps.head_dim, caps.max_checkpoints, binding.v.dtype,
                           binding.out.dtype),
    )


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
    try:
        variants = _variants(binding)
    except ValueError as exc:
        return [str(exc)]
    return [why for why in map(library.missing, variants) if why]


def run(binding) -> None:
    """Copy the metadata, zero the code, and launch validate, prepare and the state pass."""
    plan = binding.plan
    caps, ws = plan.caps, plan.workspaces
    library, reasons = library_for(plan.device)
    if library is None:
        raise RuntimeError("; ".join(reasons))
    import tvm_ffi

    validate, prepare, state_pass = (library.function(v) for v in _variants(binding))
    m, c, H = binding.cu_seqlens.numel() - 1, caps.max_checkpoints, caps.num_heads
    cu, init, final = ws["cu"][: m + 1], ws["init"][:m], ws["final"][:m]
    ck_off, ck_idx = ws["ck_off"][: m * c], ws["ck_idx"][: m * c]
    cu.copy_(binding.cu_seqlens)
    init.copy_(binding.initial_state_indices)
    final.copy_(binding.final_state_indices)
    ck_off.copy_(binding.checkpoint_offsets.reshape(-1))
    ck_idx.copy_(binding.checkpoint_state_indices.reshape(-1))
    plan.error_code.zero_()
    metadata = (cu, binding.num_seqs, init, final, ck_off, ck_idx)
    tokens = binding.q.shape[0]
    transformed = (ws["wq"], ws["wk"], ws["wd"], ws["wb"])
    with tvm_ffi.use_torch_stream():
        validate(*metadata, plan.error_code, m, tokens, binding.state_pool.shape[0])
        if tokens:
            prepare(binding.q.view(-1), binding.k.view(-1), binding.g.view(-1),
                    binding.beta.view(-1), binding.A_log.view(-1), binding.dt_bias.view(-1),
                    *transformed, tokens * H, H, binding.scale, float(caps.lower_bound))
        state_pass(binding.v.view(-1), binding.out.view(-1), binding.state_pool.view(-1),
                   *transformed, *metadata, plan.error_code, H, binding.out.shape[0], m)
