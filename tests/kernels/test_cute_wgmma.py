"""`wgmma_bf16` and `smem_descriptor` (kernels/cute/ptx.py) through a one-warpgroup probe
(cute_wgmma_probe.py): on a GPU, D = A B^T against torch's product of the same bf16 values;
without one, the probe compiled for sm_90a, its SASS holding the warpgroup MMA, and the A and
D fragment layouts the wgmma pass assumes held to the DSL's own layouts of that MMA."""

from __future__ import annotations

import math
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


def _evaluate(text: str) -> dict[tuple[int, int], int]:
    """{(thread, value): index} of a CuTe layout printed as 'SHAPE:STRIDE' over (thread,
    value) modes (each mode a number or a tuple of them, column-major)."""
    import ast
    import itertools

    shape, stride = (ast.literal_eval(part) for part in text.split(":"))

    def flat(mode):
        return list(mode) if isinstance(mode, tuple) else [mode]

    def points(sizes, strides):
        for digits in itertools.product(*(range(size) for size in reversed(sizes))):
            digits = digits[::-1]
            index = sum(d * s for d, s in zip(digits, strides, strict=True))
            yield sum(d * math.prod(sizes[:i]) for i, d in enumerate(digits)), index

    table = {}
    for thread, t_index in points(flat(shape[0]), flat(stride[0])):
        for value, v_index in points(flat(shape[1]), flat(stride[1])):
            table[thread, value] = t_index + v_index
    return table


@pytest.mark.parametrize("width", (16, 128))
def test_the_dsl_places_a_and_d_fragments_where_the_pass_assumes(width, capsys):
    """CuTe's own thread-value layouts of the register-A wgmma (an encoding of the PTX ISA's
    fragment tables independent of kernels/cute/ptx.py): thread 32 w + 4 g + t holds, in
    value v, A's and D's element at row 16 w + g + 8 (v // 2 % 2), column 2 t + v % 2 +
    8 (v // 4) (A: 8 values; D: width / 2)."""
    import cutlass
    from cutlass.cute.nvgpu import OperandMajorMode, warpgroup

    @cute.jit
    def show():
        op = warpgroup.MmaF16BF16Op(cutlass.BFloat16, cutlass.Float32, (64, width, 16),
                                    warpgroup.OperandSource.RMEM, OperandMajorMode.K,
                                    OperandMajorMode.K)
        atom = cute.make_mma_atom(op)
        print("A", atom.tv_layout_A)
        print("C", atom.tv_layout_C)

    cute.compile(show, options="--gpu-arch sm_90a")
    printed = dict(line.split(" ", 1) for line in capsys.readouterr().out.splitlines()
                   if line[:2] in ("A ", "C "))
    for name, values in (("A", 8), ("C", width // 2)):
        table = _evaluate(printed[name].strip())
        assert len(table) == 128 * values
        for (thread, value), index in table.items():
            warp, lane = divmod(thread, 32)
            row = 16 * warp + lane // 4 + 8 * (value // 2 % 2)
            col = 2 * (lane % 4) + value % 2 + 8 * (value // 4)
            assert index == row + 64 * col, (name, thread, value)
