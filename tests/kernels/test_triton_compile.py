"""Every Triton kernel compiles for the device without a GPU, as the device's JIT would.

The interpreter tests run the kernels as Python, so a kernel can pass them all and still fail
to compile for the device (a branch whose arms return different types is one such case): this
drives the launch in a subprocess without TRITON_INTERPRET and compiles each launched kernel
(tests/kernels/triton_offline_compile.py), with no device time. For sm_90 (H200): fused and
split configs (both solves of stage 1), both capacities, every gate mode, qk_l2norm, parallel
segments. For sm_121 (GB10, which has no tuning profile): the heuristic's configs, within its
99 KB of shared memory per program.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kdabench.kernels.config import SHARED_MEMORY_BUDGET_BYTES

SCRIPT = Path(__file__).with_name("triton_offline_compile.py")
KERNELS = {"kda_validate_kernel", "kda_clash_kernel", "kda_chunk_prepare_kernel",
           "kda_state_pass_kernel", "kda_checkpoint_kernel", "kda_chunk_decay_kernel",
           "kda_chunk_blocks_kernel", "kda_chunk_solve_kernel", "kda_output_kernel",
           "kda_segment_transition_kernel", "kda_segment_scan_kernel",
           "kda_chunk_inverse_kernel"}
H200_SHARED_BYTES = 227 * 1024


def compile_offline(*args: str) -> list[dict]:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def failures(results: list[dict]) -> str:
    return "\n".join(f"{r['kernel']} {r['constexprs']}: {r['error']}" for r in results
                     if r.get("error"))


@pytest.fixture(scope="module")
def sm90() -> list[dict]:
    return compile_offline("90")


def test_every_launched_kernel_compiles_for_sm90(sm90):
    assert not failures(sm90), failures(sm90)
    assert {r["kernel"] for r in sm90} == KERNELS


def test_compiled_kernels_fit_the_shared_memory_of_an_h200(sm90):
    """The launch would fail on the device past 227 KB per program (registers cannot: the
    compiler spills instead)."""
    over = [r for r in sm90 if r["shared_bytes"] > H200_SHARED_BYTES]
    assert not over, over


def test_heuristic_kernels_compile_for_sm121_within_a_gb10s_shared_memory():
    results = compile_offline("121", "--heuristic")
    assert not failures(results), failures(results)
    assert {"kda_validate_kernel", "kda_state_pass_kernel"} <= {r["kernel"] for r in results}
    over = [r for r in results if r["shared_bytes"] > SHARED_MEMORY_BUDGET_BYTES]
    assert not over, over
