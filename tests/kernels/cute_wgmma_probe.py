"""A one-warpgroup kernel that runs `wgmma_bf16` once: D = A B^T for A [64, 16] and B [N, 16]
(fp32 in global memory, rounded to bf16), B staged in shared memory in the canonical K-major
layout of `smem_descriptor`. The GPU test holds it to torch's product; the CPU test compiles it
for sm_90a."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import warpgroup
from cutlass.memory import SmemAllocator

from kdabench.kernels.cute.ptx import pack_bf16x2, smem_descriptor, wgmma_bf16

CORE = 128  # bytes of one 8 x 8 bf16 core matrix
LEADING = CORE  # the two core matrices of a row block along K (16 elements) side by side
STRIDE = 2 * CORE  # then the next 8 rows


@cute.kernel
def probe_kernel(a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, N: cutlass.Constexpr):
    tid = Int64(cute.arch.thread_idx()[0])
    lane = tid % 32
    warp = tid // 32
    g = lane // 4
    t2 = lane % 4 * 2
    smem = SmemAllocator()
    sB = smem.allocate_tensor(Int32, cute.make_layout(N * 8), byte_alignment=128)
    for word in cutlass.range(tid, N * 8, 128):  # word = (n, k pair)
        n = word // 8
        k = word % 8 * 2
        at = n // 8 * (STRIDE // 4) + k // 8 * (LEADING // 4) + n % 8 * 4 + k % 8 // 2
        sB[at] = pack_bf16x2(b[n * 16 + k], b[n * 16 + k + 1])
    cute.arch.sync_threads()
    cute.arch.fence_proxy("async.shared", space="cta")
    row = warp * 16 + g
    a0 = pack_bf16x2(a[row * 16 + t2], a[row * 16 + t2 + 1])
    a1 = pack_bf16x2(a[(row + 8) * 16 + t2], a[(row + 8) * 16 + t2 + 1])
    a2 = pack_bf16x2(a[row * 16 + t2 + 8], a[row * 16 + t2 + 9])
    a3 = pack_bf16x2(a[(row + 8) * 16 + t2 + 8], a[(row + 8) * 16 + t2 + 9])
    acc = [Float32(0.0) for _ in range(N // 2)]
    desc = smem_descriptor(sB.iterator.toint(), LEADING, STRIDE)
    warpgroup.fence()
    acc = wgmma_bf16(a0, a1, a2, a3, desc, acc)
    warpgroup.commit_group()
    warpgroup.wait_group(0)
    for i in cutlass.range_constexpr(N // 8):
        col = i * 8 + t2
        d[row * N + col] = acc[i * 4]
        d[row * N + col + 1] = acc[i * 4 + 1]
        d[(row + 8) * N + col] = acc[i * 4 + 2]
        d[(row + 8) * N + col + 1] = acc[i * 4 + 3]


@cute.jit
def probe(a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, stream, N: cutlass.Constexpr):
    probe_kernel(a, b, d, N).launch(grid=(1, 1, 1), block=(128, 1, 1), stream=stream)
