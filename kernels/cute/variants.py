"""The compiled functions of the cute backend: one per kernel and specialisation, named by key.

A variant fixes what the DSL compiles as constants (head dim, checkpoint capacity, gate mode,
the transforms) and the element types of its tensors; sizes stay symbolic. `aot_variants(arch)`
lists what `kdabench build-kernels` compiles ahead of time: bf16 activations with fp32 gates,
beta, A_log and dt_bias (what serving engines pass). Other dtypes need the DSL at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..contract import CAPACITIES, GATE_MODES, HEAD_DIMS

KERNELS = ("validate", "prepare", "state_pass", "chunk_index", "chunk_prep", "chunk_pass",
           "chunk_wgmma_pass")
# CuteConfig.algorithm: the kernels after validate ("wgmma": the chunk algorithm, its pass on
# warpgroup MMA, built for WGMMA_ARCHS only)
ALGORITHMS = ("chunk", "recurrence", "wgmma")
WGMMA_ARCHS = ("sm_90a",)
CHUNK_PASS_WARPS = 1  # blocks of 16 V columns per block of the chunk pass
KEY_SPLITS = (1, 2, 4, 8)  # CuteConfig.key_split: warps sharing one block of 16 V columns
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


def _transforms(head_dim: int, gate: str, qk_l2norm: bool,
                beta_sigmoid: bool) -> tuple[tuple[str, int], ...]:
    return (("K", head_dim), ("GATE", GATE_MODES.index(gate)), ("L2", int(qk_l2norm)),
            ("BSIG", int(beta_sigmoid)))


def _input_dtypes(q: torch.dtype, g: torch.dtype, beta: torch.dtype,
                  gate_params: torch.dtype) -> tuple[tuple[str, str], ...]:
    return (("qk", dtype_name(q)), ("g", dtype_name(g)), ("beta", dtype_name(beta)),
            ("gp", dtype_name(gate_params)))


def prepare_variant(head_dim: int, gate: str, qk_l2norm: bool, beta_sigmoid: bool,
                    q: torch.dtype, g: torch.dtype, beta: torch.dtype,
                    gate_params: torch.dtype) -> Variant:
    return Variant("prepare", _transforms(head_dim, gate, qk_l2norm, beta_sigmoid),
                   _input_dtypes(q, g, beta, gate_params))


def state_pass_variant(head_dim: int, capacity: int, v: torch.dtype,
                       out: torch.dtype) -> Variant:
    return Variant("state_pass", (("K", head_dim), ("CK", capacity)),
                   (("v", dtype_name(v)), ("out", dtype_name(out))))


def chunk_index_variant() -> Variant:
    return Variant("chunk_index", (), ())


def chunk_prep_variant(head_dim: int, gate: str, qk_l2norm: bool, beta_sigmoid: bool,
                       q: torch.dtype, g: torch.dtype, beta: torch.dtype,
                       gate_params: torch.dtype, v: torch.dtype,
                       wgmma: bool = False) -> Variant:
    """The chunk preparation applies the input transforms itself (no prepare kernel); for the
    wgmma pass (constant WG1) it writes its operands in that pass's layout."""
    constants = _transforms(head_dim, gate, qk_l2norm, beta_sigmoid)
    return Variant("chunk_prep", constants + ((("WG", 1),) if wgmma else ()),
                   (*_input_dtypes(q, g, beta, gate_params), ("v", dtype_name(v))))


def key_split_divides(key_split: int, head_dim: int) -> bool:
    """Whether key_split warps can share the head dim's K / 16 key steps evenly."""
    return (head_dim // 16) % key_split == 0


def chunk_pass_variant(head_dim: int, capacity: int, out: torch.dtype,
                       key_split: int) -> Variant:
    return Variant("chunk_pass", (("K", head_dim), ("CK", capacity), ("W", CHUNK_PASS_WARPS),
                                  ("S", key_split)), (("out", dtype_name(out)),))


def chunk_wgmma_pass_variant(head_dim: int, capacity: int, out: torch.dtype) -> Variant:
    return Variant("chunk_wgmma_pass", (("K", head_dim), ("CK", capacity)),
                   (("out", dtype_name(out)),))


def aot_variants(arch: str) -> list[Variant]:
    """Every variant `kdabench build-kernels` compiles for `arch` (79; 109 with the wgmma
    pass's, on WGMMA_ARCHS)."""
    wgmma = arch in WGMMA_ARCHS
    variants = [validate_variant(c) for c in CAPACITIES] + [chunk_index_variant()]
    for k in HEAD_DIMS:
        for gate in GATE_MODES:
            for l2 in (False, True):
                for bsig in (False, True):
                    variants.append(prepare_variant(k, gate, l2, bsig, AOT_ACTIVATION, AOT_GATE,
                                                    AOT_GATE, AOT_GATE))
                    for layout in (False, True) if wgmma else (False,):
                        variants.append(chunk_prep_variant(k, gate, l2, bsig, AOT_ACTIVATION,
                                                           AOT_GATE, AOT_GATE, AOT_GATE,
                                                           AOT_ACTIVATION, layout))
        for c in CAPACITIES:
            variants.append(state_pass_variant(k, c, AOT_ACTIVATION, AOT_ACTIVATION))
            variants += [chunk_pass_variant(k, c, AOT_ACTIVATION, s) for s in KEY_SPLITS
                         if key_split_divides(s, k)]
            if wgmma:
                variants.append(chunk_wgmma_pass_variant(k, c, AOT_ACTIVATION))
    return variants
