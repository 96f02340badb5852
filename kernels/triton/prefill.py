"""Chunked KDA prefill with interior checkpoint export, fused in one Triton kernel.

One program owns (sequence, V block, head) and walks the sequence in chunks of CHUNK tokens,
keeping the fp32 state S [K, BV] in registers. Per chunk, with G the in-chunk cumulative log
decay (no re-anchoring: with gates >= -5 and 16-token chunks exp(+-G) stays inside fp32):

    kg = k exp(G), kn = k exp(-G), qg = q exp(G), kd = k exp(G_last - G)
    Tinv = (I + diag(beta) strict_lower(kg kn^T))^-1          (by repeated squaring)
    delta = Tinv diag(beta) (v - kg S)                          (the delta-rule corrections)
    o = scale (qg S + lower(qg kn^T) delta)
    S <- exp(G_last) S + kd^T delta

A checkpoint at in-chunk position p < CHUNK is the same update truncated to the chunk's first p
tokens; one at p == CHUNK is the chunk-end state itself, so aligned checkpoints equal, bit for
bit, the final state of a run over the prefix. The chunk mirror in kdabench.oracles spells out
the same algorithm in plain torch.
"""

from __future__ import annotations

import triton
import triton.language as tl

GATE_PRECOMPUTED = 0
GATE_SIGMOID = 1
GATE_SOFTPLUS = 2


@triton.jit
def _pick(values, lane, c):
    """Scalar at position c of a 1-D tensor (lane = arange over its length)."""
    return tl.sum(tl.where(lane == c, values, 0), axis=0)


@triton.jit
def _row(matrix, rows, i):
    """Row i of a 2-D tensor as a 1-D tensor (rows = arange over its first dimension)."""
    return tl.sum(tl.where(rows[:, None] == i, matrix, 0.0), axis=0)


@triton.jit
def _unit_lower_inverse(M, CHUNK: tl.constexpr):
    """(I + M)^-1 for strictly lower-triangular M [16, 16]: M is nilpotent (M^16 = 0), so
    (I + M)^-1 = (I - M)(I + M^2)(I + M^4)(I + M^8), six small fp32 products."""
    tl.static_assert(CHUNK == 16, "the squaring inverse needs M^16 = 0 and 16-wide dots")
    rc = tl.arange(0, CHUNK)
    eye = tl.where(rc[:, None] == rc[None, :], 1.0, 0.0)
    M2 = tl.dot(M, M, input_precision="ieee")
    M4 = tl.dot(M2, M2, input_precision="ieee")
    M8 = tl.dot(M4, M4, input_precision="ieee")
    inv = tl.dot(eye - M, eye + M2, input_precision="ieee")
    inv = tl.dot(inv, eye + M4, input_precision="ieee")
    return tl.dot(inv, eye + M8, input_precision="ieee")


@triton.jit
def _pool_tile(pool, slot, h, rk, rv, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """Pointers to the [K, BV] tile of pool slot `slot`, head h (pool is [slots, H, V, K])."""
    base = (slot.to(tl.int64) * H + h) * (V * K)
    return pool + base + rv[None, :].to(tl.int64) * K + rk[:, None]


@triton.jit
def _fill_nan(out, n, iv, h, token_capacity, meta_capacity,
              H: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, FILL_ROWS: tl.constexpr):
    """Poison this program's share of the whole output capacity with NaN."""
    rr = tl.arange(0, FILL_ROWS)
    rv = iv * BV + tl.arange(0, BV)
    nan = tl.full((FILL_ROWS, BV), float("nan"), tl.float32)
    for r0 in range(n * FILL_ROWS, token_capacity, meta_capacity * FILL_ROWS):
        rows = (r0 + rr).to(tl.int64)
        ptrs = out + (rows[:, None] * H + h) * V + rv[None, :]
        tl.store(ptrs, nan.to(out.dtype.element_ty), mask=rows[:, None] < token_capacity)


@triton.jit
def _load_gate(g, a_log, dt_bias, rows, rk, tmask, h, lower_bound,
               K: tl.constexpr, GATE: tl.constexpr):
    """Per-channel log decay [CHUNK, K] in fp32, zero on padded rows."""
    gg = tl.load(g + rows[:, None] * K + rk[None, :], mask=tmask[:, None], other=0.0)
    gg = gg.to(tl.float32)
    if GATE == 1:
        a = tl.exp(tl.load(a_log + h).to(tl.float32))
        x = gg + tl.load(dt_bias + h * K + rk).to(tl.float32)[None, :]
        gg = lower_bound * tl.sigmoid(a * x)
    elif GATE == 2:
        a = tl.exp(tl.load(a_log + h).to(tl.float32))
        x = gg + tl.load(dt_bias + h * K + rk).to(tl.float32)[None, :]
        softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
        gg = tl.maximum(-a * softplus, lower_bound)
    return tl.where(tmask[:, None], gg, 0.0)


@triton.jit
def _prefill_sequence(
    q, k, v, g, beta, out, pool, cu_seqlens, init_idx, final_idx, ck_off, ck_idx,
    a_log, dt_bias, scale, lower_bound, n, iv, h,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    CHUNK: tl.constexpr, CK: tl.constexpr, GATE: tl.constexpr,
    QK_L2NORM: tl.constexpr, BETA_SIGMOID: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    bos = tl.load(cu_seqlens + n).to(tl.int64)
    seqlen = tl.load(cu_seqlens + n + 1).to(tl.int64) - bos
    rk = tl.arange(0, K)
    rv = iv * BV + tl.arange(0, BV)
    rc = tl.arange(0, CHUNK)
    rck = tl.arange(0, CK)

    init_slot = tl.load(init_idx + n).to(tl.int64)
    has_init = (rk[:, None] * 0 + rv[None, :] * 0 + init_slot) >= 0  # a full mask: the interpreter rejects scalar ones
    state = tl.load(_pool_tile(pool, tl.maximum(init_slot, 0), h, rk, rv, H, K, V),
                    mask=has_init, other=0.0)
    ck_offsets = tl.load(ck_off + n * CK + rck).to(tl.int64)
    ck_slots = tl.load(ck_idx + n * CK + rck).to(tl.int64)

    for chunk_start in range(0, seqlen, CHUNK):
        tmask = chunk_start + rc < seqlen
        rows = (bos + chunk_start + rc) * H + h
        qq = tl.load(q + rows[:, None] * K + rk[None, :], mask=tmask[:, None], other=0.0)
        kk = tl.load(k + rows[:, None] * K + rk[None, :], mask=tmask[:, None], other=0.0)
        vv = tl.load(v + rows[:, None] * V + rv[None, :], mask=tmask[:, None], other=0.0)
        qq = qq.to(tl.float32)
        kk = kk.to(tl.float32)
        vv = vv.to(tl.float32)
        bb = tl.load(beta + rows, mask=tmask, other=0.0).to(tl.float32)
        if BETA_SIGMOID:
            bb = tl.where(tmask, tl.sigmoid(bb), 0.0)
        if QK_L2NORM:
            qq = qq * tl.rsqrt(tl.sum(qq * qq, axis=1) + 1e-6)[:, None]
            kk = kk * tl.rsqrt(tl.sum(kk * kk, axis=1) + 1e-6)[:, None]
        gg = _load_gate(g, a_log, dt_bias, rows, rk, tmask, h, lower_bound, K, GATE)

        G = tl.cumsum(gg, axis=0)
        G_last = _row(G, rc, CHUNK - 1)
        kg = kk * tl.exp(G)
        kn = kk * tl.exp(-G)
        qg = qq * tl.exp(G)
        kd = kk * tl.exp(G_last[None, :] - G)

        A = tl.dot(kg, tl.trans(kn), input_precision=DOT_PRECISION)
        M = tl.where(rc[:, None] > rc[None, :], A, 0.0) * bb[:, None]
        Tinv = _unit_lower_inverse(M, CHUNK)
        Aqk = tl.dot(qg, tl.trans(kn), input_precision=DOT_PRECISION)
        Aqk = tl.where(rc[:, None] >= rc[None, :], Aqk, 0.0)

        R = bb[:, None] * (vv - tl.dot(kg, state, input_precision=DOT_PRECISION))
        delta = tl.dot(Tinv, R, input_precision=DOT_PRECISION)
        o = tl.dot(qg, state, input_precision=DOT_PRECISION)
        o = scale * (o + tl.dot(Aqk, delta, input_precision=DOT_PRECISION))
        tl.store(out + rows[:, None] * V + rv[None, :], o.to(out.dtype.element_ty),
                 mask=tmask[:, None])
        new_state = tl.exp(G_last)[:, None] * state
        new_state += tl.dot(tl.trans(kd), delta, input_precision=DOT_PRECISION)

        chunk_end = chunk_start + CHUNK
        hits = (ck_slots >= 0) & (ck_offsets > chunk_start) & (ck_offsets <= chunk_end)
        if tl.sum(hits.to(tl.int32), axis=0) > 0:
            for c in tl.static_range(CK):
                offset = _pick(ck_offsets, rck, c)
                slot = _pick(ck_slots, rck, c)
                if (slot >= 0) & (offset > chunk_start) & (offset <= chunk_end):
                    p = offset - chunk_start
                    Gp = _row(G, rc, p - 1)
                    kp = tl.where(rc[:, None] < p, kk * tl.exp(Gp[None, :] - G), 0.0)
                    partial = tl.exp(Gp)[:, None] * state
                    partial += tl.dot(tl.trans(kp), delta, input_precision=DOT_PRECISION)
                    partial = tl.where(p == CHUNK, new_state, partial)
                    tl.store(_pool_tile(pool, slot, h, rk, rv, H, K, V), partial)
        state = new_state

    final_slot = tl.load(final_idx + n).to(tl.int64)
    if final_slot >= 0:
        tl.store(_pool_tile(pool, final_slot, h, rk, rv, H, K, V), state)


@triton.jit
def kda_prefill_kernel(
    q, k, v, g, beta, out, pool, cu_seqlens, num_seqs_ptr, init_idx, final_idx,
    ck_off, ck_idx, a_log, dt_bias, err_ptr,
    scale, lower_bound, token_capacity, meta_capacity,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    CHUNK: tl.constexpr, CK: tl.constexpr, GATE: tl.constexpr,
    QK_L2NORM: tl.constexpr, BETA_SIGMOID: tl.constexpr, DOT_PRECISION: tl.constexpr,
    FILL_ROWS: tl.constexpr,
):
    n = tl.program_id(0)
    iv = tl.program_id(1)
    h = tl.program_id(2)
    if tl.load(err_ptr) != 0:
        _fill_nan(out, n, iv, h, token_capacity, meta_capacity, H, V, BV, FILL_ROWS)
    elif n < tl.load(num_seqs_ptr):
        _prefill_sequence(
            q, k, v, g, beta, out, pool, cu_seqlens, init_idx, final_idx, ck_off, ck_idx,
            a_log, dt_bias, scale, lower_bound, n, iv, h,
            H, K, V, BV, CHUNK, CK, GATE, QK_L2NORM, BETA_SIGMOID, DOT_PRECISION,
        )
