"""The cute backend's chunk pass on warpgroup MMA (`CuteConfig.algorithm == "wgmma"`, sm_90a).

The chunk algorithm of kernels/cute/chunk_source.py (the same validate, chunk index and
preparation, the preparation writing its operands in the canonical layout of
`chunk_source._store_canonical`), with a pass in which one warpgroup (128 threads) holds the
transposed state S^T [64 V columns, K] of a (sequence, head) in fp32 wgmma accumulators, each
warp 16 V columns, the `mma.sync` pass's register layout (kernels/cute/ptx.py). Per chunk:

    X = S^T W^T,  Vnew^T = U^T - X,  o^T = S^T qg^T + Vnew^T A_qk^T,
    S^T <- S^T diag(e^G_last) + Vnew^T kd

A's operand from the registers (S^T and Vnew^T, as bf16 fragments), B's from shared memory;
the state path (X and the update) split in three (high x high + high x low + low x high),
near fp32, the output's products in plain bf16, as in the `mma.sync` pass. Per 16 keys, X's
two high-half terms and o's S^T qg^T come from one 64 x 48 x 16 `wgmma` (S^T's high half by
W's high half, W's low half and qg, stacked), X's third term from one 64 x 16 x 16; then one
64 x 16 x 16 for Vnew^T A_qk^T and three 64 x K x 16 for the update. All the next chunk's operands (W, qg, kd,
A_qk, the block's 64 rows of U^T, e^G_last: 25.6 KB at K = 128) come by the TMA unit, six bulk
copies issued by one thread a chunk ahead into the other of two buffers, completing on the
buffer's mbarrier; an interior checkpoint's operands come the same way when its chunk is
reached. No exchange between warps: the warpgroup holds all K keys of its 64 columns.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import warpgroup
from cutlass.memory import SmemAllocator

from .chunk_source import (
    PASS_COLUMNS,
    _checkpoint_chunk_from,
    _fill_nan,
    _load_state,
    _range_share,
    _store_state,
)
from .ptx import bulk_copy_g2s, fence_operands, smem_descriptor, split_bf16x2, wgmma_bf16
from .source import active_checkpoints, checkpoint_offset
from .variants import CHUNK

GROUP_COLUMNS = 64  # V columns per warpgroup (the wgmma's M)
THREADS = 128
CORE = 128  # bytes of one 8 x 8 bf16 core matrix: the stride between neighbours in M or N
TOKEN_OCTETS = CHUNK // 8


def _split_state(S: cute.Tensor, ah: list, al: list, ks: int):
    """Key step ks (16 keys) of S^T as high and low bf16 A fragments."""
    for r in range(4):
        ah[ks * 4 + r], al[ks * 4 + r] = split_bf16x2(S[ks * 8 + 2 * r], S[ks * 8 + 2 * r + 1])


def _mma(a: list, base: int, desc: Int64, acc: cute.Tensor, count: int,
         accumulate: bool = True):
    """acc += A B (acc = A B when not `accumulate`) for A fragment a[base .. base + 3] and the
    B of `desc`."""
    vals = wgmma_bf16(a[base], a[base + 1], a[base + 2], a[base + 3], desc,
                      [acc[i] for i in range(count)], accumulate)
    for i in range(count):
        acc[i] = vals[i]


def _settle(acc: cute.Tensor, count: int):
    """After `wait_group`: acc's values read only from here on (`fence_operands`)."""
    vals = fence_operands([acc[i] for i in range(count)])
    for i in range(count):
        acc[i] = vals[i]


def _update(D: cute.Tensor, vh: list, vl: list, keys: Int32, words: int, K: int):
    """D += Vnew^T kd, split in three, kd's high half at shared address `keys` and its low
    half `words` words after it ([K keys, CHUNK tokens], canonical, K-major in tokens)."""
    hi = smem_descriptor(keys, K * 16, CORE)
    lo = smem_descriptor(keys + words * 4, K * 16, CORE)
    warpgroup.fence()
    _mma(vh, 0, hi, D, K // 2)
    _mma(vh, 0, lo, D, K // 2)
    _mma(vl, 0, hi, D, K // 2)
    warpgroup.commit_group()
    warpgroup.wait_group(0)
    _settle(D, K // 2)


def _issue_chunk(wW: cute.Tensor, wQ: cute.Tensor, wKd: cute.Tensor, wA: cute.Tensor,
                 wU: cute.Tensor, wGL: cute.Tensor, dst: Int32, u_dst: Int32, gl_dst: Int32,
                 bar, sh: Int64, v0: Int64, K: int):
    """One thread: the bulk copies of chunk-head sh's operands into one buffer (its bf16
    operands at shared address dst, its U^T rows at u_dst, e^G_last at gl_dst), completing on
    mbarrier `bar`."""
    op = CHUNK * K // 2  # words of one bf16 operand
    u_bytes = GROUP_COLUMNS * CHUNK * 4
    cute.arch.mbarrier_arrive_and_expect_tx(bar, 20 * op + CHUNK * CHUNK * 2 + u_bytes + K * 4)
    at = bar.toint()
    bulk_copy_g2s(dst, wW.iterator.toint() + sh * (8 * op), 8 * op, at)
    bulk_copy_g2s(dst + 8 * op, wQ.iterator.toint() + sh * (4 * op), 4 * op, at)
    bulk_copy_g2s(dst + 12 * op, wKd.iterator.toint() + sh * (8 * op), 8 * op, at)
    bulk_copy_g2s(dst + 20 * op, wA.iterator.toint() + sh * (CHUNK * CHUNK * 2),
                  CHUNK * CHUNK * 2, at)
    bulk_copy_g2s(u_dst, wU.iterator.toint() + (sh * K + v0) * (CHUNK * 4), u_bytes, at)
    bulk_copy_g2s(gl_dst, wGL.iterator.toint() + sh * (K * 4), K * 4, at)


@cute.kernel
def chunk_wgmma_pass_kernel(
    out: cute.Tensor, pool: cute.Tensor, carry: cute.Tensor, cu: cute.Tensor, live: cute.Tensor,
    init_idx: cute.Tensor, final_idx: cute.Tensor, ck_off: cute.Tensor, ck_idx: cute.Tensor,
    err: cute.Tensor, co: cute.Tensor, wW: cute.Tensor, wQ: cute.Tensor, wKd: cute.Tensor,
    wA: cute.Tensor, wU: cute.Tensor, wGL: cute.Tensor, wCK: cute.Tensor, wCD: cute.Tensor,
    H: Int64, token_capacity: Int64, meta_capacity: Int64, edge: Int64, chunk_lo: Int64,
    chunk_hi: Int64, K: cutlass.Constexpr, CK: cutlass.Constexpr,
):
    KS = K // 16
    NT = K // 8
    OP = CHUNK * K // 2  # words of one bf16 operand: W high at 0, low at OP, qg at 2 OP,
    # kd high at 3 OP, low at 4 OP, A_qk at 5 OP
    tid = Int64(cute.arch.thread_idx()[0])
    lane = tid % 32
    warp = tid // 32
    g = lane // 4
    t2 = lane % 4 * 2
    smem = SmemAllocator()
    STAGE = 5 * OP + CHUNK * CHUNK // 2  # words of a buffer's bf16 operands
    UW = GROUP_COLUMNS * CHUNK  # a buffer's U^T rows
    sB = smem.allocate_tensor(Int32, cute.make_layout(2 * STAGE), byte_alignment=128)
    sU = smem.allocate_tensor(Float32, cute.make_layout(2 * UW), byte_alignment=128)
    sGL = smem.allocate_tensor(Float32, cute.make_layout(2 * K), byte_alignment=128)
    sCK = smem.allocate_tensor(Int32, cute.make_layout(2 * OP), byte_alignment=128)
    sCD = smem.allocate_tensor(Float32, cute.make_layout(K), byte_alignment=128)
    bars = smem.allocate_tensor(Int64, cute.make_layout(3), byte_alignment=8)
    if tid == 0:
        for i in cutlass.range_constexpr(3):
            cute.arch.mbarrier_init(bars.iterator + i, 1)
        cute.arch.mbarrier_init_fence()
    cute.arch.sync_threads()
    bidx, bidy, bidz = cute.arch.block_idx()
    n = Int64(bidx)
    h = Int64(bidy)
    v0 = Int64(bidz) * GROUP_COLUMNS
    vw = v0 + warp * PASS_COLUMNS  # the warp's 16 columns
    if err[0] != 0:
        if edge == 0:  # the first range's launch
            _fill_nan(out, n, h, vw, lane, H, token_capacity, meta_capacity, K)
    else:
        if n < Int64(live[0]):
            bos, length, first, chunks, lo, hi, mine = _range_share(cu, co, n, chunk_lo,
                                                                    chunk_hi, edge)
            S = cute.make_rmem_tensor(cute.make_layout(NT * 4), Float32)
            D = cute.make_rmem_tensor(cute.make_layout(NT * 4), Float32)
            # S^T's high half times [W high | W low | qg]: X's two parts and o, 16 tokens each
            XO = cute.make_rmem_tensor(cute.make_layout(12 * TOKEN_OCTETS), Float32)
            X = cute.make_rmem_tensor(cute.make_layout(4 * TOKEN_OCTETS), Float32)
            O = cute.make_rmem_tensor(cute.make_layout(4 * TOKEN_OCTETS), Float32)
            offsets, _ = active_checkpoints(ck_off, ck_idx, n, CK)
            held = cute.make_rmem_tensor(cute.make_layout(1), Int64)  # the next chunk with one
            held[0] = _checkpoint_chunk_from(offsets, lo, CK)
            phase = cute.make_rmem_tensor(cute.make_layout(1), Int32)  # the checkpoint barrier's
            phase[0] = Int32(0)
            for i in cutlass.range_constexpr(NT * 4):
                S[i] = Float32(0.0)
            for i in cutlass.range_constexpr(12 * TOKEN_OCTETS):  # (unread: each chunk's first
                XO[i] = Float32(0.0)  # products start from zero)
            for i in cutlass.range_constexpr(4 * TOKEN_OCTETS):
                X[i] = Float32(0.0)
            if mine != 0:
                if lo == 0:
                    init = init_idx[n]
                    if init >= 0:
                        _load_state(pool, S, init, h, H, vw, g, t2, Int64(0), K, 1)
                else:  # where the range before this one left the state (edge - 1's carry)
                    _load_state(carry, S, edge - 1, h, H, vw, g, t2, Int64(0), K, 1)
            b_at = sB.iterator.toint()
            u_at = sU.iterator.toint()
            gl_at = sGL.iterator.toint()
            if lo < hi:
                if tid == 0:
                    _issue_chunk(wW, wQ, wKd, wA, wU, wGL, b_at, u_at, gl_at, bars.iterator,
                                 (first + lo) * H + h, v0, K)
            for j in cutlass.range(lo, hi):
                start = j * CHUNK
                rows = length - start
                buf = Int32((j - lo) % 2)
                if tid == 0:
                    if j + 1 < hi:  # the next chunk's operands, copied during this one
                        nb = 1 - buf
                        _issue_chunk(wW, wQ, wKd, wA, wU, wGL, b_at + nb * (STAGE * 4),
                                     u_at + nb * (UW * 4), gl_at + nb * (K * 4),
                                     bars.iterator + nb, (first + j + 1) * H + h, v0, K)
                cute.arch.mbarrier_wait(bars.iterator + buf, Int32((j - lo) // 2 % 2))
                base = b_at + buf * (STAGE * 4)
                # X and o from S^T: per key step, W split in three and qg in plain bf16
                ah = [Int32(0)] * (4 * KS)
                al = [Int32(0)] * (4 * KS)
                for ks in cutlass.range_constexpr(KS):
                    _split_state(S, ah, al, ks)
                # per key step one 64 x 48 x 16 product (S^T high by [W high | W low | qg]) and
                # one 64 x 16 x 16 (S^T low by W high), each chain from zero at key step 0
                warpgroup.fence()
                for ks in cutlass.range_constexpr(KS):
                    stack = smem_descriptor(base + ks * (2 * 3 * CHUNK * 16), 3 * CHUNK * 16, CORE)
                    _mma(ah, ks * 4, stack, XO, 12 * TOKEN_OCTETS, ks > 0)
                    _mma(al, ks * 4, stack, X, 4 * TOKEN_OCTETS, ks > 0)  # its first 16 rows
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                _settle(XO, 12 * TOKEN_OCTETS)
                _settle(X, 4 * TOKEN_OCTETS)
                for i in cutlass.range_constexpr(4 * TOKEN_OCTETS):  # high x high + high x low
                    X[i] = XO[i] + XO[4 * TOKEN_OCTETS + i] + X[i]  # + low x high
                    O[i] = XO[8 * TOKEN_OCTETS + i]
                # Vnew^T = U^T - X, in X; then its A fragment (token step of 16)
                for i in cutlass.range_constexpr(TOKEN_OCTETS):
                    for e in cutlass.range_constexpr(4):
                        row = warp * PASS_COLUMNS + g + e // 2 * 8
                        X[i * 4 + e] = sU[buf * UW + row * CHUNK + i * 8 + t2 + e % 2] \
                            - X[i * 4 + e]
                vh = [Int32(0)] * 4
                vl = [Int32(0)] * 4
                for r in cutlass.range_constexpr(4):
                    vh[r], vl[r] = split_bf16x2(X[2 * r], X[2 * r + 1])
                warpgroup.fence()
                _mma(vh, 0, smem_descriptor(base + 5 * OP * 4, CHUNK * 16, CORE), O,
                     4 * TOKEN_OCTETS)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                _settle(O, 4 * TOKEN_OCTETS)
                for i in cutlass.range_constexpr(TOKEN_OCTETS):
                    for e in cutlass.range_constexpr(4):
                        tok = i * 8 + t2 + e % 2
                        if tok < rows:
                            out[((bos + start + tok) * H + h) * K + vw + g + e // 2 * 8] = \
                                O[i * 4 + e].to(out.element_type)
                # the checkpoints strictly inside the chunk, behind one comparison per chunk
                if j == held[0]:
                    for c in cutlass.range(CK, unroll=1):
                        slot = ck_idx[n * CK + c]
                        p = checkpoint_offset(ck_off, slot, n * CK + c) - start
                        if p > 0:
                            if p < CHUNK:
                                unit = (n * CK + c) * H + h
                                if tid == 0:
                                    ck_bar = bars.iterator + 2
                                    cute.arch.mbarrier_arrive_and_expect_tx(ck_bar,
                                                                            8 * OP + K * 4)
                                    bulk_copy_g2s(sCK.iterator.toint(),
                                                  wCK.iterator.toint() + unit * (8 * OP),
                                                  8 * OP, ck_bar.toint())
                                    bulk_copy_g2s(sCD.iterator.toint(),
                                                  wCD.iterator.toint() + unit * (K * 4),
                                                  K * 4, ck_bar.toint())
                                cute.arch.mbarrier_wait(bars.iterator + 2, phase[0])
                                phase[0] = 1 - phase[0]
                                for nt in cutlass.range_constexpr(NT):
                                    for e in cutlass.range_constexpr(4):
                                        D[nt * 4 + e] = S[nt * 4 + e] * sCD[nt * 8 + t2 + e % 2]
                                _update(D, vh, vl, sCK.iterator.toint(), OP, K)
                                _store_state(pool, D, slot, h, H, vw, g, t2, Int64(0), K, 1)
                                cute.arch.sync_threads()  # sCK and sCD free again
                for nt in cutlass.range_constexpr(NT):
                    for e in cutlass.range_constexpr(4):
                        S[nt * 4 + e] = S[nt * 4 + e] * sGL[buf * K + nt * 8 + t2 + e % 2]
                _update(S, vh, vl, base + 3 * OP * 4, OP, K)
                if j == held[0]:
                    for c in cutlass.range(CK, unroll=1):
                        slot = ck_idx[n * CK + c]
                        if checkpoint_offset(ck_off, slot, n * CK + c) == start + CHUNK:
                            _store_state(pool, S, slot, h, H, vw, g, t2, Int64(0), K, 1)
                    held[0] = _checkpoint_chunk_from(offsets, j + 1, CK)
                cute.arch.sync_threads()  # this buffer free for chunk j + 2's copies
            if mine != 0:
                if hi == chunks:
                    last = final_idx[n]
                    if last >= 0:
                        _store_state(pool, S, last, h, H, vw, g, t2, Int64(0), K, 1)
                else:  # a range edge lies inside at most one sequence: its state in carry
                    _store_state(carry, S, edge, h, H, vw, g, t2, Int64(0), K, 1)


@cute.jit
def kda_chunk_wgmma_pass(
    out: cute.Tensor, pool: cute.Tensor, carry: cute.Tensor, cu: cute.Tensor,
    live: cute.Tensor, init_idx: cute.Tensor, final_idx: cute.Tensor, ck_off: cute.Tensor,
    ck_idx: cute.Tensor, err: cute.Tensor, co: cute.Tensor, wW: cute.Tensor, wQ: cute.Tensor,
    wKd: cute.Tensor, wA: cute.Tensor, wU: cute.Tensor, wGL: cute.Tensor, wCK: cute.Tensor,
    wCD: cute.Tensor, H: Int64, token_capacity: Int64, meta_capacity: Int64, edge: Int64,
    chunk_lo: Int64, chunk_hi: Int64, stream, K: cutlass.Constexpr, CK: cutlass.Constexpr,
):
    """The pass over global chunks chunk_lo .. chunk_hi - 1 (as `kda_chunk_pass`), one
    warpgroup per (sequence, head, 64 V columns)."""
    chunk_wgmma_pass_kernel(out, pool, carry, cu, live, init_idx, final_idx, ck_off, ck_idx,
                            err, co, wW, wQ, wKd, wA, wU, wGL, wCK, wCD, H, token_capacity,
                            meta_capacity, edge, chunk_lo, chunk_hi, K, CK).launch(
        grid=(Int32(meta_capacity), Int32(H), K // GROUP_COLUMNS), block=(THREADS, 1, 1),
        stream=stream)
