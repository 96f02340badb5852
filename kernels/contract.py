"""The kernel contract, importable without torch, Triton, CuTe or a GPU.

What a caller may ask of the KDA prefill (backends, head dims, checkpoint capacities, gate and
validation modes, the smallest log decay), the shapes and dtypes (by name) of the tensors it
binds, the null slot index, and the error bits of the device-side metadata validation with
their host-side decoding. The kernels, the oracles and the harness read these from here.
"""

from __future__ import annotations

import enum

BACKENDS = ("triton", "cute")
AUTO_BACKEND = "auto"  # Caps.backend default: the profile entry's backend, else BACKENDS[0]
HEAD_DIMS = (64, 128)  # K = V
CAPACITIES = (1, 2, 4)  # checkpoints per sequence; 1 also takes vector metadata [N]
GATE_MODES = ("precomputed", "sigmoid", "softplus")
VALIDATION_MODES = ("device",)
MIN_LOWER_BOUND = -5.0  # the smallest log decay a caller may guarantee
NULL_SLOT = -1  # a slot index that names no slot: zero initial state, no write

ACTIVATION_DTYPES = ("bfloat16", "float16", "float32")  # q, k, v, g, beta, A_log, dt_bias, out
INDEX_DTYPES = ("int32", "int64")  # cu_seqlens, slot indices, checkpoint offsets
STATE_DTYPE = "float32"  # the state pool
CODE_DTYPE = "int32"  # the error code and the live sequence count


def token_shapes(tokens: int, heads: int, head_dim: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the per-token tensors: q, k, v, g and out [T, H, K] (K = V), beta [T, H]."""
    full = (tokens, heads, head_dim)
    return {"q": full, "k": full, "v": full, "g": full, "beta": (tokens, heads), "out": full}


def gate_parameter_shapes(heads: int, head_dim: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the fused gate's parameters: A_log [H], dt_bias [H, K]."""
    return {"A_log": (heads,), "dt_bias": (heads, head_dim)}


def state_pool_shape(slots: int, heads: int, head_dim: int) -> tuple[int, ...]:
    """The state pool: [slots, H, V, K]."""
    return (slots, heads, head_dim, head_dim)


def checkpoint_shape(seqs: int, capacity: int, vector: bool) -> tuple[int, ...]:
    """Checkpoint offsets and slot indices: [N, C], or [N] for capacity 1 given as a vector."""
    return (seqs,) if capacity == 1 and vector else (seqs, capacity)


class MetadataFault(enum.IntFlag):
    """Bits of the int32 error code written by the validation prologue (0 = accepted)."""

    DUPLICATE_WRITE_SLOT = 1 << 0
    MALFORMED_LENGTHS = 1 << 1
    SLOT_OUT_OF_RANGE = 1 << 2
    BAD_CHECKPOINT_OFFSET = 1 << 3


FAULT_SENTENCES: dict[MetadataFault, str] = {
    MetadataFault.DUPLICATE_WRITE_SLOT: (
        "a destination slot is written twice in one call, or a write slot aliases another "
        "sequence's initial-state slot"
    ),
    MetadataFault.MALFORMED_LENGTHS: (
        "cu_seqlens is malformed: it must start at 0, never decrease, end within the bound "
        "token capacity, and the live sequence count must lie in 1..max_seqs"
    ),
    MetadataFault.SLOT_OUT_OF_RANGE: (
        f"a state slot index lies outside [0, num_slots) and is not the null index {NULL_SLOT}"
    ),
    MetadataFault.BAD_CHECKPOINT_OFFSET: (
        "an active checkpoint offset lies outside 1..len-1 of its sequence, or the active "
        "offsets of a sequence are not strictly increasing"
    ),
}


class KdaMetadataError(ValueError):
    """Raised on the host when a call's error code is non-zero."""

    def __init__(self, code: int) -> None:
        self.code = int(code)
        super().__init__(decode_error_code(self.code))


def decode_error_code(code: int) -> str:
    """Turn an error code into one readable sentence (or 'accepted' for 0)."""
    code = int(code)
    if code == 0:
        return "accepted"
    parts = [
        f"{fault.name} (bit {fault.value.bit_length() - 1}): {sentence}"
        for fault, sentence in FAULT_SENTENCES.items()
        if code & fault.value
    ]
    unknown = code & ~sum(int(f) for f in MetadataFault)
    if unknown:
        parts.append(f"unknown bits 0x{unknown:x}")
    return (
        f"metadata rejected (error code {code}); the state pool is unchanged and the output "
        "is NaN: " + "; ".join(parts)
    )
