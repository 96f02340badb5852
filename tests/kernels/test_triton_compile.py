"""Every Triton kernel compiles for sm_90 without a GPU, as the device's JIT would compile it.

The interpreter tests run the kernels as Python, so a kernel can pass them all and still fail
to compile for the device (a branch whose arms return different types is one such case): this
drives the launch for fused and split configs (both capacities, every gate mode, qk_l2norm)
in a subprocess without TRITON_INTERPRET and compiles each launched kernel for sm_90
(tests/kernels/triton_sm90_compile.py), with no device time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("triton_sm90_compile.py")
KERNELS = {"kda_validate_kernel", "kda_chunk_prepare_kernel", "kda_state_pass_kernel",
           "kda_checkpoint_kernel", "kda_chunk_decay_kernel", "kda_chunk_blocks_kernel",
           "kda_chunk_solve_kernel", "kda_output_kernel"}
H200_SHARED_BYTES = 227 * 1024


@pytest.fixture(scope="module")
def compiled() -> list[dict]:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_every_launched_kernel_compiles_for_sm90(compiled):
    failures = [f"{r['kernel']} {r['constexprs']}: {r['error']}" for r in compiled
                if r.get("error")]
    assert not failures, "\n".join(failures)
    assert {r["kernel"] for r in compiled} == KERNELS


def test_compiled_kernels_fit_the_shared_memory_of_an_h200(compiled):
    """The launch would fail on the device past 227 KB per program (registers cannot: the
    compiler spills instead)."""
    over = [r for r in compiled if r["shared_bytes"] > H200_SHARED_BYTES]
    assert not over, over
