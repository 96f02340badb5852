"""`wgmma_bf16` and `smem_descriptor` (kernels/cute/ptx.py) through a one-warpgroup probe
(cute_wgmma_probe.py): on a GPU, D = A B^T against torch's product of the same bf16 values;
without one, the probe compiled for sm_90a, its SASS holding the warpgroup MMA."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

cute = pytest.importorskip("kdabench.kernels.cute.compile").cute  # the DSL, or skip

WIDTHS = (16, 32, 128)  # N: the pass's token tiles (16) and its key tiles (32 to 128)


def _fake_args(width: int) -> list:
    import cutlass
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream
    from cutlass.cute.typing import sym_int64

    flat = [make_fake_compact_tensor(cutlass.Float32, (sym_int64(),)) for _ in range(3)]
    return [*flat, make_fake_stream(use_tvm_ffi_env_stream=True), width]


def _cuobjdump() -> str | None:
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else shutil.which("cuobjdump")


@pytest.mark.parametrize("width", (16, 128))
def test_probe_compiles_to_warpgroup_mma_for_sm_90a(width, tmp_path):
    import cute_wgmma_probe

    cute.compile(cute_wgmma_probe.probe, *_fake_args(width),
                 options=f"--enable-tvm-ffi --gpu-arch sm_90a --keep-cubin --dump-dir {tmp_path}")
    cubins = list(tmp_path.glob("*.sm_90a.cubin"))
    assert len(cubins) == 1
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump to read the SASS")
    sass = subprocess.run([tool, "-sass", str(cubins[0])], check=True, capture_output=True,
                          text=True).stdout
    assert f"HGMMA.64x{width}x16.F32.BF16" in sass


@pytest.mark.gpu
@pytest.mark.parametrize("width", WIDTHS)
def test_probe_matches_torch(width, seed):
    import cute_wgmma_probe

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma runs on sm_90 only")
    generator = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(64, 16, device="cuda", generator=generator)
    b = torch.randn(width, 16, device="cuda", generator=generator)
    d = torch.full((64, width), float("nan"), device="cuda")
    function = cute.compile(cute_wgmma_probe.probe, *_fake_args(width),
                            options="--enable-tvm-ffi")
    function(a.reshape(-1), b.reshape(-1), d.reshape(-1))
    torch.cuda.synchronize()
    expected = a.bfloat16().double() @ b.bfloat16().double().T
    assert (d.double() - expected).abs().max().item() <= 1e-5 * expected.abs().max().item()
