"""Compile, without a GPU, every Triton kernel the launch runs for a few configs.

    python triton_offline_compile.py [ARCH] [--heuristic]

ARCH is the compute capability as a number (90: H200, the default; 121: GB10). --heuristic
compiles what a device without a tuning profile runs: the heuristic's config for each row's
caps instead of the row's config.

Run as a script in a process without TRITON_INTERPRET (the interpreter executes the kernels
as Python and never compiles them, so a kernel that the interpreter runs can still fail to
compile for the device). The launch is driven on CPU tensors with JITFunction.run replaced by
a recorder; each recorded call is compiled with the signature its arguments give (pointers
16-byte aligned, as the device's JIT specialises them). Prints one JSON line per distinct
compile: kernel, constexprs, registers, spilled bytes, shared memory, or the error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

POINTER_TYPES = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.float16: "*fp16",
                 torch.int32: "*i32", torch.int64: "*i64"}
CONFIGS = [  # (pipeline, chunk, block_v, stages, operand dtype, capacity, gate, norms, segments,
    #          solve, checkpoints)
    ("fused", 16, 32, 3, "bfloat16", 4, "precomputed", False, 1, "substitution", "kernel"),
    ("fused", 64, 16, 3, "bfloat16", 1, "softplus", True, 1, "substitution", "kernel"),
    ("split", 64, 16, 3, "bfloat16", 4, "precomputed", False, 1, "substitution", "kernel"),
    ("split", 16, 32, 3, "bfloat16", 1, "sigmoid", True, 1, "substitution", "kernel"),
    ("split", 64, 16, 1, "float32", 4, "precomputed", False, 1, "substitution", "kernel"),
    ("split", 64, 16, 3, "bfloat16", 4, "precomputed", False, 8, "substitution", "kernel"),
    ("fused", 16, 32, 3, "bfloat16", 1, "precomputed", False, 4, "substitution", "kernel"),
    ("split", 64, 16, 3, "bfloat16", 4, "precomputed", False, 1, "inverse", "kernel"),
    ("split", 32, 32, 3, "bfloat16", 1, "sigmoid", True, 1, "inverse", "kernel"),
    ("fused", 16, 32, 3, "bfloat16", 4, "precomputed", False, 1, "substitution", "pass"),
    ("fused", 16, 16, 3, "bfloat16", 4, "softplus", True, 1, "substitution", "pass"),
    ("split", 16, 32, 3, "bfloat16", 4, "precomputed", False, 8, "inverse", "pass"),
]


def _recorded_launches(config_row, heuristic: bool) -> list[tuple]:
    from kdabench.inputs import make_inputs
    from kdabench.kernels import Caps, KernelConfig, bind, plan
    from kdabench.kernels.triton import launch

    (pipeline, chunk, block_v, stages, operand, capacity, gate, norms, segments, solve,
     checkpoints) = config_row
    heads, dim, lengths = 2, 128, [150, 70]
    x = make_inputs(lengths, heads, dim, gate=gate, qk_l2norm=norms, beta_sigmoid=norms, seed=0)
    caps = Caps(device="cpu", num_heads=heads, head_dim=dim, max_tokens=sum(lengths),
                max_seqs=len(lengths), max_state_slots=16, max_checkpoints=capacity, gate=gate,
                qk_l2norm=norms, beta_sigmoid=norms)
    config = KernelConfig(chunk_size=chunk, block_v=block_v, num_stages=stages,
                          operand_dtype=operand, pipeline=pipeline, segments=segments,
                          solve=solve, checkpoints=checkpoints)
    offsets = torch.tensor([[1, 40, 64, 100], [5, 16, 33, 69]], dtype=torch.int32)
    slots = torch.tensor([[2, 3, 4, 5], [6, 7, 8, 9]], dtype=torch.int32)
    metadata = {"cu_seqlens": torch.tensor([0, 150, 220], dtype=torch.int32),
                "initial_state_indices": torch.tensor([0, 1], dtype=torch.int32),
                "final_state_indices": torch.tensor([10, 11], dtype=torch.int32),
                "checkpoint_offsets": offsets[:, :capacity].contiguous(),
                "checkpoint_state_indices": slots[:, :capacity].contiguous()}
    if capacity == 1:
        metadata["checkpoint_offsets"] = offsets[:, 0].contiguous()
        metadata["checkpoint_state_indices"] = slots[:, 0].contiguous()
    pool = torch.zeros(16, heads, dim, dim)
    planned = plan(caps, policy_mode="HEURISTIC_ONLY") if heuristic else plan(caps, config)
    binding = bind(planned, x.q, x.k, x.v, x.g, x.beta, state_pool=pool, A_log=x.A_log,
                   dt_bias=x.dt_bias, **metadata)
    calls: list[tuple] = []
    JITFunction.run = lambda self, *args, grid, warmup, **kwargs: calls.append((self, args, kwargs))
    launch.validate(binding)
    launch.prefill(binding)
    return calls


def _spec(fn: JITFunction, args: tuple, kwargs: dict) -> dict:
    """The compile request of one recorded launch: signature, constexprs, alignment, options."""
    options = {key: kwargs.pop(key) for key in ("num_warps", "num_stages") if key in kwargs}
    values = dict(zip(fn.arg_names, args, strict=False)) | kwargs
    signature, constexprs, attrs = {}, {}, {}
    for index, name in enumerate(fn.arg_names):
        value = values[name]
        if index in fn.constexprs:
            signature[name] = "constexpr"
            constexprs[name] = value
        elif isinstance(value, torch.Tensor):
            signature[name] = POINTER_TYPES[value.dtype]
            attrs[index] = True
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i64" if abs(int(value)) >= 2**31 else "i32"
    return {"module": fn.fn.__module__, "name": fn.fn.__name__, "signature": signature,
            "constexprs": constexprs, "aligned": sorted(attrs), "options": options}


def _compile(spec: dict, arch: int) -> dict:
    module = sys.modules.get(spec["module"]) or __import__(spec["module"], fromlist=["_"])
    fn = getattr(module, spec["name"])
    names = fn.arg_names
    source = ASTSource(
        fn=fn, signature=spec["signature"],
        constexprs={(names.index(k),): v for k, v in spec["constexprs"].items()},
        attrs={(i,): [["tt.divisibility", 16]] for i in spec["aligned"]})
    result = {"kernel": spec["name"], "constexprs": spec["constexprs"], **spec["options"]}
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                  options=spec["options"])
    except Exception as error:  # noqa: BLE001 - every failure is the finding to report
        return result | {"error": f"{type(error).__name__}: {error}"[:2000]}
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([cuobjdump, "--dump-resource-usage", cubin.name],
                               capture_output=True, text=True, check=False).stdout
    registers = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    return result | {"registers": int(registers.group(1)) if registers else None,
                     "stack_bytes": int(stack.group(1)) if stack else None,
                     "shared_bytes": compiled.metadata.shared}


def main(argv: list[str]) -> None:
    from kdabench.kernels.triton import launch

    arch = int(next((a for a in argv if a.isdigit()), 90))
    heuristic = "--heuristic" in argv
    launch.device_ineligibility = lambda device: []
    specs: dict[str, dict] = {}
    for row in CONFIGS:
        for fn, args, kwargs in _recorded_launches(row, heuristic):
            spec = _spec(fn, args, dict(kwargs))
            specs.setdefault(json.dumps(spec, sort_keys=True, default=str), spec)
    with ProcessPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for result in pool.map(_compile, specs.values(), [arch] * len(specs)):
            print(json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
