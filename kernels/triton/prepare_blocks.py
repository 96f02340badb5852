"""Stage 1 of the split pipeline: the chunk's WY form (see prepare.py for the algebra and the
anchoring) from three kernels that are parallel within a chunk too (four with the inverse
solve).

- kda_chunk_decay_kernel, one program per (chunk, head): G and exp(G_last).
- kda_chunk_blocks_kernel, one program per (chunk, head, row sub-block I): qg = q exp(G),
  kd = k exp(G_last - G) (stored transposed, [K, CHUNK] per chunk), the Aqk rows of I, and row
  block I of the solve's matrix: M_IJ for J < I and (I + M_II)^-1 (repeated squaring) in place
  of the diagonal block. Each key slice of KS columns is one [16, KS] x [KS, CHUNK] product
  per matrix against all of the chunk's earlier rows at once, so every program makes K / KS
  trips whatever its I (v9; before, row block I made (I + 1) K / KS trips of 16 x 16 products).
- kda_chunk_solve_kernel, one program per (chunk, head, column block of W or U): block forward
  substitution X_I = (I + M_II)^-1 (B_I - sum_{J < I} M_IJ X_J) with the sub-blocks in
  registers (KernelConfig.solve "substitution"), or, after kda_chunk_inverse_kernel has made
  the chunk's whole inverse T = (I + M)^-1 once per (chunk, head) in ws_A ("inverse"), one
  program per (chunk, head, column block of both) with two [CHUNK, CHUNK] x [CHUNK, BC]
  products W = T B_W and U = T B_U, so that no program walks the sub-blocks' dependent chain
  and T is read once per column block.

They fill the same workspaces as kda_chunk_prepare_kernel, plus ws_A (the solve's matrix).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import chunk_of, load_keys, load_log_decay, row_of, unit_lower_inverse


@triton.jit
def kda_chunk_decay_kernel(
    g, a_log, dt_bias, cu_seqlens, num_seqs_ptr, chunk_offsets, err_ptr, ws_G, ws_GL,
    lower_bound, num_chunk_slots, chunk_base, H: tl.constexpr, K: tl.constexpr,
    CHUNK: tl.constexpr, GATE: tl.constexpr, SEARCH_BLOCK: tl.constexpr,
):
    """G, the in-chunk cumulative log decay, and exp(G_last), per (chunk, head), for the
    chunks from chunk_base on."""
    c = chunk_base + tl.program_id(0)
    h = tl.program_id(1)
    live, bos, start, seqlen = chunk_of(cu_seqlens, num_seqs_ptr, chunk_offsets, err_ptr, c,
                                         CHUNK, SEARCH_BLOCK)
    if live:
        rc = tl.arange(0, CHUNK)
        rk = tl.arange(0, K)
        gl_row = h * num_chunk_slots + c.to(tl.int64)
        gg = load_log_decay(g, a_log, dt_bias, (bos + start + rc) * H + h, rk,
                            start + rc < seqlen, h, lower_bound, K, GATE)
        G = tl.cumsum(gg, axis=0)
        tl.store(ws_G + (gl_row * CHUNK + rc)[:, None] * K + rk[None, :], G)
        tl.store(ws_GL + gl_row * K + rk, tl.exp(row_of(G, rc, CHUNK - 1)))


@triton.jit
def _inverse_norms(x, rows, rk, tmask, K: tl.constexpr, L2NORM: tl.constexpr):
    """1 / ||x row|| per row (ones without L2NORM), so K slices can be normalised one by one."""
    if L2NORM:
        full = load_keys(x, rows, rk, tmask, K, False)
        return tl.rsqrt(tl.sum(full * full, axis=1) + 1e-6)
    return tl.where(tmask, 1.0, 1.0)


@triton.jit
def _key_slice(x, norms, rows, cols, tmask, K: tl.constexpr):
    """Columns `cols` of q or k rows in fp32, normalised by `norms`."""
    xx = tl.load(x + rows[:, None] * K + cols[None, :], mask=tmask[:, None], other=0.0)
    return xx.to(tl.float32) * norms[:, None]


@triton.jit
def kda_chunk_blocks_kernel(
    q, k, beta, cu_seqlens, num_seqs_ptr, chunk_offsets, err_ptr,
    ws_G, ws_QG, ws_KD, ws_A, ws_Aqk, num_chunk_slots, chunk_base,
    H: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr,
    KS: tl.constexpr, QK_L2NORM: tl.constexpr, BETA_SIGMOID: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SEARCH_BLOCK: tl.constexpr,
):
    """Row block I of M and Aqk against the whole chunk, one [SUB, KS] x [KS, CHUNK] product
    per key slice: both sides anchored at the block's first row (the right side is kept to
    the chunk's first (I + 1) SUB rows, where exp(G_anchor - G) <= exp(SUB |lower bound|) is
    finite); the diagonal block is then read back and inverted in place. Chunks from
    chunk_base on."""
    c = chunk_base + tl.program_id(0)
    h = tl.program_id(1)
    I = tl.program_id(2)
    live, bos, start, seqlen = chunk_of(cu_seqlens, num_seqs_ptr, chunk_offsets, err_ptr, c,
                                         CHUNK, SEARCH_BLOCK)
    if live:
        rs = tl.arange(0, SUB)
        rc = tl.arange(0, CHUNK)
        rk = tl.arange(0, K)
        gl_row = h * num_chunk_slots + c.to(tl.int64)
        chunk_row0 = gl_row * CHUNK
        local = I * SUB + rs
        tmask = start + local < seqlen
        rows = (bos + start + local) * H + h
        ws_rows = chunk_row0 + local
        # the right side: the chunk's rows up to the end of block I (later ones are upper)
        right = (rc < (I + 1) * SUB) & (start + rc < seqlen)
        rows_c = (bos + start + rc) * H + h
        k_norms = _inverse_norms(k, rows, rk, tmask, K, QK_L2NORM)
        q_norms = _inverse_norms(q, rows, rk, tmask, K, QK_L2NORM)
        bb = tl.load(beta + rows, mask=tmask, other=0.0).to(tl.float32)
        if BETA_SIGMOID:
            bb = tl.where(tmask, tl.sigmoid(bb), 0.0)

        M = tl.zeros((SUB, CHUNK), tl.float32)
        Aqk = tl.zeros((SUB, CHUNK), tl.float32)
        right_sumsq = tl.zeros((CHUNK,), tl.float32)
        for s in range(K // KS):
            cols = s * KS + tl.arange(0, KS)
            G = tl.load(ws_G + ws_rows[:, None] * K + cols[None, :])
            G_last = tl.load(ws_G + (chunk_row0 + CHUNK - 1) * K + cols)
            G_anchor = tl.load(ws_G + (chunk_row0 + I * SUB) * K + cols)
            kk = _key_slice(k, k_norms, rows, cols, tmask, K)
            qq = _key_slice(q, q_norms, rows, cols, tmask, K)
            tl.store(ws_QG + ws_rows[:, None] * K + cols[None, :],
                     (qq * tl.exp(G)).to(ws_QG.dtype.element_ty))
            tl.store(ws_KD + chunk_row0 * K + cols[None, :] * CHUNK + local[:, None],
                     (kk * tl.exp(G_last[None, :] - G)).to(ws_KD.dtype.element_ty))
            down = tl.exp(G - G_anchor[None, :])
            G_right = tl.load(ws_G + (chunk_row0 + rc)[:, None] * K + cols[None, :],
                              mask=right[:, None], other=0.0)
            k_right = tl.load(k + rows_c[:, None] * K + cols[None, :], mask=right[:, None],
                              other=0.0).to(tl.float32)
            if QK_L2NORM:
                right_sumsq += tl.sum(k_right * k_right, axis=1)
            k_up = tl.trans(k_right * tl.exp(G_anchor[None, :] - G_right))
            M += tl.dot(kk * down, k_up, input_precision=DOT_PRECISION)
            Aqk += tl.dot(qq * down, k_up, input_precision=DOT_PRECISION)
        if QK_L2NORM:
            right_norms = tl.rsqrt(right_sumsq + 1e-6)
            M = M * right_norms[None, :]
            Aqk = Aqk * right_norms[None, :]
        a_rows = ws_A + ws_rows[:, None] * CHUNK
        aqk_rows = ws_Aqk + ws_rows[:, None] * CHUNK
        tl.store(aqk_rows + rc[None, :],
                 tl.where(rc[None, :] <= local[:, None], Aqk, 0.0).to(ws_Aqk.dtype.element_ty))
        # strictly lower rows of M times beta; the diagonal block goes through memory to be
        # inverted as a [SUB, SUB] tile (registers cannot be sliced)
        lower = rc[None, :] < local[:, None]
        tl.store(a_rows + rc[None, :], M * bb[:, None], mask=lower)
        diagonal = a_rows + local[None, :]
        tl.store(diagonal, tl.zeros((SUB, SUB), tl.float32), mask=rs[:, None] <= rs[None, :])
        tl.debug_barrier()
        M_diag = tl.load(diagonal)
        tl.debug_barrier()
        tl.store(diagonal, unit_lower_inverse(M_diag, SUB))


@triton.jit
def _block(a_row0, I, J, CHUNK: tl.constexpr, SUB: tl.constexpr):
    """Sub-block (I, J) of a chunk's [CHUNK, CHUNK] matrix in ws_A (a_row0: its first row)."""
    rs = tl.arange(0, SUB)
    return tl.load(a_row0 + (I * SUB + rs)[:, None] * CHUNK + J * SUB + rs[None, :])


@triton.jit
def _store_block(a_row0, I, J, X, CHUNK: tl.constexpr, SUB: tl.constexpr):
    rs = tl.arange(0, SUB)
    tl.store(a_row0 + (I * SUB + rs)[:, None] * CHUNK + J * SUB + rs[None, :], X)


@triton.jit
def kda_chunk_inverse_kernel(
    cu_seqlens, num_seqs_ptr, chunk_offsets, err_ptr, ws_A, num_chunk_slots, chunk_base,
    CHUNK: tl.constexpr, SUB: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SEARCH_BLOCK: tl.constexpr,
):
    """T = (I + M)^-1 for a chunk of two or four sub-blocks, in place of M's strictly lower
    blocks in ws_A (the blocks kernel left the diagonal blocks' inverses D_I there): block
    forward substitution on the identity, T_II = D_I and
    T_IJ = -D_I sum_{J <= L < I} M_IL T_LJ. Every block is read before any is written."""
    tl.static_assert(CHUNK == 2 * SUB or CHUNK == 4 * SUB,
                     "the inverse is written out for 2 or 4 sub-blocks")
    c = chunk_base + tl.program_id(0)
    h = tl.program_id(1)
    live = chunk_of(cu_seqlens, num_seqs_ptr, chunk_offsets, err_ptr, c, CHUNK, SEARCH_BLOCK)[0]
    if live:
        a_row0 = ws_A + (h * num_chunk_slots + c.to(tl.int64)) * CHUNK * CHUNK
        D0 = _block(a_row0, 0, 0, CHUNK, SUB)
        D1 = _block(a_row0, 1, 1, CHUNK, SUB)
        T10 = -tl.dot(D1, tl.dot(_block(a_row0, 1, 0, CHUNK, SUB), D0,
                                 input_precision=DOT_PRECISION), input_precision=DOT_PRECISION)
        if CHUNK == 4 * SUB:
            D2 = _block(a_row0, 2, 2, CHUNK, SUB)
            D3 = _block(a_row0, 3, 3, CHUNK, SUB)
            M20 = _block(a_row0, 2, 0, CHUNK, SUB)
            M21 = _block(a_row0, 2, 1, CHUNK, SUB)
            M30 = _block(a_row0, 3, 0, CHUNK, SUB)
            M31 = _block(a_row0, 3, 1, CHUNK, SUB)
            M32 = _block(a_row0, 3, 2, CHUNK, SUB)
            T21 = -tl.dot(D2, tl.dot(M21, D1, input_precision=DOT_PRECISION),
                          input_precision=DOT_PRECISION)
            T20 = -tl.dot(D2, tl.dot(M20, D0, input_precision=DOT_PRECISION)
                          + tl.dot(M21, T10, input_precision=DOT_PRECISION),
                          input_precision=DOT_PRECISION)
            T32 = -tl.dot(D3, tl.dot(M32, D2, input_precision=DOT_PRECISION),
                          input_precision=DOT_PRECISION)
            T31 = -tl.dot(D3, tl.dot(M31, D1, input_precision=DOT_PRECISION)
                          + tl.dot(M32, T21, input_precision=DOT_PRECISION),
                          input_precision=DOT_PRECISION)
            T30 = -tl.dot(D3, tl.dot(M30, D0, input_precision=DOT_PRECISION)
                          + tl.dot(M31, T10, input_precision=DOT_PRECISION)
                          + tl.dot(M32, T20, input_precision=DOT_PRECISION),
                          input_precision=DOT_PRECISION)
            tl.debug_barrier()
            _store_block(a_row0, 2, 0, T20, CHUNK, SUB)
            _store_block(a_row0, 2, 1, T21, CHUNK, SUB)
            _store_block(a_row0, 3, 0, T30, CHUNK, SUB)
            _store_block(a_row0, 3, 1, T31, CHUNK, SUB)
            _store_block(a_row0, 3, 2, T32, CHUNK, SUB)
        tl.debug_barrier()
        _store_block(a_row0, 1, 0, T10, CHUNK, SUB)


@triton.jit
def _right_side(k, v, beta, ws_G, bos, start, seqlen, chunk_row0, h, local, rk, cols,
                IS_W: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                QK_L2NORM: tl.constexpr, BETA_SIGMOID: tl.constexpr):
    """Rows `local` of the chunk's right side, columns `cols`: beta k exp(G) for W, beta v
    for U."""
    tmask = start + local < seqlen
    rows = (bos + start + local) * H + h
    bb = tl.load(beta + rows, mask=tmask, other=0.0).to(tl.float32)
    if BETA_SIGMOID:
        bb = tl.where(tmask, tl.sigmoid(bb), 0.0)
    if IS_W:
        x = tl.load(k + rows[:, None] * K + cols[None, :], mask=tmask[:, None], other=0.0)
        x = x.to(tl.float32)
        if QK_L2NORM:
            full = load_keys(k, rows, rk, tmask, K, False)
            x = x * tl.rsqrt(tl.sum(full * full, axis=1) + 1e-6)[:, None]
        x = x * tl.exp(tl.load(ws_G + (chunk_row0 + local)[:, None] * K + cols[None, :]))
    else:
        x = tl.load(v + rows[:, None] * V + cols[None, :], mask=tmask[:, None], other=0.0)
        x = x.to(tl.float32)
    return bb[:, None] * x


@triton.jit
def _solve_columns(k, v, beta, ws_G, ws_A, out_ptr, out_stride, bos, start, seqlen, chunk_row0,
                   h, cols, IS_W: tl.constexpr, H: tl.constexpr, K: tl.constexpr,
                   V: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr,
                   QK_L2NORM: tl.constexpr, BETA_SIGMOID: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    """X = (I + M)^-1 B for one column block by block forward substitution, written to
    out_ptr's rows of this chunk."""
    rs = tl.arange(0, SUB)
    rk = tl.arange(0, K)
    a_row0 = ws_A + chunk_row0 * CHUNK
    X0 = tl.dot(tl.load(a_row0 + rs[:, None] * CHUNK + rs[None, :]),
                _right_side(k, v, beta, ws_G, bos, start, seqlen, chunk_row0, h, rs, rk,
                            cols, IS_W, H, K, V, QK_L2NORM, BETA_SIGMOID),
                input_precision=DOT_PRECISION)
    tl.store(out_ptr + (chunk_row0 + rs)[:, None] * out_stride + cols[None, :],
             X0.to(out_ptr.dtype.element_ty))
    if CHUNK >= 2 * SUB:
        r1 = SUB + rs
        b = _right_side(k, v, beta, ws_G, bos, start, seqlen, chunk_row0, h, r1, rk,
                        cols, IS_W, H, K, V, QK_L2NORM, BETA_SIGMOID)
        b -= tl.dot(tl.load(a_row0 + r1[:, None] * CHUNK + rs[None, :]), X0,
                    input_precision=DOT_PRECISION)
        X1 = tl.dot(tl.load(a_row0 + r1[:, None] * CHUNK + r1[None, :]), b,
                    input_precision=DOT_PRECISION)
        tl.store(out_ptr + (chunk_row0 + r1)[:, None] * out_stride + cols[None, :],
                 X1.to(out_ptr.dtype.element_ty))
    if CHUNK >= 4 * SUB:
        r2 = 2 * SUB + rs
        b = _right_side(k, v, beta, ws_G, bos, start, seqlen, chunk_row0, h, r2, rk,
                        cols, IS_W, H, K, V, QK_L2NORM, BETA_SIGMOID)
        b -= tl.dot(tl.load(a_row0 + r2[:, None] * CHUNK + rs[None, :]), X0,
                    input_precision=DOT_PRECISION)
        b -= tl.dot(tl.load(a_row0 + r2[:, None] * CHUNK + r1[None, :]), X1,
                    input_precision=DOT_PRECISION)
        X2 = tl.dot(tl.load(a_row0 + r2[:, None] * CHUNK + r2[None, :]), b,
                    input_precision=DOT_PRECISION)
        tl.store(out_ptr + (chunk_row0 + r2)[:, None] * out_stride + cols[None, :],
                 X2.to(out_ptr.dtype.element_ty))
        r3 = 3 * SUB + rs
        b = _right_side(k, v, beta, ws_G, bos, start, seqlen, chunk_row0, h, r3, rk,
                        cols, IS_W, H, K, V, QK_L2NORM, BETA_SIGMOID)
        b -= tl.dot(tl.load(a_row0 + r3[:, None] * CHUNK + rs[None, :]), X0,
                    input_precision=DOT_PRECISION)
        b -= tl.dot(tl.load(a_row0 + r3[:, None] * CHUNK + r1[None, :]), X1,
                    input_precision=DOT_PRECISION)
        b -= tl.dot(tl.load(a_row0 + r3[:, None] * CHUNK + r2[None, :]), X2,
                    input_precision=DOT_PRECISION)
        X3 = tl.dot(tl.load(a_row0 + r3[:, None] * CHUNK + r3[None, :]), b,
                    input_precision=DOT_PRECISION)
        tl.store(out_ptr + (chunk_row0 + r3)[:, None] * out_stride + cols[None, :],
                 X3.to(out_ptr.dtype.element_ty))


@triton.jit
def _columns_from_inverse(k, v, beta, ws_G, ws_A, ws_W, ws_U, bos, start, seqlen, chunk_row0, h,
                          cols, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          CHUNK: tl.constexpr, QK_L2NORM: tl.constexpr,
                          BETA_SIGMOID: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Columns `cols` of both W = T B_W and U = T B_U from the chunk's inverse T in ws_A: one
    read of T serves both."""
    rc = tl.arange(0, CHUNK)
    rk = tl.arange(0, K)
    rows = chunk_row0 + rc
    # only the lower triangle of ws_A is written: the upper one holds stale values
    T = tl.load(ws_A + rows[:, None] * CHUNK + rc[None, :], mask=rc[None, :] <= rc[:, None],
                other=0.0)
    B = _right_side(k, v, beta, ws_G, bos, start, seqlen, chunk_row0, h, rc, rk, cols, True, H,
                    K, V, QK_L2NORM, BETA_SIGMOID)
    tl.store(ws_W + rows[:, None] * K + cols[None, :],
             tl.dot(T, B, input_precision=DOT_PRECISION).to(ws_W.dtype.element_ty))
    B = _right_side(k, v, beta, ws_G, bos, start, seqlen, chunk_row0, h, rc, rk, cols, False, H,
                    K, V, QK_L2NORM, BETA_SIGMOID)
    tl.store(ws_U + rows[:, None] * V + cols[None, :],
             tl.dot(T, B, input_precision=DOT_PRECISION).to(ws_U.dtype.element_ty))


@triton.jit
def kda_chunk_solve_kernel(
    k, v, beta, cu_seqlens, num_seqs_ptr, chunk_offsets, err_ptr, ws_G, ws_A, ws_W, ws_U,
    num_chunk_slots, chunk_base, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    CHUNK: tl.constexpr, SUB: tl.constexpr, BC: tl.constexpr, QK_L2NORM: tl.constexpr,
    BETA_SIGMOID: tl.constexpr, DOT_PRECISION: tl.constexpr, SEARCH_BLOCK: tl.constexpr,
    INVERSE: tl.constexpr,
):
    """W and U for the chunks from chunk_base on: one column block of W or U per program by
    substitution, or (INVERSE) one column block of both from the inverse that
    kda_chunk_inverse_kernel left in ws_A."""
    tl.static_assert(CHUNK == SUB or CHUNK == 2 * SUB or CHUNK == 4 * SUB,
                     "the solve is written out for 1, 2 or 4 sub-blocks")
    c = chunk_base + tl.program_id(0)
    h = tl.program_id(1)
    part = tl.program_id(2)
    live, bos, start, seqlen = chunk_of(cu_seqlens, num_seqs_ptr, chunk_offsets, err_ptr, c,
                                         CHUNK, SEARCH_BLOCK)
    if live:
        chunk_row0 = (h * num_chunk_slots + c.to(tl.int64)) * CHUNK
        if INVERSE:
            _columns_from_inverse(k, v, beta, ws_G, ws_A, ws_W, ws_U, bos, start, seqlen,
                                  chunk_row0, h, part * BC + tl.arange(0, BC), H, K, V, CHUNK,
                                  QK_L2NORM, BETA_SIGMOID, DOT_PRECISION)
        elif part < K // BC:
            _solve_columns(k, v, beta, ws_G, ws_A, ws_W, K, bos, start, seqlen, chunk_row0, h,
                           part * BC + tl.arange(0, BC), True, H, K, V, CHUNK, SUB, QK_L2NORM,
                           BETA_SIGMOID, DOT_PRECISION)
        else:
            _solve_columns(k, v, beta, ws_G, ws_A, ws_U, V, bos, start, seqlen, chunk_row0, h,
                           (part - K // BC) * BC + tl.arange(0, BC), False, H, K, V, CHUNK, SUB,
                           QK_L2NORM, BETA_SIGMOID, DOT_PRECISION)
