"""Compile one variant with the CuTe DSL (needs nvidia-cutlass-dsl; no GPU).

Arguments are described by fake tensors (flat, symbolic 64-bit extent) and the stream is the
TVM-FFI environment stream, so the compiled function takes torch tensors and launches on
torch's current stream (CUDA-graph capture included).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream
from cutlass.cute.typing import sym_int64

from . import chunk_source, source, wgmma_source
from .variants import Variant

_ELEMENT = {"bf16": cutlass.BFloat16, "f16": cutlass.Float16, "f32": cutlass.Float32,
            "i32": cutlass.Int32, "i64": cutlass.Int64}
I64, I32, F32 = _ELEMENT["i64"], _ELEMENT["i32"], _ELEMENT["f32"]


def dsl_version() -> str:
    """The CuTe DSL's version, as the DSL reports it (whichever distribution installed it)."""
    return cutlass.__version__


def _flat(element) -> object:
    return make_fake_compact_tensor(element, (sym_int64(),))


def _rows(element, width: int) -> object:
    """[rows, width] row-major, 16-byte aligned: a row is one vector load or store."""
    return make_fake_compact_tensor(element, (sym_int64(), width), stride_order=(1, 0),
                                    assumed_align=16)


def _transform_constants(const: dict) -> list:
    """K, the gate mode and the two transform flags, as the kernels take them."""
    return [const["K"], const["GATE"], bool(const["L2"]), bool(const["BSIG"])]


def _arguments(variant: Variant) -> tuple[object, list]:
    """(the @cute.jit function, its example arguments) for a variant."""
    const = dict(variant.constants)
    dt = {key: _ELEMENT[value] for key, value in variant.dtypes}
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    i64 = cutlass.Int64(0)
    if variant.kernel == "validate":
        tensors = [_flat(I64), _flat(I32), _flat(I64), _flat(I64), _flat(I64), _flat(I64),
                   _flat(I32)]
        return source.kda_validate, [*tensors, i64, i64, i64, stream, const["CK"]]
    if variant.kernel == "prepare":
        tensors = [_flat(dt["qk"]), _flat(dt["qk"]), _flat(dt["g"]), _flat(dt["beta"]),
                   _flat(dt["gp"]), _flat(dt["gp"]), _flat(F32), _flat(F32), _flat(F32),
                   _flat(F32)]
        return source.kda_prepare, [*tensors, i64, i64, cutlass.Float32(0),
                                    cutlass.Float32(0), stream, *_transform_constants(const)]
    if variant.kernel == "state_pass":
        tensors = [_flat(dt["v"]), _flat(dt["out"]), _flat(F32), _flat(F32), _flat(F32),
                   _flat(F32), _flat(F32), _flat(I64), _flat(I32), _flat(I64), _flat(I64),
                   _flat(I64), _flat(I64), _flat(I32)]
        return source.kda_state_pass, [*tensors, i64, i64, i64, stream, const["K"],
                                       const["CK"]]
    if variant.kernel == "chunk_index":
        return chunk_source.kda_chunk_index, [_flat(I64), _flat(I32), _flat(I32), _flat(I64),
                                              stream]
    # the chunk workspaces: W, qg, kd, A_qk (rows of int32 bf16 pairs, one vector access
    # each), U (rows of 8 fp32), e^G_last (fp32 pairs), and each interior checkpoint's key
    # records (as kd) and e^G_p (as e^G_last)
    chunk_ws = [_rows(I32, 4), _rows(I32, 2), _rows(I32, 4), _rows(I32, 2), _rows(F32, 8),
                _rows(F32, 2), _rows(I32, 4), _rows(F32, 2)]
    metadata = [_flat(I64), _flat(I32), _flat(I32), _flat(I64)]  # cu, live, err, chunk index
    checkpoints = [_flat(I64), _flat(I64)]  # offsets, slots
    if variant.kernel == "chunk_prep":
        inputs = [_flat(dt["qk"]), _flat(dt["qk"]), _flat(dt["v"]), _flat(dt["g"]),
                  _flat(dt["beta"]), _flat(dt["gp"]), _flat(dt["gp"])]
        return chunk_source.kda_chunk_prep, [*inputs, *metadata, *checkpoints, *chunk_ws, i64,
                                             i64, i64, i64, cutlass.Float32(0),
                                             cutlass.Float32(0), stream,
                                             *_transform_constants(const),
                                             bool(const.get("WG", 0))]
    if variant.kernel == "chunk_pass":
        tensors = [_flat(dt["out"]), _flat(F32), _flat(F32), _flat(I64), _flat(I32),
                   _flat(I64), _flat(I64), *checkpoints, _flat(I32), _flat(I64), *chunk_ws]
        return chunk_source.kda_chunk_pass, [*tensors, i64, i64, i64, i64, i64, i64, stream,
                                             const["K"], const["CK"], const["W"], const["S"]]
    if variant.kernel == "chunk_wgmma_pass":
        tensors = [_flat(dt["out"]), _flat(F32), _flat(F32), _flat(I64), _flat(I32),
                   _flat(I64), _flat(I64), *checkpoints, _flat(I32), _flat(I64), *chunk_ws]
        return wgmma_source.kda_chunk_wgmma_pass, [*tensors, i64, i64, i64, i64, i64, i64,
                                                   stream, const["K"], const["CK"]]
    raise ValueError(f"unknown kernel {variant.kernel!r}")


def compile_variant(variant: Variant, arch: str | None = None):
    """The compiled TVM-FFI function of `variant` for `arch` (sm_90a, sm_121a; None: the GPU's)."""
    function, args = _arguments(variant)
    options = "--enable-tvm-ffi" + (f" --gpu-arch {arch}" if arch else "")
    return cute.compile(function, *args, options=options)
