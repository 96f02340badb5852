"""The compiled functions of the cute backend: one per kernel and specialisation, named by key.

A variant fixes what the DSL compiles as constants (head dim, checkpoint capacity, gate mode,
the transforms) and the element types of its tensors; sizes stay symbolic. `aot_variants()`
lists what `kdabench build-kernels` compiles ahead of time: bf16 activations with fp32 gates,
beta, A_log and dt_bias (what serving engines pass). Other dtypes need the DSL at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..contract import CAPACITIES, GATE_MODES, HEAD_DIMS

KERNELS = ("validate", "prepare", "state_pass", "chunk_index", "chunk_prep", "chunk_pass")
ALGORITHMS = ("chunk", "recurrence")  # CuteConfig.algorithm: the kernels after validate
CHUNK_PASS_WARPS = 1  # warps per block of the chunk pass, each owning 16 V columns
CHUNK = 16  # the chunk algorithm's tokens per chunk (kernels/cute/chunk_source.py)
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32",
               torch.int32: "i32", torch.int64: "i64"}
AOT_ACTIVATION = torch.bfloat16
AOT_GATE = torch.float32


@dataclass(frozen=True)
class Variant:
    """One compiled function: `kernel` specialised by `constants`, over tensors of `dtypes`."""

    kernel: str
    constants: tuple[tuple[str, int], ...]
    dtypes: tuple[tuple[str, str], ...]

    @property
    def name(self) -> str:
        """The exported symbol, e.g. kda_state_pass_K128_CK4_v_bf16_out_bf16."""
        parts = [f"kda_{self.kernel}"]
        parts += [f"{key}{value}" for key, value in self.constants]
        parts += [f"{key}_{value}" for key, value in self.dtypes]
        return "_".join(parts)


def dtype_name(dtype: torch.dtype) -> str:
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"the cute backend has no variant for dtype {dtype}")
    return DTYPE_NAMES[dtype]


def validate_variant(capacity: int) -> Variant:
    return Variant("validate", (("CK", capacity),), ())


def prepare_variant(head_dim: int, gate: str, qk_l2norm: bool, beta_sigmoid: bool,
                    q: torch.dtype, g: torch.dtype, beta: torch.dtype,
                    gate_params: torch.dtype, log_decay: bool = False) -> Variant:
    """log_decay: write the log decay g (the chunk algorithm) instead of exp(g)."""
    constants = (("K", head_dim), ("GATE", GATE_MODES.index(gate)),
                 ("L2", int(qk_l2norm)), ("BSIG", int(beta_sigmoid)), ("LOG", int(log_decay)))
    dtypes = (("qk", dtype_name(q)), ("g", dtype_name(g)), ("beta", dtype_name(beta)),
              ("gp", dtype_name(gate_params)))
    return Variant("prepare", constants, dtypes)


def state_pass_variant(head_dim: int, capacity: int, v: torch.dtype,
                       out: torch.dtype) -> Variant:
    return Variant("state_pass", (("K", head_dim), ("CK", capacity)),
                   (("v", dtype_name(v)), ("out", dtype_name(out))))


def chunk_index_variant() -> Variant:
    return Variant("chunk_index", (), ())


def chunk_prep_variant(head_dim: int, v: torch.dtype) -> Variant:
    return Variant("chunk_prep", (("K", head_dim),), (("v", dtype_name(v)),))


def chunk_pass_variant(head_dim: int, capacity: int, out: torch.dtype) -> Variant:
    return Variant("chunk_pass", (("K", head_dim), ("CK", capacity), ("W", CHUNK_PASS_WARPS)),
                   (("out", dtype_name(out)),))


def aot_variants() -> list[Variant]:
    """Every variant `kdabench build-kernels` compiles (66 per architecture)."""
    variants = [validate_variant(c) for c in CAPACITIES] + [chunk_index_variant()]
    for k in HEAD_DIMS:
        for gate in GATE_MODES:
            for l2 in (False, True):
                for bsig in (False, True):
                    for log in (False, True):
                        variants.append(prepare_variant(k, gate, l2, bsig, AOT_ACTIVATION,
                                                        AOT_GATE, AOT_GATE, AOT_GATE, log))
        variants.append(chunk_prep_variant(k, AOT_ACTIVATION))
        for c in CAPACITIES:
            variants.append(state_pass_variant(k, c, AOT_ACTIVATION, AOT_ACTIVATION))
            variants.append(chunk_pass_variant(k, c, AOT_ACTIVATION))
    return variants
