"""The KDA prefill API: Caps -> plan -> bind -> run, and the functional kda_prefill.

The plan is validated once and owns every workspace (error code, live sequence count, a default
output); a binding holds tensors; run() reads only device tensors, so a bound run can be
captured in a CUDA graph once and replayed with new lengths, offsets and slot indices.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch

from . import contract
from .catalog import config_problems
from .config import Caps, CuteConfig, KernelConfig
from .contract import (
    AUTO_BACKEND,
    BACKENDS,
    CAPACITIES,
    GATE_MODES,
    HEAD_DIMS,
    MIN_LOWER_BOUND,
    NULL_SLOT,
    VALIDATION_MODES,
    KdaMetadataError,
    decode_error_code,
)
from .cute import launch as cute_launch
from .policy import EXPLICIT_SOURCE, PolicyMode, Resolution, resolve_config, resolve_mode
from .triton import launch


def _dtypes(names: tuple[str, ...]) -> tuple[torch.dtype, ...]:
    return tuple(getattr(torch, name) for name in names)


INDEX_DTYPES = _dtypes(contract.INDEX_DTYPES)
ACTIVATION_DTYPES = _dtypes(contract.ACTIVATION_DTYPES)
STATE_DTYPES = _dtypes((contract.STATE_DTYPE,))
CODE_DTYPE = getattr(torch, contract.CODE_DTYPE)


class KdaConfigError(ValueError):
    """A plan or binding that cannot be honoured (bad caps, shapes, dtypes or devices)."""


class KdaResult(NamedTuple):
    """Output [T, H, V] and the int32 device error code (0 = accepted)."""

    o: torch.Tensor
    error_code: torch.Tensor

    def raise_for_error(self) -> None:
        """Synchronise and raise KdaMetadataError if the metadata was rejected."""
        code = int(self.error_code.item())
        if code:
            raise KdaMetadataError(code)

    def message(self) -> str:
        """The decoded error code (synchronises)."""
        return decode_error_code(int(self.error_code.item()))


@dataclass(frozen=True)
class Plan:
    """A validated, frozen plan; it owns the workspaces every run of it uses.

    config: the kernel config it runs with; config_source: where that came from, one line
    ("explicit", "profile nvidia-h200.json (query v1 ...)", "heuristic (no profile entry for
    query v1 ...)"); policy_mode: the mode it was resolved under.
    """

    caps: Caps
    device: torch.device
    config: KernelConfig | CuteConfig
    config_source: str
    interpreter: bool
    error_code: torch.Tensor = field(repr=False)
    num_seqs: torch.Tensor = field(repr=False)
    output: torch.Tensor | None = field(repr=False)
    workspaces: dict[str, torch.Tensor] = field(repr=False)
    policy_mode: str = PolicyMode.AUTO.value


@dataclass(frozen=True)
class Binding:
    """Tensors bound to a plan. Metadata tensors may be rewritten in place between runs."""

    plan: Plan
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    state_pool: torch.Tensor
    cu_seqlens: torch.Tensor
    num_seqs: torch.Tensor
    initial_state_indices: torch.Tensor
    final_state_indices: torch.Tensor
    checkpoint_offsets: torch.Tensor
    checkpoint_state_indices: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    out: torch.Tensor
    scale: float

    def set_num_seqs(self, num_seqs: int) -> None:
        """Set the live sequence count (a device write; do it outside graph capture)."""
        self.num_seqs.fill_(num_seqs)


@dataclass(frozen=True)
class Backend:
    """What the API does differently per backend: its config type and the checks,
    allocations and launches behind plan(), bind() and run()."""

    config_type: type
    wrong_config: str  # completes "the <name> backend ... (got <config>)"
    device_ineligibility: Callable[[torch.device], list[str]]
    config_problems: Callable[[KernelConfig | CuteConfig, int], list[str]]
    allocate_workspaces: Callable[[Caps, KernelConfig | CuteConfig, torch.device],
                                  dict[str, torch.Tensor]]
    binding_problems: Callable[[Binding], list[str]]
    run: Callable[[Binding], None]


def _triton_workspaces(caps: Caps, config: KernelConfig,
                       device: torch.device) -> dict[str, torch.Tensor]:
    return launch.allocate_workspaces(caps.num_heads, caps.head_dim, caps.max_tokens,
                                      caps.max_seqs, config.chunk_size, device,
                                      config.operand_dtype, config.pipeline, config.segments)


def _triton_run(binding: Binding) -> None:
    launch.validate(binding)
    launch.prefill(binding)


BACKEND_TABLE: dict[str, Backend] = {
    "triton": Backend(
        config_type=KernelConfig,
        wrong_config="needs a KernelConfig",
        device_ineligibility=launch.device_ineligibility,
        config_problems=config_problems,
        allocate_workspaces=_triton_workspaces,
        binding_problems=lambda binding: [],
        run=_triton_run,
    ),
    "cute": Backend(
        config_type=CuteConfig,
        wrong_config="takes no Triton config",
        device_ineligibility=lambda device: cute_launch.device_ineligibility(_concrete(device)),
        config_problems=cute_launch.config_problems,
        allocate_workspaces=cute_launch.allocate_workspaces,
        binding_problems=cute_launch.binding_problems,
        run=cute_launch.run,
    ),
}


def ineligibility(caps: Caps) -> list[str]:
    """Reasons the kernel cannot run these caps on their device (empty when it can)."""
    reasons = []
    if caps.backend not in BACKEND_TABLE and caps.backend != AUTO_BACKEND:
        reasons.append(f"backend {caps.backend!r} is not available "
                       f"(have: {', '.join(BACKEND_TABLE)}, or {AUTO_BACKEND!r})")
    if caps.head_dim not in HEAD_DIMS:
        reasons.append(f"head_dim {caps.head_dim} unsupported (K = V in {HEAD_DIMS})")
    if caps.max_checkpoints not in CAPACITIES:
        reasons.append(f"max_checkpoints {caps.max_checkpoints} unsupported (one of {CAPACITIES})")
    if caps.gate not in GATE_MODES:
        reasons.append(f"gate {caps.gate!r} unknown (one of {', '.join(GATE_MODES)})")
    if caps.validation not in VALIDATION_MODES:
        reasons.append(f"validation {caps.validation!r} unknown (one of {VALIDATION_MODES})")
    if not (MIN_LOWER_BOUND <= caps.lower_bound < 0):
        reasons.append(
            f"lower_bound {caps.lower_bound} outside [{MIN_LOWER_BOUND}, 0): the kernel anchors "
            "each 16-token sub-block at its first row, and exp(-cumulative gate) over 16 tokens "
            "stays inside fp32 only for gates >= -5"
        )
    for name in ("num_heads", "max_tokens", "max_seqs", "max_state_slots"):
        if getattr(caps, name) < 1:
            reasons.append(f"{name} must be >= 1, got {getattr(caps, name)}")
    backend = BACKENDS[0] if caps.backend == AUTO_BACKEND else caps.backend  # auto's fallback
    if backend in BACKEND_TABLE:
        reasons.extend(BACKEND_TABLE[backend].device_ineligibility(torch.device(caps.device)))
    return reasons


def plan(
    caps: Caps,
    config: KernelConfig | None = None,
    *,
    policy_mode: str | PolicyMode | None = None,
    activation_dtype: torch.dtype = torch.bfloat16,
    profile_dir: str | os.PathLike | None = None,
    own_output: bool = True,
) -> Plan:
    """Validate caps once, resolve the kernel config, and allocate the plan's workspaces.

    config: an explicit KernelConfig (config_source "explicit"); None resolves one through
    the policy catalog (kernels/policy.py) under policy_mode: "AUTO" (the device's profile
    entry, else the heuristic), "HEURISTIC_ONLY" or "PREPLANNED_ONLY" (KdaPolicyError when
    no profile entry matches); default $KDABENCH_POLICY_MODE, else AUTO.
    activation_dtype: the dtype of q, k, v the plan will be bound to (part of the query).
    profile_dir: the profile folder (default $KDABENCH_PROFILE_DIR, else the packaged one).
    own_output: allocate a bf16 output of the full capacity for bindings that bring none.
    """
    reasons = ineligibility(caps)
    if reasons:
        raise KdaConfigError("cannot plan this KDA prefill: " + "; ".join(reasons))
    device = _concrete(torch.device(caps.device))
    mode = resolve_mode(policy_mode)
    if config is not None:
        source = EXPLICIT_SOURCE
        if caps.backend == AUTO_BACKEND:
            caps = replace(caps, backend="cute" if isinstance(config, CuteConfig) else "triton")
    else:
        resolved = _resolved(caps, device, activation_dtype, mode, profile_dir)
        caps = replace(caps, backend=resolved.backend)
        config, source = resolved.config, resolved.source
    backend = BACKEND_TABLE[caps.backend]
    if not isinstance(config, backend.config_type):
        raise KdaConfigError(f"the {caps.backend} backend {backend.wrong_config} (got {config})")
    problems = backend.config_problems(config, caps.head_dim)
    if problems:
        raise KdaConfigError(f"kernel config ({source}) cannot run head_dim "
                             f"{caps.head_dim}: " + "; ".join(problems))
    return Plan(
        caps=caps,
        device=device,
        config=config,
        config_source=source,
        interpreter=launch.interpreted(),
        error_code=torch.zeros(1, dtype=CODE_DTYPE, device=device),
        num_seqs=torch.zeros(1, dtype=CODE_DTYPE, device=device),
        output=torch.empty(caps.max_tokens, caps.num_heads, caps.head_dim,
                           dtype=torch.bfloat16, device=device) if own_output else None,
        workspaces=backend.allocate_workspaces(caps, config, device),
        policy_mode=mode.value,
    )


def _resolved(caps: Caps, device: torch.device, activation_dtype: torch.dtype,
              mode: PolicyMode, profile_dir: str | os.PathLike | None) -> Resolution:
    """The policy's config and backend; where "auto" resolves to a backend that cannot run on
    this device, the Triton config of the same query, its source saying why."""
    resolved = resolve_config(caps, activation_dtype=activation_dtype, mode=mode,
                              directory=profile_dir)
    if caps.backend != AUTO_BACKEND or resolved.backend == BACKENDS[0]:
        return resolved
    blocked = BACKEND_TABLE[resolved.backend].device_ineligibility(device)
    if not blocked:
        return resolved
    fallback = resolve_config(replace(caps, backend=BACKENDS[0]),
                              activation_dtype=activation_dtype, mode=mode,
                              directory=profile_dir)
    return replace(fallback, source=f"{fallback.source}; the profile's {resolved.backend} "
                                    f"backend cannot run here: {'; '.join(blocked)}")


def _concrete(device: torch.device) -> torch.device:
    """cuda -> cuda:<current index>, so that device checks compare like with like."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise KdaConfigError(message)


def _check_tensor(name: str, t: torch.Tensor, shape: tuple, dtypes: tuple, device) -> None:
    _require(isinstance(t, torch.Tensor), f"{name} must be a tensor")
    _require(t.device == device, f"{name} is on {t.device}, the plan on {device}")
    _require(tuple(t.shape) == shape, f"{name} has shape {tuple(t.shape)}, expected {shape}")
    _require(t.dtype in dtypes, f"{name} has dtype {t.dtype}, expected one of {dtypes}")
    _require(t.is_contiguous(), f"{name} must be contiguous")


def _checkpoint_metadata(
    caps: Caps, offsets: torch.Tensor | None, indices: torch.Tensor | None, n: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checkpoint metadata as [n, C]; vector [n] for capacity 1; inactive (null slot) when
    absent."""
    cap = caps.max_checkpoints
    if offsets is None and indices is None:
        inactive = torch.full(contract.checkpoint_shape(n, cap, vector=False), NULL_SLOT,
                              dtype=INDEX_DTYPES[0], device=device)
        return torch.ones_like(inactive), inactive
    _require(offsets is not None and indices is not None,
             "checkpoint_offsets and checkpoint_state_indices go together")
    shape = contract.checkpoint_shape(n, cap, vector=offsets.dim() == 1)
    _check_tensor("checkpoint_offsets", offsets, shape, INDEX_DTYPES, device)
    _check_tensor("checkpoint_state_indices", indices, shape, INDEX_DTYPES, device)
    return offsets, indices


def bind(
    plan: Plan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    state_pool: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state_indices: torch.Tensor,
    final_state_indices: torch.Tensor,
    checkpoint_offsets: torch.Tensor | None = None,
    checkpoint_state_indices: torch.Tensor | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    scale: float | None = None,
    num_seqs: int | torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> Binding:
    """Check shapes, dtypes and devices once (host-side, no sync) and bind the tensors.

    q, k [T, H, K], v [T, H, V] (T <= max_tokens), g [T, H, K], beta [T, H]; state_pool fp32
    [slots, H, V, K]; cu_seqlens [M + 1] with M <= max_seqs the metadata capacity; index and
    checkpoint tensors [M] ([M, C] for capacity C > 1). num_seqs: the live sequence count
    (default M), an int written into the plan's workspace now, or a caller's int32 device tensor.
    """
    caps, device = plan.caps, plan.device
    H, D = caps.num_heads, caps.head_dim
    _require(q.dim() == 3, f"q must be [T, H, K], got shape {tuple(q.shape)}")
    T = q.shape[0]
    _require(T <= caps.max_tokens, f"{T} tokens bound, the plan allows {caps.max_tokens}")
    shapes = contract.token_shapes(T, H, D)
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        _check_tensor(name, t, shapes[name], ACTIVATION_DTYPES, device)
    _require(state_pool.dim() == 4, "state_pool must be [slots, H, V, K]")
    slots = state_pool.shape[0]
    _require(slots <= caps.max_state_slots,
             f"state_pool has {slots} slots, the plan allows {caps.max_state_slots}")
    _check_tensor("state_pool", state_pool, contract.state_pool_shape(slots, H, D), STATE_DTYPES,
                  device)
    _require(cu_seqlens.dim() == 1 and cu_seqlens.numel() >= 2,
             "cu_seqlens must be [N + 1] with N >= 1")
    m = cu_seqlens.numel() - 1
    _require(m <= caps.max_seqs, f"{m} sequences bound, the plan allows {caps.max_seqs}")
    _check_tensor("cu_seqlens", cu_seqlens, (m + 1,), INDEX_DTYPES, device)
    _check_tensor("initial_state_indices", initial_state_indices, (m,), INDEX_DTYPES, device)
    _check_tensor("final_state_indices", final_state_indices, (m,), INDEX_DTYPES, device)
    ck_offsets, ck_indices = _checkpoint_metadata(
        caps, checkpoint_offsets, checkpoint_state_indices, m, device
    )
    if caps.gate == "precomputed":
        A_log = dt_bias = g  # unused by the kernel; any valid pointer will do
    else:
        _require(A_log is not None and dt_bias is not None,
                 f"gate {caps.gate!r} needs A_log [H] and dt_bias [H, K]")
        gate_shapes = contract.gate_parameter_shapes(H, D)
        _check_tensor("A_log", A_log, gate_shapes["A_log"], ACTIVATION_DTYPES, device)
        dt_bias = dt_bias.reshape(H, D) if dt_bias.numel() == H * D else dt_bias
        _check_tensor("dt_bias", dt_bias, gate_shapes["dt_bias"], ACTIVATION_DTYPES, device)
    if out is None:
        _require(plan.output is not None, "this plan owns no output: pass out=")
        out = plan.output[:T]
    _check_tensor("out", out, shapes["out"], ACTIVATION_DTYPES, device)
    if isinstance(num_seqs, torch.Tensor):
        _check_tensor("num_seqs", num_seqs, (1,), (CODE_DTYPE,), device)
        live = num_seqs
    else:
        live = plan.num_seqs
        live.fill_(m if num_seqs is None else int(num_seqs))
    binding = Binding(
        plan=plan, q=q, k=k, v=v, g=g, beta=beta, state_pool=state_pool,
        cu_seqlens=cu_seqlens, num_seqs=live, initial_state_indices=initial_state_indices,
        final_state_indices=final_state_indices, checkpoint_offsets=ck_offsets,
        checkpoint_state_indices=ck_indices, A_log=A_log, dt_bias=dt_bias, out=out,
        scale=float(D ** -0.5 if scale is None else scale),
    )
    problems = BACKEND_TABLE[caps.backend].binding_problems(binding)
    _require(not problems, f"cannot bind to the {caps.backend} backend: " + "; ".join(problems))
    return binding


def run(binding: Binding) -> KdaResult:
    """Validate the metadata on the device, then run the prefill; no host sync, no allocation."""
    BACKEND_TABLE[binding.plan.caps.backend].run(binding)
    return KdaResult(binding.out, binding.plan.error_code)


def kda_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    state_pool: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state_indices: torch.Tensor,
    final_state_indices: torch.Tensor,
    checkpoint_offsets: torch.Tensor | None = None,
    checkpoint_state_indices: torch.Tensor | None = None,
    scale: float | None = None,
    gate: str = "precomputed",
    lower_bound: float = MIN_LOWER_BOUND,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    qk_l2norm: bool = False,
    beta_sigmoid: bool = False,
    out: torch.Tensor | None = None,
    policy_mode: str | None = None,
    backend: str = AUTO_BACKEND,
    config: KernelConfig | CuteConfig | None = None,
) -> KdaResult:
    """KDA chunked prefill over a packed batch, exporting interior checkpoints into the pool.

    Shapes: q, k [T, H, K] and v [T, H, V] (bf16), K = V in {64, 128}; g [T, H, K] fp32 log
    decay (gate="precomputed", every value >= lower_bound) or the raw gate (gate="sigmoid" or
    "softplus", fused with A_log [H] and dt_bias [H, K]); beta [T, H] (post-sigmoid, or logits
    with beta_sigmoid=True); state_pool fp32 [slots, H, V, K], updated in place; cu_seqlens int
    [N + 1]; initial/final_state_indices int [N] (-1: zero initial state / no final write).
    Checkpoints: offsets and slot indices [N] (capacity 1) or [N, C] (C = 2 or 4); entry (n, c)
    writes the state after the first `offset` tokens of sequence n (1 <= offset <= len - 1) into
    slot `index`; -1 marks an inactive entry. Returns KdaResult(o [T, H, V], error_code): on
    bad metadata the error code has its bits set, o is all NaN and the pool is untouched.
    policy_mode: how the kernel config is resolved ("AUTO", "HEURISTIC_ONLY",
    "PREPLANNED_ONLY"; default $KDABENCH_POLICY_MODE, else AUTO), as in plan().
    backend: "auto" (default: the backend the device's profile measured fastest for this
    query, else Triton), "triton" or "cute" (the CuTe DSL kernels, CUDA only).
    config: an explicit config for that backend (as plan()'s); None: the policy's.
    """
    if checkpoint_offsets is None:
        capacity = 1
    else:
        capacity = 1 if checkpoint_offsets.dim() == 1 else checkpoint_offsets.shape[1]
    caps = Caps(
        device=q.device,
        num_heads=q.shape[1],
        head_dim=q.shape[2],
        max_tokens=max(q.shape[0], 1),
        max_seqs=max(cu_seqlens.numel() - 1, 1),
        max_state_slots=max(state_pool.shape[0], 1),
        max_checkpoints=capacity,
        gate=gate,
        lower_bound=lower_bound,
        qk_l2norm=qk_l2norm,
        beta_sigmoid=beta_sigmoid,
        backend=backend,
    )
    planned = plan(caps, config, policy_mode=policy_mode, activation_dtype=q.dtype,
                   own_output=False)
    if out is None:
        out = torch.empty(v.shape, dtype=v.dtype if v.dtype in ACTIVATION_DTYPES
                          else torch.bfloat16, device=v.device)
    binding = bind(
        planned, q, k, v, g, beta, state_pool=state_pool, cu_seqlens=cu_seqlens,
        initial_state_indices=initial_state_indices, final_state_indices=final_state_indices,
        checkpoint_offsets=checkpoint_offsets, checkpoint_state_indices=checkpoint_state_indices,
        A_log=A_log, dt_bias=dt_bias, scale=scale, out=out,
    )
    return run(binding)
