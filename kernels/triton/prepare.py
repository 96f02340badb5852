"""Stage 1 of the prefill: everything inside a chunk that does not need the state.

One program per (global chunk, head), all in parallel. A chunk is CHUNK (64) tokens made of
SUB (16) token sub-blocks. With G the in-chunk cumulative log decay, the chunk's WY form is

    M = strict_lower(diag(beta) A),  A[i, j] = sum_k k[i, k] k[j, k] exp(G[i, k] - G[j, k])
    W = (I + M)^-1 diag(beta) k exp(G),  U = (I + M)^-1 diag(beta) v
    Aqk = lower(Q),  Q[i, j] = sum_k q[i, k] k[j, k] exp(G[i, k] - G[j, k])

exp(G[i] - G[j]) is never formed from exp(G) and exp(-G) over the whole chunk (with gates down
to -5, 64 tokens overflow fp32): each row sub-block I is anchored at its first row a, so the
factors are k[i] exp(G[i] - G[a]) <= 1 and k[j] exp(G[a] - G[j]), which is <= 1 for earlier
sub-blocks and <= exp(75) inside the diagonal one. (I + M)^-1 is applied by block forward
substitution: X_I = (I + M_II)^-1 (B_I - sum_{J < I} M_IJ X_J), with (I + M_II)^-1 from
repeated squaring. Everything runs on 16-row tiles (whole-chunk tiles of K = 128 columns spill
registers). Finished sub-blocks go to plan-owned workspaces (indexed by global chunk), where
later sub-blocks of the same program read them back after a barrier.

The state pass then needs only qg = q exp(G), kd = k exp(G_last - G), exp(G_last), W, U and Aqk
(see prefill.py); G itself is kept for checkpoints inside a chunk.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import chunk_of, load_keys, load_log_decay, row_of, unit_lower_inverse


@triton.jit
def _cumulative_decay(g, a_log, dt_bias, ws_G, ws_GL, bos, start, seqlen, chunk_row0, gl_row,
                      h, lower_bound, H: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr,
                      SUB: tl.constexpr, GATE: tl.constexpr):
    """G, the in-chunk cumulative log decay, one sub-block at a time; stores exp(G_last) too."""
    rs = tl.arange(0, SUB)
    rk = tl.arange(0, K)
    carry = tl.zeros((K,), tl.float32)
    for I in tl.static_range(CHUNK // SUB):
        local = I * SUB + rs
        tmask = start + local < seqlen
        gg = load_log_decay(g, a_log, dt_bias, (bos + start + local) * H + h, rk, tmask, h,
                            lower_bound, K, GATE)
        G = tl.cumsum(gg, axis=0) + carry[None, :]
        tl.store(ws_G + (chunk_row0 + local)[:, None] * K + rk[None, :], G)
        carry = row_of(G, rs, SUB - 1)
    tl.store(ws_GL + gl_row * K + rk, tl.exp(carry))
    return carry


@triton.jit
def _sub_block(q, k, v, beta, ws_G, ws_QG, ws_KD, ws_W, ws_U, ws_Aqk, G_last, bos, start, seqlen,
               chunk_row0, h, I, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               CHUNK: tl.constexpr, SUB: tl.constexpr, QK_L2NORM: tl.constexpr,
               BETA_SIGMOID: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """qg, kd, W, U and the Aqk rows of sub-block I (W and U from the finished sub-blocks J < I).

    kd goes to its workspace transposed ([K, CHUNK] per chunk), the layout the state pass's
    update dot consumes without a transpose."""
    rs = tl.arange(0, SUB)
    rk = tl.arange(0, K)
    rv = tl.arange(0, V)
    local = I * SUB + rs
    tmask = start + local < seqlen
    rows = (bos + start + local) * H + h
    ws_rows = chunk_row0 + local
    kk = load_keys(k, rows, rk, tmask, K, QK_L2NORM)
    qq = load_keys(q, rows, rk, tmask, K, QK_L2NORM)
    vv = tl.load(v + rows[:, None] * V + rv[None, :], mask=tmask[:, None], other=0.0)
    bb = tl.load(beta + rows, mask=tmask, other=0.0).to(tl.float32)
    if BETA_SIGMOID:
        bb = tl.where(tmask, tl.sigmoid(bb), 0.0)
    G = tl.load(ws_G + ws_rows[:, None] * K + rk[None, :])
    tl.store(ws_QG + ws_rows[:, None] * K + rk[None, :],
             (qq * tl.exp(G)).to(ws_QG.dtype.element_ty))
    tl.store(ws_KD + chunk_row0 * K + rk[None, :] * CHUNK + local[:, None],
             (kk * tl.exp(G_last[None, :] - G)).to(ws_KD.dtype.element_ty))
    G_anchor = row_of(G, rs, 0)
    k_down = kk * tl.exp(G - G_anchor[None, :])
    q_down = qq * tl.exp(G - G_anchor[None, :])
    k_up = kk * tl.exp(G_anchor[None, :] - G)

    M = tl.dot(k_down, tl.trans(k_up), input_precision=DOT_PRECISION) * bb[:, None]
    M = tl.where(rs[:, None] > rs[None, :], M, 0.0)
    inverse = unit_lower_inverse(M, SUB)
    Aqk = tl.dot(q_down, tl.trans(k_up), input_precision=DOT_PRECISION)
    Aqk = tl.where(rs[:, None] >= rs[None, :], Aqk, 0.0)
    aqk_rows = ws_Aqk + ws_rows[:, None] * CHUNK
    tl.store(aqk_rows + local[None, :], Aqk.to(ws_Aqk.dtype.element_ty))

    rhs_k = bb[:, None] * kk * tl.exp(G)
    rhs_v = bb[:, None] * vv.to(tl.float32)
    for J in range(I):
        cols = J * SUB + rs
        cols_tmask = start + cols < seqlen
        kj = load_keys(k, (bos + start + cols) * H + h, rk, cols_tmask, K, QK_L2NORM)
        Gj = tl.load(ws_G + (chunk_row0 + cols)[:, None] * K + rk[None, :])
        kj_up = kj * tl.exp(G_anchor[None, :] - Gj)
        Mj = tl.dot(k_down, tl.trans(kj_up), input_precision=DOT_PRECISION) * bb[:, None]
        Wj = tl.load(ws_W + (chunk_row0 + cols)[:, None] * K + rk[None, :]).to(tl.float32)
        Uj = tl.load(ws_U + (chunk_row0 + cols)[:, None] * V + rv[None, :])
        rhs_k -= tl.dot(Mj, Wj, input_precision=DOT_PRECISION)
        rhs_v -= tl.dot(Mj, Uj, input_precision=DOT_PRECISION)
        Aqk_j = tl.dot(q_down, tl.trans(kj_up), input_precision=DOT_PRECISION)
        tl.store(aqk_rows + cols[None, :], Aqk_j.to(ws_Aqk.dtype.element_ty))
    for J in range(I + 1, CHUNK // SUB):
        tl.store(aqk_rows + (J * SUB + rs)[None, :], tl.zeros((SUB, SUB), ws_Aqk.dtype.element_ty))
    W = tl.dot(inverse, rhs_k, input_precision=DOT_PRECISION)
    tl.store(ws_W + ws_rows[:, None] * K + rk[None, :], W.to(ws_W.dtype.element_ty))
    tl.store(ws_U + ws_rows[:, None] * V + rv[None, :],
             tl.dot(inverse, rhs_v, input_precision=DOT_PRECISION))


@triton.jit
def kda_chunk_prepare_kernel(
    q, k, v, g, beta, cu_seqlens, num_seqs_ptr, chunk_offsets, a_log, dt_bias, err_ptr,
    ws_G, ws_QG, ws_KD, ws_GL, ws_W, ws_U, ws_Aqk, lower_bound, num_chunk_slots,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, CHUNK: tl.constexpr,
    SUB: tl.constexpr, GATE: tl.constexpr, QK_L2NORM: tl.constexpr,
    BETA_SIGMOID: tl.constexpr, DOT_PRECISION: tl.constexpr, SEARCH_BLOCK: tl.constexpr,
):
    c = tl.program_id(0)
    h = tl.program_id(1)
    live, bos, start, seqlen = chunk_of(cu_seqlens, num_seqs_ptr, chunk_offsets, err_ptr, c,
                                        CHUNK, SEARCH_BLOCK)
    if live:
        gl_row = h * num_chunk_slots + c.to(tl.int64)
        chunk_row0 = gl_row * CHUNK
        G_last = _cumulative_decay(g, a_log, dt_bias, ws_G, ws_GL, bos, start, seqlen,
                                   chunk_row0, gl_row, h, lower_bound, H, K, CHUNK, SUB,
                                   GATE)
        tl.debug_barrier()
        for I in range(CHUNK // SUB):
            _sub_block(q, k, v, beta, ws_G, ws_QG, ws_KD, ws_W, ws_U, ws_Aqk, G_last, bos,
                       start, seqlen, chunk_row0, h, I, H, K, V, CHUNK, SUB, QK_L2NORM,
                       BETA_SIGMOID, DOT_PRECISION)
            tl.debug_barrier()
