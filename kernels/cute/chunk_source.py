"""The cute backend's chunked algorithm on tensor cores (`CuteConfig.algorithm == "chunk"`).

After validate (kernels/cute/source.py), three kernels (the preparation and the pass once per
range of chunk slots, each range's pass on a side stream when a call has several:
kernels/cute/launch.py):

* chunk_index: one warp writes each sequence's first 16-token chunk (the exclusive prefix sum
  of ceil(len / 16)) and the batch's chunk count, from metadata validate accepted;
* chunk_prep: one block of 128 threads per (chunk, head), all chunks of a range of chunk
  slots at once (kernels/cute/launch.py cuts a call into ranges), straight from
  the caller's q, k, v, g and beta: the input transforms (`log_decay`, the L2 norms, `beta_of`,
  the scale), then in fp32 on CUDA cores the in-chunk cumulative decay G (and the reverse sums
  for the update), A_kk and A_qk (relative to the chunk's eighth token, so no factor
  overflows), T = (I + A_kk)^-1 by forward substitution, W = T beta k e^G, U = T beta v,
  qg = q e^G, kd = k e^(G_last - G). It stores W and kd split into high and low bf16 halves,
  qg and A_qk in bf16, each already in the register order of the pass's MMA operands
  (kernels/cute/ptx.py), U (in the order of the pass's accumulators) and e^G_last in fp32; and
  for each checkpoint strictly inside the chunk, at in-chunk position p, k e^(G_p - G) over
  the first p tokens (as kd) and e^G_p;
* chunk_pass: `key_split` warps per (sequence, head, 16 V columns) walk the sequence's chunks,
  each holding K / key_split keys of the transposed state S^T [16, K] in fp32 MMA
  accumulators:

      X = S^T W^T,  Vnew^T = U^T - X,  o^T = S^T qg^T + Vnew^T A_qk^T,
      S^T <- S^T diag(e^G_last) + Vnew^T kd

  the warps' partial X and o summed through shared memory every chunk. Everything a warp
  reads of a chunk (its W, qg, kd, e^G_last and A_qk records, and its group's U, copied once
  per group) is copied into shared memory with cp.async one chunk ahead. The two products on
  the state path (X and the update) run split in three (high x high + high x low + low x
  high) on bf16 tensor cores, near fp32 (kernels/NOTES.md, "Precision of a tensor-core chunk
  step"); the output's products run in plain bf16. A checkpoint strictly inside a chunk is
  the update with the prep's checkpoint operands, written from the registers; one at a
  chunk's end is the updated state. A launch walks the chunks of one range of chunk slots;
  a sequence crossing the range's end leaves its state in the carry workspace (one per edge:
  an edge lies inside at most one sequence), where the next range's launch takes it up. On a
  non-zero error code the first range's pass only fills its share of the output with NaN and
  no launch touches the pool.

Every address is computed in Int64, as in source.py.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync
from cutlass.memory import SmemAllocator

from .ptx import mma_bf16, pack_bf16x2, split_bf16x2
from .source import L2_NORM_EPS, active_checkpoints, beta_of, checkpoint_offset, log_decay
from .variants import CHUNK

PREP_THREADS = 128
PASS_COLUMNS = 16  # V columns per warp of the pass (the MMA's 16 rows)
REFERENCE_TOKEN = 7  # a 16-token block's A factors are taken relative to its eighth token
PAD = 128 + 1  # row stride of the prep's [CHUNK, K] tiles (K <= 128; no bank conflicts)
TOKEN_TILES = CHUNK // 8  # a chunk's tiles of 8 tokens (the MMA's N)
TOKEN_STEPS = CHUNK // 16  # a chunk's steps of 16 tokens (the MMA's K)
A_RECORDS = TOKEN_TILES * TOKEN_STEPS * 32  # A_qk's records per (chunk, head)
NORM_LANES = PREP_THREADS // (2 * CHUNK)  # the prep's threads per row of q or k in the L2 sums
NORM_SHUFFLES = NORM_LANES.bit_length() - 1


@cute.jit
def _chunks(length: Int64) -> Int64:
    """CHUNK-token chunks of a sequence of `length` tokens."""
    return (length + CHUNK - 1) // CHUNK


@cute.kernel
def chunk_index_kernel(cu: cute.Tensor, live: cute.Tensor, err: cute.Tensor, co: cute.Tensor):
    lane = Int64(cute.arch.thread_idx()[0])
    smem = SmemAllocator()
    totals = smem.allocate_tensor(Int64, cute.make_layout(32), byte_alignment=8)
    if err[0] == 0:
        num_seqs = Int64(live[0])
        per = (num_seqs + 31) // 32
        lo = lane * per
        if lo > num_seqs:
            lo = num_seqs
        hi = lo + per
        if hi > num_seqs:
            hi = num_seqs
        total = Int64(0)
        for n in cutlass.range(lo, hi):
            total = total + _chunks(cu[n + 1] - cu[n])
        totals[lane] = total
        cute.arch.sync_warp()
        run = Int64(0)
        for other in cutlass.range(lane):
            run = run + totals[other]
        for n in cutlass.range(lo, hi):
            co[n] = run
            run = run + _chunks(cu[n + 1] - cu[n])
        if lane == 31:
            co[num_seqs] = run


@cute.jit
def _chunk_of(c: Int64, live: cute.Tensor, err: cute.Tensor, co: cute.Tensor):
    """(1, n) when chunk slot c is the batch's and sequence n's, else (0, 0): a binary search
    of the chunk index."""
    live_chunk = Int32(0)
    n = Int64(0)
    if err[0] == 0:
        num_seqs = Int64(live[0])
        if c < co[num_seqs]:
            live_chunk = Int32(1)
            lo = Int64(0)
            hi = num_seqs
            for _ in cutlass.range(32):
                if hi - lo > 1:
                    mid = (lo + hi) // 2
                    if co[mid] <= c:
                        lo = mid
                    else:
                        hi = mid
            n = lo
    return live_chunk, n


@cute.jit
def _store_key_records(tile: cute.Tensor, dst: cute.Tensor, base: Int64, tid: Int64,
                       quad: cute.Tensor, K: cutlass.Constexpr):
    """A [CHUNK tokens, K] tile split in high and low bf16, as the B operands of the pass's
    update (record (key tile, token step, lane) at dst[base + record])."""
    for rec in cutlass.range(tid, K // 8 * TOKEN_STEPS * 32, PREP_THREADS):
        lane = rec % 32
        col = rec // (32 * TOKEN_STEPS) * 8 + lane // 4
        t2 = (rec // 32) % TOKEN_STEPS * 16 + lane % 4 * 2
        quad[0], quad[2] = split_bf16x2(tile[t2, col], tile[t2 + 1, col])
        quad[1], quad[3] = split_bf16x2(tile[t2 + 8, col], tile[t2 + 9, col])
        cute.autovec_copy(quad, dst[base + rec, None])


@cute.jit
def _a_entry(KR: cute.Tensor, KI: cute.Tensor, QR: cute.Tensor, AK: cute.Tensor,
             AQ: cute.Tensor, BETA: cute.Tensor, row: Int64, col: Int64, K: cutlass.Constexpr):
    """A_kk[row, col] (times beta_row; zero on and above the diagonal) and A_qk[row, col]
    (zero above it) from tiles scaled relative to one reference token."""
    akk = Float32(0.0)
    aqk = Float32(0.0)
    for ch in cutlass.range(K, unroll=8):
        kj = KI[col, ch]
        akk = akk + KR[row, ch] * kj
        aqk = aqk + QR[row, ch] * kj
    if col >= row:
        akk = Float32(0.0)
    if col > row:
        aqk = Float32(0.0)
    AK[row, col] = akk * BETA[row]
    AQ[row, col] = aqk


@cute.kernel
def chunk_prep_kernel(
    q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, g: cute.Tensor, beta: cute.Tensor,
    A_log: cute.Tensor, dt_bias: cute.Tensor, cu: cute.Tensor, live: cute.Tensor,
    err: cute.Tensor, co: cute.Tensor, ck_off: cute.Tensor, ck_idx: cute.Tensor,
    wW: cute.Tensor, wQ: cute.Tensor, wKd: cute.Tensor, wA: cute.Tensor, wU: cute.Tensor,
    wGL: cute.Tensor, wCK: cute.Tensor, wCD: cute.Tensor, H: Int64, CK: Int64, base: Int64,
    scale: Float32, lower_bound: Float32, K: cutlass.Constexpr, GATE: cutlass.Constexpr,
    QK_L2NORM: cutlass.Constexpr, BETA_SIGMOID: cutlass.Constexpr, WGMMA: cutlass.Constexpr,
):
    tid = Int64(cute.arch.thread_idx()[0])
    c = base + Int64(cute.arch.block_idx()[0])  # this launch's chunk slots from base
    h = Int64(cute.arch.block_idx()[1])
    smem = SmemAllocator()
    tile = cute.make_layout((CHUNK, PAD), stride=(PAD, 1))
    square = cute.make_layout((CHUNK, CHUNK + 1), stride=(CHUNK + 1, 1))
    KR = smem.allocate_tensor(Float32, tile, byte_alignment=16)  # k e^(G - G_ref), then W
    KI = smem.allocate_tensor(Float32, tile, byte_alignment=16)  # k e^(G_ref - G), then kd
    QR = smem.allocate_tensor(Float32, tile, byte_alignment=16)  # q e^(G - G_ref), then qg
    KN = smem.allocate_tensor(Float32, tile, byte_alignment=16)  # k (normalised)
    GT = smem.allocate_tensor(Float32, tile, byte_alignment=16)  # G, the in-chunk log decay
    AK = smem.allocate_tensor(Float32, square, byte_alignment=16)
    AQ = smem.allocate_tensor(Float32, square, byte_alignment=16)
    TT = smem.allocate_tensor(Float32, square, byte_alignment=16)
    BETA = smem.allocate_tensor(Float32, cute.make_layout(CHUNK), byte_alignment=16)
    NORM = smem.allocate_tensor(Float32, cute.make_layout((2, CHUNK), stride=(CHUNK, 1)),
                                byte_alignment=16)  # per q/k and token: a sum of squares
    live_chunk, n = _chunk_of(c, live, err, co)
    if live_chunk != 0:
        start = cu[n] + (c - co[n]) * CHUNK
        rows = cu[n + 1] - start
        if rows > CHUNK:
            rows = Int64(CHUNK)
        sh = c * H + h
        kk = cute.make_rmem_tensor(cute.make_layout(CHUNK), Float32)
        qq = cute.make_rmem_tensor(cute.make_layout(CHUNK), Float32)
        G = cute.make_rmem_tensor(cute.make_layout(CHUNK), Float32)
        R = cute.make_rmem_tensor(cute.make_layout(CHUNK), Float32)
        if tid < CHUNK:
            b = Float32(0.0)
            if tid < rows:
                b = beta_of(Float32(beta[(start + tid) * H + h]), BETA_SIGMOID)
            BETA[tid] = b
        if tid < K:  # the raw inputs of channel tid, the gate transformed
            rate = Float32(1.0)
            bias = Float32(0.0)
            if cutlass.const_expr(GATE != 0):
                rate = cute.math.exp(Float32(A_log[h]))
                bias = Float32(dt_bias[h * K + tid])
            for i in cutlass.range_constexpr(CHUNK):
                kv = Float32(0.0)
                qv = Float32(0.0)
                gv = Float32(0.0)
                if i < rows:
                    at = ((start + i) * H + h) * K + tid
                    kv = Float32(k[at])
                    qv = Float32(q[at])
                    gv = log_decay(Float32(g[at]), rate, bias, lower_bound, GATE)
                if cutlass.const_expr(QK_L2NORM):  # raw rows in the tiles for the norms' sums
                    QR[i, tid] = qv
                    KN[i, tid] = kv
                else:
                    kk[i] = kv
                    qq[i] = qv * scale
                R[i] = gv
        if cutlass.const_expr(QK_L2NORM):
            # each token's sums of squares over the K channels, a row of q or k on NORM_LANES
            # neighbouring threads (every NORM_LANES-th channel each, then shuffles), so that
            # no thread holds every token's raw q and k across the sums
            cute.arch.sync_threads()
            nrow = tid // NORM_LANES
            ntok = nrow % CHUNK
            ss = Float32(0.0)
            if nrow < CHUNK:
                for nc in cutlass.range_constexpr(K // NORM_LANES):
                    x = QR[ntok, tid % NORM_LANES + nc * NORM_LANES]
                    ss = ss + x * x
            else:
                for nc in cutlass.range_constexpr(K // NORM_LANES):
                    x = KN[ntok, tid % NORM_LANES + nc * NORM_LANES]
                    ss = ss + x * x
            for sb in cutlass.range_constexpr(NORM_SHUFFLES):
                ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=1 << sb)
            if tid % NORM_LANES == 0:
                NORM[nrow // CHUNK, ntok] = ss
            cute.arch.sync_threads()
            if tid < K:
                for i in cutlass.range_constexpr(CHUNK):
                    qq[i] = QR[i, tid] * (scale / cute.math.sqrt(NORM[0, i] + L2_NORM_EPS))
                    kk[i] = KN[i, tid] / cute.math.sqrt(NORM[1, i] + L2_NORM_EPS)
        if tid < K:
            run = Float32(0.0)
            for i in cutlass.range_constexpr(CHUNK):
                run = run + R[i]
                G[i] = run
                KN[i, tid] = kk[i]
                GT[i, tid] = run
            later = Float32(0.0)
            for i in cutlass.range_constexpr(CHUNK - 1, -1, -1):
                gv = R[i]
                R[i] = later
                later = later + gv
            for i in cutlass.range_constexpr(CHUNK):  # the diagonal blocks' references
                ref = G[i // 16 * 16 + REFERENCE_TOKEN]
                up = cute.math.exp(G[i] - ref)
                KR[i, tid] = kk[i] * up
                QR[i, tid] = qq[i] * up
                KI[i, tid] = kk[i] * cute.math.exp(ref - G[i])
            wGL[(sh * K + tid) // 2, tid % 2] = cute.math.exp(G[CHUNK - 1])
        cute.arch.sync_threads()
        for r in cutlass.range_constexpr(2 * TOKEN_STEPS):  # the diagonal 16 x 16 blocks
            pair = tid + r * PREP_THREADS
            row = pair // 256 * 16 + pair % 256 // 16
            col = pair // 256 * 16 + pair % 16
            _a_entry(KR, KI, QR, AK, AQ, BETA, row, col, K)
        if cutlass.const_expr(TOKEN_STEPS == 2):
            # block (1, 0) relative to token 15: e^(G_i - G_15) for i >= 16 and e^(G_15 - G_j)
            # for j <= 15 are both at most 1 (rows 16.. of KR and QR, rows ..15 of KI rewritten)
            cute.arch.sync_threads()
            if tid < K:  # k and G read back from KN and GT (not kept in registers)
                ref = GT[15, tid]
                for i in cutlass.range_constexpr(16):
                    up = cute.math.exp(GT[16 + i, tid] - ref)
                    KR[16 + i, tid] = KN[16 + i, tid] * up
                    QR[16 + i, tid] = qq[16 + i] * up
                    KI[i, tid] = KN[i, tid] * cute.math.exp(ref - GT[i, tid])
            cute.arch.sync_threads()
            for r in cutlass.range_constexpr(2):
                pair = tid + r * PREP_THREADS
                _a_entry(KR, KI, QR, AK, AQ, BETA, 16 + pair // 16, pair % 16, K)
        cute.arch.sync_threads()
        if tid < CHUNK:  # column tid of T = (I + A_kk)^-1, A_kk strictly lower
            for i in cutlass.range_constexpr(CHUNK):
                s = Float32(0.0)
                for m in cutlass.range_constexpr(i):
                    s = s + AK[i, m] * TT[m, tid]
                one = Float32(0.0)
                if tid == i:
                    one = Float32(1.0)
                TT[i, tid] = one - s
        cute.arch.sync_threads()
        if tid < K:  # k and G read back from KN and GT, so neither stays live across A and T
            for i in cutlass.range_constexpr(CHUNK):
                eg = cute.math.exp(GT[i, tid])
                kn = KN[i, tid]
                QR[i, tid] = qq[i] * eg
                KI[i, tid] = kn * cute.math.exp(R[i])
                kk[i] = BETA[i] * kn * eg
            for i in cutlass.range_constexpr(CHUNK):
                w = Float32(0.0)
                for j in cutlass.range_constexpr(i + 1):
                    w = w + TT[i, j] * kk[j]
                KR[i, tid] = w
            for j in cutlass.range_constexpr(CHUNK):
                x = Float32(0.0)
                if j < rows:
                    x = Float32(v[((start + j) * H + h) * K + tid])
                qq[j] = BETA[j] * x
            # U^T in the pass's accumulator order: record (column block, lane), value nt*4 + e
            # holds U[nt*8 + 2t + e % 2, 16 block + g + 8 (e // 2)] (lane = 4g + t)
            # (rows of 8: record r of a lane holds tiles 2r and 2r + 1)
            # (for the wgmma pass: U^T [K, CHUNK] row-major, row tid)
            vv = tid % PASS_COLUMNS
            urec = (sh * (K // PASS_COLUMNS) + tid // PASS_COLUMNS) * 32 + vv % 8 * 4
            for i in cutlass.range_constexpr(CHUNK):
                u = Float32(0.0)
                for j in cutlass.range_constexpr(i + 1):
                    u = u + TT[i, j] * qq[j]
                if cutlass.const_expr(WGMMA):
                    wU[(sh * K + tid) * (CHUNK // 8) + i // 8, i % 8] = u
                else:
                    wU[(urec + i % 8 // 2) * TOKEN_STEPS + i // 16,
                       i // 8 % 2 * 4 + vv // 8 * 2 + i % 2] = u
        cute.arch.sync_threads()
        if cutlass.const_expr(WGMMA):
            _store_canonical(KR, QR, KI, AQ, wW, wQ, wKd, wA, sh, tid, K)
        else:
            _store_fragments(KR, QR, KI, AQ, wW, wQ, wKd, wA, sh, tid, K)
        _store_checkpoint_operands(KN, GT, KR, wCK, wCD, ck_off, ck_idx, cu, n, start, h, H, CK,
                                   tid, K, WGMMA)


@cute.jit
def _store_fragments(KR: cute.Tensor, QR: cute.Tensor, KI: cute.Tensor, AQ: cute.Tensor,
                     wW: cute.Tensor, wQ: cute.Tensor, wKd: cute.Tensor, wA: cute.Tensor,
                     sh: Int64, tid: Int64, K: cutlass.Constexpr):
    """W, qg, kd and A_qk of chunk-head sh in the `mma.sync` pass's register order."""
    KS = K // 16
    quad = cute.make_rmem_tensor(cute.make_layout(4), Int32)
    pair = cute.make_rmem_tensor(cute.make_layout(2), Int32)
    records = KS * TOKEN_TILES * 32
    for rec in cutlass.range(tid, records, PREP_THREADS):  # W, qg: (k step, n tile, lane)
        lane = rec % 32
        tok = (rec // 32) % TOKEN_TILES * 8 + lane // 4
        c0 = rec // (32 * TOKEN_TILES) * 16 + lane % 4 * 2
        quad[0], quad[2] = split_bf16x2(KR[tok, c0], KR[tok, c0 + 1])
        quad[1], quad[3] = split_bf16x2(KR[tok, c0 + 8], KR[tok, c0 + 9])
        cute.autovec_copy(quad, wW[sh * records + rec, None])
        pair[0] = pack_bf16x2(QR[tok, c0], QR[tok, c0 + 1])
        pair[1] = pack_bf16x2(QR[tok, c0 + 8], QR[tok, c0 + 9])
        cute.autovec_copy(pair, wQ[sh * records + rec, None])
    _store_key_records(KI, wKd, sh * (K // 8) * TOKEN_STEPS * 32, tid, quad, K)  # kd
    for rec in cutlass.range(tid, A_RECORDS, PREP_THREADS):  # A_qk: (n tile, k step, lane)
        lane = rec % 32
        row = rec // (32 * TOKEN_STEPS) * 8 + lane // 4
        t2 = (rec // 32) % TOKEN_STEPS * 16 + lane % 4 * 2
        pair[0] = pack_bf16x2(AQ[row, t2], AQ[row, t2 + 1])
        pair[1] = pack_bf16x2(AQ[row, t2 + 8], AQ[row, t2 + 9])
        cute.autovec_copy(pair, wA[sh * A_RECORDS + rec, None])


@cute.jit
def _store_canonical(KR: cute.Tensor, QR: cute.Tensor, KI: cute.Tensor, AQ: cute.Tensor,
                     wW: cute.Tensor, wQ: cute.Tensor, wKd: cute.Tensor, wA: cute.Tensor,
                     sh: Int64, tid: Int64, K: cutlass.Constexpr):
    """W, qg, kd and A_qk of chunk-head sh as the wgmma pass's shared memory holds them
    (kernels/cute/wgmma_source.py), in the canonical K-major layout (`canonical_word`): W's high
    half, W's low half and qg stacked as one [3 CHUNK, K keys] operand (rows 0-15, 16-31 and
    32-47), K-major in keys, its first two thirds in wW and the last in wQ; kd (high, then low)
    as [K keys, CHUNK tokens], K-major in tokens; A_qk as [CHUNK, CHUNK], K-major in its
    column."""
    words = CHUNK * K // 2  # one bf16 operand of a chunk-head
    for word in cutlass.range(tid, 3 * words, PREP_THREADS):
        row, key = _canonical_element(word, 3 * CHUNK)
        tok = row % CHUNK
        value = Int32(0)
        if row < 2 * CHUNK:  # (uniform in a warp: 32 neighbouring words share a row octet)
            hi, lo = split_bf16x2(KR[tok, key], KR[tok, key + 1])
            value = hi
            if row >= CHUNK:
                value = lo
        else:
            value = pack_bf16x2(QR[tok, key], QR[tok, key + 1])
        if word < 2 * words:
            at = sh * 2 * words + word
            wW[at // 4, at % 4] = value
        else:
            at = sh * words + word - 2 * words
            wQ[at // 2, at % 2] = value
    _store_canonical_keys(KI, wKd, sh * 2 * words, tid, K)
    for word in cutlass.range(tid, CHUNK * CHUNK // 2, PREP_THREADS):
        row, col = _canonical_element(word, CHUNK)
        at = sh * (CHUNK * CHUNK // 2) + word
        wA[at // 2, at % 2] = pack_bf16x2(AQ[row, col], AQ[row, col + 1])


@cute.jit
def _canonical_element(word: Int64, MN: cutlass.Constexpr):
    """(mn, k) of the first element of `word` in the canonical layout (`canonical_word`)."""
    rem = word % (MN * 4)
    return rem // 32 * 8 + rem % 32 // 4, word // (MN * 4) * 8 + rem % 4 * 2


@cute.jit
def _store_canonical_keys(tile: cute.Tensor, dst: cute.Tensor, base: Int64, tid: Int64,
                          K: cutlass.Constexpr):
    """A [CHUNK tokens, K] tile split in high and low bf16, as the B operand [K keys, CHUNK
    tokens] of the wgmma pass's update (canonical, K-major in tokens), high from dst[base],
    low after it (dst: rows of 4 words)."""
    words = CHUNK * K // 2
    for word in cutlass.range(tid, words, PREP_THREADS):
        key, tok = _canonical_element(word, K)
        hi, lo = split_bf16x2(tile[tok, key], tile[tok + 1, key])
        at = base + word
        dst[at // 4, at % 4] = hi
        dst[(at + words) // 4, (at + words) % 4] = lo


@cute.jit
def _store_checkpoint_operands(KN: cute.Tensor, GT: cute.Tensor, KR: cute.Tensor,
                               wCK: cute.Tensor, wCD: cute.Tensor, ck_off: cute.Tensor,
                               ck_idx: cute.Tensor, cu: cute.Tensor, n: Int64, start: Int64,
                               h: Int64, H: Int64, CK: Int64, tid: Int64, K: cutlass.Constexpr,
                               WGMMA: cutlass.Constexpr):
    """The operands of each checkpoint strictly inside the chunk, at in-chunk position p:
    k e^(G_p - G) over the first p tokens (zero after; formed in KR, free again) and e^G_p,
    G_p = G[p - 1], in the layout of the pass that reads them."""
    quad = cute.make_rmem_tensor(cute.make_layout(4), Int32)
    for m in cutlass.range(CK):
        slot = ck_idx[n * CK + m]
        p = ck_off[n * CK + m] - (start - cu[n])
        if slot < 0:
            p = Int64(0)
        if p > 0:
            if p < CHUNK:
                unit = (n * CK + m) * H + h
                cute.arch.sync_threads()  # KR is free again
                if tid < K:
                    top = GT[p - 1, tid]
                    for i in cutlass.range_constexpr(CHUNK):
                        kp = Float32(0.0)
                        if i < p:
                            kp = KN[i, tid] * cute.math.exp(top - GT[i, tid])
                        KR[i, tid] = kp
                    wCD[(unit * K + tid) // 2, tid % 2] = cute.math.exp(top)
                cute.arch.sync_threads()
                if cutlass.const_expr(WGMMA):
                    _store_canonical_keys(KR, wCK, unit * CHUNK * K, tid, K)
                else:
                    _store_key_records(KR, wCK, unit * (K // 8) * TOKEN_STEPS * 32, tid,
                                       quad, K)


@cute.jit
def _fill_nan(out: cute.Tensor, n: Int64, h: Int64, v0: Int64, lane: Int64, H: Int64,
              token_capacity: Int64, meta_capacity: Int64, K: cutlass.Constexpr):
    """Poison this warp's 16 columns of head h in rows n, n + meta_capacity, ... of the output."""
    nan = Float32(float("nan")).to(out.element_type)
    col = v0 + lane % 16
    first = n + lane // 16 * meta_capacity
    for i in cutlass.range((token_capacity - first + 2 * meta_capacity - 1) // (2 * meta_capacity)):
        out[((first + i * 2 * meta_capacity) * H + h) * K + col] = nan


@cute.jit
def _record_offsets(ro: cute.Tensor, sh: Int64, lane: Int64, t2: Int64, part: Int64, v0: Int64,
                    K: cutlass.Constexpr, SPLIT: cutlass.Constexpr):
    """Into ro, the lane's first records of chunk-head sh in the W and qg, U, kd, e^G_last and
    A_qk workspaces (what `_copy_operands` reads; `_next_records` moves them a chunk on)."""
    KS = K // 16
    ro[0] = (sh * KS * TOKEN_TILES + part * (KS // SPLIT) * TOKEN_TILES) * 32 + lane
    ro[1] = ((sh * KS + v0 // PASS_COLUMNS) * 32 + lane) * TOKEN_STEPS
    ro[2] = (sh * (K // 8) + part * (K // 8 // SPLIT)) * TOKEN_STEPS * 32 + lane
    ro[3] = (sh * K + part * (K // 8 // SPLIT) * 8 + t2) // 2
    ro[4] = sh * A_RECORDS + lane


@cute.jit
def _next_records(ro: cute.Tensor, H: Int64, K: cutlass.Constexpr):
    """The offsets of `_record_offsets` moved from chunk-head sh to sh + H (the next chunk)."""
    ro[0] = ro[0] + H * (K // 16 * TOKEN_TILES * 32)
    ro[1] = ro[1] + H * (K // 16 * 32 * TOKEN_STEPS)
    ro[2] = ro[2] + H * (K // 8 * TOKEN_STEPS * 32)
    ro[3] = ro[3] + H * (K // 2)
    ro[4] = ro[4] + H * A_RECORDS


@cute.jit
def _copy_operands(wW: cute.Tensor, wQ: cute.Tensor, wU: cute.Tensor, wKd: cute.Tensor,
                   wGL: cute.Tensor, wA: cute.Tensor, sW: cute.Tensor, sQ: cute.Tensor,
                   sU: cute.Tensor, sKd: cute.Tensor, sGL: cute.Tensor, sA: cute.Tensor,
                   ro: cute.Tensor, warp: Int64, buf: Int64, ubuf: Int64, lane: Int64,
                   part: Int64, K: cutlass.Constexpr, SPLIT: cutlass.Constexpr):
    """cp.async of what the lane reads of the chunk whose records start at ro
    (`_record_offsets`) into buffer buf, committed as one group: the W (split) and qg records
    of its part's key steps, the kd and e^G_last records of its part's key tiles and the A_qk
    records of the token tiles its warp writes (on and below the diagonal 16-token blocks;
    each lane reads back only what it copied), and, in the group's first warp, the group's U
    records into U buffer ubuf."""
    KSW = K // 16 // SPLIT
    NTW = K // 8 // SPLIT
    wide = cute.make_copy_atom(cpasync.CopyG2SOp(), Int32, num_bits_per_copy=128)
    wide_f = cute.make_copy_atom(cpasync.CopyG2SOp(), Float32, num_bits_per_copy=128)
    pair = cute.make_copy_atom(cpasync.CopyG2SOp(), Float32, num_bits_per_copy=64)
    pair_i = cute.make_copy_atom(cpasync.CopyG2SOp(), Int32, num_bits_per_copy=64)
    for r in cutlass.range_constexpr(KSW * TOKEN_TILES):
        rec = ro[0] + r * 32
        cute.copy(wide, wW[rec, None], sW[warp, buf, r, lane, None])
        cute.copy(pair_i, wQ[rec, None], sQ[warp, buf, r, lane, None])
    if part == 0:  # U: one copy per group, read by all its warps after the exchange barrier
        for r in cutlass.range_constexpr(TOKEN_STEPS):
            u = cute.flat_divide(wU[ro[1] + r, None], (4,))
            for half in cutlass.range_constexpr(2):
                cute.copy(wide_f, u[None, half], sU[warp // SPLIT, ubuf, lane, r * 2 + half, None])
    for nt in cutlass.range_constexpr(NTW):
        for kk in cutlass.range_constexpr(TOKEN_STEPS):
            cute.copy(wide, wKd[ro[2] + (nt * TOKEN_STEPS + kk) * 32, None],
                      sKd[warp, buf, nt * TOKEN_STEPS + kk, lane, None])
        cute.copy(pair, wGL[ro[3] + nt * 4, None], sGL[warp, buf, nt, lane, None])
    for ot in cutlass.range_constexpr(TOKEN_TILES):
        if _writes_tile(part, ot, SPLIT):
            for kk in cutlass.range_constexpr(ot // 2 + 1):  # the block lower triangle
                a = ot * TOKEN_STEPS + kk
                cute.copy(pair_i, wA[ro[4] + a * 32, None],
                          sA[warp, buf, a, lane, None])
    cute.arch.cp_async_commit_group()


@cute.jit
def _writes_tile(part: Int64, ot: cutlass.Constexpr, SPLIT: cutlass.Constexpr):
    """Whether the warp of key part `part` writes the output's token tile ot: all of them
    when one warp holds all keys, else warp ot % SPLIT of the group."""
    return SPLIT == 1 or part == ot % SPLIT


@cute.jit
def _pool_tile(slot: Int64, h: Int64, H: Int64, v0: Int64, g: Int64, t2: Int64, part: Int64,
               K: cutlass.Constexpr, SPLIT: cutlass.Constexpr) -> Int64:
    """Where the lane's first accumulator value of the warp's S^T tiles lives in pool[slot]
    (V-first: row v0 + g, key t2 of the part's first key tile; + 8 K for row g + 8, + 8 per
    key tile, + 1 for the pair's second value)."""
    return ((slot * H + h) * K + v0 + g) * K + t2 + part * (K // 8 // SPLIT) * 8


@cute.jit
def _clamp(chunk: Int64, chunks: Int64) -> Int64:
    """`chunk` held within 0 .. chunks."""
    held = chunk
    if held < 0:
        held = Int64(0)
    if held > chunks:
        held = chunks
    return held


@cute.jit
def _range_share(cu: cute.Tensor, co: cute.Tensor, n: Int64, chunk_lo: Int64, chunk_hi: Int64,
                 edge: Int64):
    """(bos, length, first chunk slot, chunks, lo, hi, mine) of sequence n in this launch:
    its chunks lo .. hi - 1 lie within global chunks [chunk_lo, chunk_hi); mine (1 or 0):
    whether this launch loads its state and stores it after (a sequence of no chunks belongs
    to the first range)."""
    bos = cu[n]
    length = cu[n + 1] - bos
    first = co[n]
    chunks = _chunks(length)
    lo = _clamp(chunk_lo - first, chunks)
    hi = _clamp(chunk_hi - first, chunks)
    mine = Int32(0)
    if lo < hi:
        mine = Int32(1)
    if chunks == 0:
        if edge == 0:
            mine = Int32(1)
    return bos, length, first, chunks, lo, hi, mine


@cute.jit
def _load_state(states: cute.Tensor, S: cute.Tensor, slot: Int64, h: Int64, H: Int64,
                v0: Int64, g: Int64, t2: Int64, part: Int64, K: cutlass.Constexpr,
                SPLIT: cutlass.Constexpr):
    """The warp's S^T tiles from states[slot, h, v0 + g (+ 8), its keys] (V-first layout)."""
    NTW = K // 8 // SPLIT
    row = _pool_tile(slot, h, H, v0, g, t2, part, K, SPLIT)
    for nt in cutlass.range_constexpr(NTW):
        S[nt * 4] = states[row + nt * 8]
        S[nt * 4 + 1] = states[row + nt * 8 + 1]
        S[nt * 4 + 2] = states[row + 8 * K + nt * 8]
        S[nt * 4 + 3] = states[row + 8 * K + nt * 8 + 1]


@cute.jit
def _store_state(states: cute.Tensor, S: cute.Tensor, slot: Int64, h: Int64, H: Int64,
                 v0: Int64, g: Int64, t2: Int64, part: Int64, K: cutlass.Constexpr,
                 SPLIT: cutlass.Constexpr):
    """The warp's S^T tiles to states[slot, h, v0 + g (+ 8), its keys] (V-first layout: the
    pool, or the carried edge states)."""
    NTW = K // 8 // SPLIT
    row = _pool_tile(slot, h, H, v0, g, t2, part, K, SPLIT)
    for nt in cutlass.range_constexpr(NTW):
        states[row + nt * 8] = S[nt * 4]
        states[row + nt * 8 + 1] = S[nt * 4 + 1]
        states[row + 8 * K + nt * 8] = S[nt * 4 + 2]
        states[row + 8 * K + nt * 8 + 1] = S[nt * 4 + 3]


@cute.kernel
def chunk_pass_kernel(
    out: cute.Tensor, pool: cute.Tensor, carry: cute.Tensor, cu: cute.Tensor, live: cute.Tensor,
    init_idx: cute.Tensor, final_idx: cute.Tensor, ck_off: cute.Tensor, ck_idx: cute.Tensor,
    err: cute.Tensor, co: cute.Tensor, wW: cute.Tensor, wQ: cute.Tensor, wKd: cute.Tensor,
    wA: cute.Tensor, wU: cute.Tensor, wGL: cute.Tensor, wCK: cute.Tensor, wCD: cute.Tensor,
    H: Int64, token_capacity: Int64, meta_capacity: Int64, edge: Int64, chunk_lo: Int64,
    chunk_hi: Int64, K: cutlass.Constexpr, CK: cutlass.Constexpr, WARPS: cutlass.Constexpr,
    SPLIT: cutlass.Constexpr,
):
    KS = K // 16
    KSW = KS // SPLIT  # the warp's key steps of 16
    NTW = K // 8 // SPLIT  # the warp's key tiles of 8
    WT = WARPS * SPLIT
    tid = Int64(cute.arch.thread_idx()[0])
    lane = tid % 32
    warp = tid // 32
    part = warp % SPLIT  # which K / SPLIT keys of the state this warp holds
    group = warp // SPLIT  # which 16 V columns of the block
    g = lane // 4
    t2 = lane % 4 * 2
    # per warp, two chunks' records (all it reads of a chunk), copied a chunk ahead with
    # cp.async
    smem = SmemAllocator()
    NTT = TOKEN_TILES
    CKS = TOKEN_STEPS
    sW = smem.allocate_tensor(Int32, cute.make_layout(
        (WT, 2, KSW * NTT, 32, 4), stride=(2 * KSW * NTT * 128, KSW * NTT * 128, 128, 4, 1)),
        byte_alignment=16)
    sQ = smem.allocate_tensor(Int32, cute.make_layout(
        (WT, 2, KSW * NTT, 32, 2), stride=(2 * KSW * NTT * 64, KSW * NTT * 64, 64, 2, 1)),
        byte_alignment=16)
    # U, the same for a group's warps: one copy per group, three chunks deep (the first warp
    # copies chunk j + 1's while the others may still read chunk j - 1's). Here and in sX a
    # lane's 16 bytes sit beside its neighbours', so a warp's 16-byte accesses meet no bank
    # conflict (a 64-byte lane stride made each 4-way, kernels/NOTES.md, cute v6)
    sU = smem.allocate_tensor(Float32, cute.make_layout(
        (WARPS, 3, 32, NTT, 4), stride=(3 * NTT * 128, NTT * 128, 4, 128, 1)),
        byte_alignment=16)
    sKd = smem.allocate_tensor(Int32, cute.make_layout(
        (WT, 2, NTW * CKS, 32, 4), stride=(2 * NTW * CKS * 128, NTW * CKS * 128, 128, 4, 1)),
        byte_alignment=16)
    sGL = smem.allocate_tensor(Float32, cute.make_layout(
        (WT, 2, NTW, 32, 2), stride=(2 * NTW * 64, NTW * 64, 64, 2, 1)), byte_alignment=16)
    sA = smem.allocate_tensor(Int32, cute.make_layout(
        (WT, 2, NTT * CKS, 32, 2), stride=(2 * NTT * CKS * 64, NTT * CKS * 64, 64, 2, 1)),
        byte_alignment=16)
    # per warp and chunk parity, its partial X (NTT token tiles), then o (NTT token tiles)
    sX = smem.allocate_tensor(Float32, cute.make_layout(
        (2, WT, 32, 2 * NTT, 4), stride=(WT * NTT * 256, NTT * 256, 4, 128, 1)),
        byte_alignment=16)
    bidx, bidy, bidz = cute.arch.block_idx()
    n = Int64(bidx)
    h = Int64(bidy)
    v0 = (Int64(bidz) * WARPS + group) * PASS_COLUMNS
    if err[0] != 0:
        if part == 0:
            if edge == 0:  # the first range's launch
                _fill_nan(out, n, h, v0, lane, H, token_capacity, meta_capacity, K)
    else:
        if n < Int64(live[0]):
            bos, length, first, chunks, lo, hi, mine = _range_share(cu, co, n, chunk_lo,
                                                                    chunk_hi, edge)
            S = cute.make_rmem_tensor(cute.make_layout(NTW * 4), Float32)
            X = cute.make_rmem_tensor(cute.make_layout(4 * NTT), Float32)
            E = cute.make_rmem_tensor(cute.make_layout(4 * NTT), Float32)
            O = cute.make_rmem_tensor(cute.make_layout(4 * NTT), Float32)
            P = cute.make_rmem_tensor(cute.make_layout(4), Float32)
            D = cute.make_rmem_tensor(cute.make_layout(4), Float32)
            # W and qg of the chunk in hand, from shared memory
            Wr = [cute.make_rmem_tensor(cute.make_layout(4), Int32) for _ in range(KSW * NTT)]
            Qr = [cute.make_rmem_tensor(cute.make_layout(2), Int32) for _ in range(KSW * NTT)]
            Kr = cute.make_rmem_tensor(cute.make_layout(4), Int32)
            Lr = cute.make_rmem_tensor(cute.make_layout(2), Float32)
            ah = cute.make_rmem_tensor(cute.make_layout(4), Int32)
            al = cute.make_rmem_tensor(cute.make_layout(4), Int32)
            vh = cute.make_rmem_tensor(cute.make_layout(4 * CKS), Int32)  # per token step
            vl = cute.make_rmem_tensor(cute.make_layout(4 * CKS), Int32)
            offsets, _ = active_checkpoints(ck_off, ck_idx, n, CK)
            held = cute.make_rmem_tensor(cute.make_layout(1), Int64)  # the next chunk with one
            held[0] = _checkpoint_chunk_from(offsets, lo, CK)
            for i in cutlass.range_constexpr(NTW * 4):
                S[i] = Float32(0.0)
            if mine != 0:
                if lo == 0:
                    init = init_idx[n]
                    if init >= 0:
                        _load_state(pool, S, init, h, H, v0, g, t2, part, K, SPLIT)
                else:  # where the range before this one left the state (edge - 1's carry)
                    _load_state(carry, S, edge - 1, h, H, v0, g, t2, part, K, SPLIT)
            ro = cute.make_rmem_tensor(cute.make_layout(5), Int64)  # the next chunk's records
            if lo < hi:
                _record_offsets(ro, (first + lo) * H + h, lane, t2, part, v0, K, SPLIT)
                _copy_operands(wW, wQ, wU, wKd, wGL, wA, sW, sQ, sU, sKd, sGL, sA, ro, warp,
                               lo % 2, lo % 3, lane, part, K, SPLIT)
            for j in cutlass.range(lo, hi):
                start = j * CHUNK
                rows = length - start
                buf = j % 2
                if j + 1 < hi:  # the next chunk's records, copied during this one
                    _next_records(ro, H, K)
                    _copy_operands(wW, wQ, wU, wKd, wGL, wA, sW, sQ, sU, sKd, sGL, sA, ro, warp,
                                   1 - buf, (j + 1) % 3, lane, part, K, SPLIT)
                    cute.arch.cp_async_wait_group(1)  # this chunk's are in
                else:
                    cute.arch.cp_async_wait_group(0)
                for r in cutlass.range_constexpr(KSW * NTT):
                    cute.autovec_copy(sW[warp, buf, r, lane, None], Wr[r])
                    cute.autovec_copy(sQ[warp, buf, r, lane, None], Qr[r])
                for i in cutlass.range_constexpr(4 * NTT):
                    X[i] = Float32(0.0)
                    E[i] = Float32(0.0)
                    O[i] = Float32(0.0)
                for ks in cutlass.range_constexpr(KSW):
                    ah[0], al[0] = split_bf16x2(S[ks * 8], S[ks * 8 + 1])
                    ah[1], al[1] = split_bf16x2(S[ks * 8 + 2], S[ks * 8 + 3])
                    ah[2], al[2] = split_bf16x2(S[ks * 8 + 4], S[ks * 8 + 5])
                    ah[3], al[3] = split_bf16x2(S[ks * 8 + 6], S[ks * 8 + 7])
                    for nt in cutlass.range_constexpr(NTT):
                        w = Wr[ks * NTT + nt]
                        bh0 = w[0]
                        bh1 = w[1]
                        bl0 = w[2]
                        bl1 = w[3]
                        q0 = Qr[ks * NTT + nt][0]
                        q1 = Qr[ks * NTT + nt][1]
                        b = nt * 4
                        X[b], X[b + 1], X[b + 2], X[b + 3] = mma_bf16(
                            ah[0], ah[1], ah[2], ah[3], bh0, bh1, X[b], X[b + 1], X[b + 2],
                            X[b + 3])
                        E[b], E[b + 1], E[b + 2], E[b + 3] = mma_bf16(
                            ah[0], ah[1], ah[2], ah[3], bl0, bl1, E[b], E[b + 1], E[b + 2],
                            E[b + 3])
                        E[b], E[b + 1], E[b + 2], E[b + 3] = mma_bf16(
                            al[0], al[1], al[2], al[3], bh0, bh1, E[b], E[b + 1], E[b + 2],
                            E[b + 3])
                        O[b], O[b + 1], O[b + 2], O[b + 3] = mma_bf16(
                            ah[0], ah[1], ah[2], ah[3], q0, q1, O[b], O[b + 1], O[b + 2],
                            O[b + 3])
                for i in cutlass.range_constexpr(4 * NTT):
                    X[i] = X[i] + E[i]
                if cutlass.const_expr(SPLIT > 1):
                    # the group's partial products summed in part order (every warp the same)
                    for ti in cutlass.range_constexpr(NTT):
                        for e in cutlass.range_constexpr(4):
                            P[e] = X[ti * 4 + e]
                        cute.autovec_copy(P, sX[buf, warp, lane, ti, None])
                        for e in cutlass.range_constexpr(4):
                            P[e] = O[ti * 4 + e]
                        cute.autovec_copy(P, sX[buf, warp, lane, NTT + ti, None])
                    cute.arch.barrier(barrier_id=1 + group, number_of_threads=32 * SPLIT)
                    # (each sum starts from part 0's partial: the additions of a sum from
                    # zero, in the same order, less the first)
                    for ti in cutlass.range_constexpr(NTT):
                        cute.autovec_copy(sX[buf, group * SPLIT, lane, ti, None], P)
                        for e in cutlass.range_constexpr(4):
                            X[ti * 4 + e] = P[e]
                    for p in cutlass.range_constexpr(1, SPLIT):
                        for ti in cutlass.range_constexpr(NTT):
                            cute.autovec_copy(sX[buf, group * SPLIT + p, lane, ti, None], P)
                            for e in cutlass.range_constexpr(4):
                                X[ti * 4 + e] = X[ti * 4 + e] + P[e]
                    for ot in cutlass.range_constexpr(NTT):
                        if _writes_tile(part, ot, SPLIT):
                            cute.autovec_copy(sX[buf, group * SPLIT, lane, NTT + ot, None], P)
                            for e in cutlass.range_constexpr(4):
                                O[ot * 4 + e] = P[e]
                            for p in cutlass.range_constexpr(1, SPLIT):
                                cute.autovec_copy(
                                    sX[buf, group * SPLIT + p, lane, NTT + ot, None], P)
                                for e in cutlass.range_constexpr(4):
                                    O[ot * 4 + e] = O[ot * 4 + e] + P[e]
                for ti in cutlass.range_constexpr(NTT):
                    cute.autovec_copy(sU[group, j % 3, lane, ti, None], P)
                    for e in cutlass.range_constexpr(4):  # Vnew^T = U^T - X, in X
                        X[ti * 4 + e] = P[e] - X[ti * 4 + e]
                for r in cutlass.range_constexpr(4 * CKS):  # A operands, token step r // 4
                    vh[r], vl[r] = split_bf16x2(X[2 * r], X[2 * r + 1])
                for ot in cutlass.range_constexpr(NTT):
                    if _writes_tile(part, ot, SPLIT):
                        b = ot * 4
                        for kk in cutlass.range_constexpr(ot // 2 + 1):
                            a = ot * CKS + kk
                            O[b], O[b + 1], O[b + 2], O[b + 3] = mma_bf16(
                                vh[kk * 4], vh[kk * 4 + 1], vh[kk * 4 + 2], vh[kk * 4 + 3],
                                sA[warp, buf, a, lane, 0], sA[warp, buf, a, lane, 1], O[b],
                                O[b + 1], O[b + 2], O[b + 3])
                        for e in cutlass.range_constexpr(4):
                            tok = ot * 8 + t2 + e % 2
                            if tok < rows:
                                out[((bos + start + tok) * H + h) * K + v0 + g + e // 2 * 8] = \
                                    O[b + e].to(out.element_type)
                # the checkpoints' code sits behind a branch around a rolled loop, so the chunk
                # step carries none of it (if-converted, it tripled the step's instructions),
                # and the branch is one comparison with the next chunk that holds one
                if j == held[0]:
                    for c in cutlass.range(CK, unroll=1):
                        slot = ck_idx[n * CK + c]
                        p = checkpoint_offset(ck_off, slot, n * CK + c) - start
                        if p > 0:
                            if p < CHUNK:
                                _interior_checkpoint(pool, wCK, wCD, S, vh, vl, D, slot,
                                                     (n * CK + c) * H + h, h, H, v0, g, t2,
                                                     lane, part, K, SPLIT)
                for nt in cutlass.range_constexpr(NTW):
                    cute.autovec_copy(sGL[warp, buf, nt, lane, None], Lr)
                    b = nt * 4
                    D[0] = S[b] * Lr[0]
                    D[1] = S[b + 1] * Lr[1]
                    D[2] = S[b + 2] * Lr[0]
                    D[3] = S[b + 3] * Lr[1]
                    for kk in cutlass.range_constexpr(CKS):
                        cute.autovec_copy(sKd[warp, buf, nt * CKS + kk, lane, None], Kr)
                        _update_step(D, vh, vl, Kr, kk)
                    for e in cutlass.range_constexpr(4):
                        S[b + e] = D[e]
                if j == held[0]:
                    for c in cutlass.range(CK, unroll=1):
                        slot = ck_idx[n * CK + c]
                        if checkpoint_offset(ck_off, slot, n * CK + c) == start + CHUNK:
                            _store_state(pool, S, slot, h, H, v0, g, t2, part, K, SPLIT)
                    held[0] = _checkpoint_chunk_from(offsets, j + 1, CK)
            if mine != 0:
                if hi == chunks:
                    last = final_idx[n]
                    if last >= 0:
                        _store_state(pool, S, last, h, H, v0, g, t2, part, K, SPLIT)
                else:  # a range edge lies inside at most one sequence: its state in carry
                    _store_state(carry, S, edge, h, H, v0, g, t2, part, K, SPLIT)


@cute.jit
def _checkpoint_chunk_from(offsets: cute.Tensor, since: Int64, CK: cutlass.Constexpr) -> Int64:
    """The first chunk from `since` on that holds a checkpoint, strictly inside it or at its end
    (offset o > 0 lies in chunk (o - 1) // CHUNK), or -1 when none does (no chunk is -1)."""
    found = Int64(-1)
    for c in cutlass.range_constexpr(CK):
        if offsets[c] > 0:
            at = (offsets[c] - 1) // CHUNK
            if at >= since:
                if found < 0:
                    found = at
                if at < found:
                    found = at
    return found


@cute.jit
def _update_step(D: cute.Tensor, vh: cute.Tensor, vl: cute.Tensor, Kr: cute.Tensor,
                 kk: cutlass.Constexpr):
    """D += Vnew^T kd over token step kk, split in three (high x high + high x low + low x
    high; Kr holds the key record's high pair, then its low pair)."""
    a = kk * 4
    D[0], D[1], D[2], D[3] = mma_bf16(vh[a], vh[a + 1], vh[a + 2], vh[a + 3], Kr[0], Kr[1],
                                      D[0], D[1], D[2], D[3])
    D[0], D[1], D[2], D[3] = mma_bf16(vh[a], vh[a + 1], vh[a + 2], vh[a + 3], Kr[2], Kr[3],
                                      D[0], D[1], D[2], D[3])
    D[0], D[1], D[2], D[3] = mma_bf16(vl[a], vl[a + 1], vl[a + 2], vl[a + 3], Kr[0], Kr[1],
                                      D[0], D[1], D[2], D[3])


@cute.jit
def _interior_checkpoint(pool: cute.Tensor, wCK: cute.Tensor, wCD: cute.Tensor, S: cute.Tensor,
                         vh: cute.Tensor, vl: cute.Tensor, D: cute.Tensor, slot: Int64,
                         unit: Int64, h: Int64, H: Int64, v0: Int64, g: Int64, t2: Int64,
                         lane: Int64, part: Int64, K: cutlass.Constexpr,
                         SPLIT: cutlass.Constexpr):
    """The state after the chunk's first p tokens, e^G_p S_0 + (k e^(G_p - G))[:p]^T Vnew[:p],
    from the operands the prep wrote for checkpoint unit `unit`, to pool[slot] (the warp's
    keys). Every operand is loaded before the first store: the pool's stores may alias them
    for all the compiler knows, so loads after a store would wait for it, one latency each."""
    NTW = K // 8 // SPLIT
    dst = _pool_tile(slot, h, H, v0, g, t2, part, K, SPLIT)
    keys = [cute.make_rmem_tensor(cute.make_layout(4), Int32) for _ in range(NTW * TOKEN_STEPS)]
    decays = [cute.make_rmem_tensor(cute.make_layout(2), Float32) for _ in range(NTW)]
    for nt in cutlass.range_constexpr(NTW):
        key_tile = part * NTW + nt
        cute.autovec_copy(wCD[(unit * K + key_tile * 8 + t2) // 2, None], decays[nt])
        for kk in cutlass.range_constexpr(TOKEN_STEPS):
            cute.autovec_copy(
                wCK[((unit * (K // 8) + key_tile) * TOKEN_STEPS + kk) * 32 + lane, None],
                keys[nt * TOKEN_STEPS + kk])
    for nt in cutlass.range_constexpr(NTW):
        b = nt * 4
        D[0] = S[b] * decays[nt][0]
        D[1] = S[b + 1] * decays[nt][1]
        D[2] = S[b + 2] * decays[nt][0]
        D[3] = S[b + 3] * decays[nt][1]
        for kk in cutlass.range_constexpr(TOKEN_STEPS):
            _update_step(D, vh, vl, keys[nt * TOKEN_STEPS + kk], kk)
        pool[dst + nt * 8] = D[0]
        pool[dst + nt * 8 + 1] = D[1]
        pool[dst + 8 * K + nt * 8] = D[2]
        pool[dst + 8 * K + nt * 8 + 1] = D[3]


@cute.jit
def kda_chunk_index(cu: cute.Tensor, live: cute.Tensor, err: cute.Tensor, co: cute.Tensor,
                    stream):
    chunk_index_kernel(cu, live, err, co).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)


@cute.jit
def kda_chunk_prep(
    q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, g: cute.Tensor, beta: cute.Tensor,
    A_log: cute.Tensor, dt_bias: cute.Tensor, cu: cute.Tensor, live: cute.Tensor,
    err: cute.Tensor, co: cute.Tensor, ck_off: cute.Tensor, ck_idx: cute.Tensor,
    wW: cute.Tensor, wQ: cute.Tensor, wKd: cute.Tensor, wA: cute.Tensor, wU: cute.Tensor,
    wGL: cute.Tensor, wCK: cute.Tensor, wCD: cute.Tensor, H: Int64, CK: Int64, base: Int64,
    count: Int64, scale: Float32, lower_bound: Float32, stream, K: cutlass.Constexpr,
    GATE: cutlass.Constexpr, QK_L2NORM: cutlass.Constexpr, BETA_SIGMOID: cutlass.Constexpr,
    WGMMA: cutlass.Constexpr,
):
    """Chunk slots base .. base + count - 1 of every head, the operands in the layout of the
    wgmma pass (WGMMA) or of the `mma.sync` pass."""
    chunk_prep_kernel(q, k, v, g, beta, A_log, dt_bias, cu, live, err, co, ck_off, ck_idx, wW,
                      wQ, wKd, wA, wU, wGL, wCK, wCD, H, CK, base, scale, lower_bound, K, GATE,
                      QK_L2NORM, BETA_SIGMOID, WGMMA).launch(
        grid=(Int32(count), Int32(H), 1), block=(PREP_THREADS, 1, 1), stream=stream)


@cute.jit
def kda_chunk_pass(
    out: cute.Tensor, pool: cute.Tensor, carry: cute.Tensor, cu: cute.Tensor,
    live: cute.Tensor, init_idx: cute.Tensor, final_idx: cute.Tensor, ck_off: cute.Tensor,
    ck_idx: cute.Tensor, err: cute.Tensor, co: cute.Tensor, wW: cute.Tensor, wQ: cute.Tensor,
    wKd: cute.Tensor, wA: cute.Tensor, wU: cute.Tensor, wGL: cute.Tensor, wCK: cute.Tensor,
    wCD: cute.Tensor, H: Int64, token_capacity: Int64, meta_capacity: Int64, edge: Int64,
    chunk_lo: Int64, chunk_hi: Int64, stream, K: cutlass.Constexpr, CK: cutlass.Constexpr,
    WARPS: cutlass.Constexpr, SPLIT: cutlass.Constexpr,
):
    """The pass over global chunks chunk_lo .. chunk_hi - 1, the edge-th range: a sequence
    entering it from the range before starts from carry[edge - 1], one leaving it ends in
    carry[edge]."""
    chunk_pass_kernel(out, pool, carry, cu, live, init_idx, final_idx, ck_off, ck_idx, err, co,
                      wW, wQ, wKd, wA, wU, wGL, wCK, wCD, H, token_capacity, meta_capacity,
                      edge, chunk_lo, chunk_hi, K, CK, WARPS, SPLIT).launch(
        grid=(Int32(meta_capacity), Int32(H), K // (PASS_COLUMNS * WARPS)),
        block=(32 * WARPS * SPLIT, 1, 1), stream=stream)
