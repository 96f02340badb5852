"""Stage 2 of the prefill: the sequential state pass, with interior checkpoint export.

One program owns (sequence, V block, head) and walks the sequence's 16-token chunks, keeping
the fp32 state S [K, BV] in registers. From stage 1's G, W, U, Aqk (see prepare.py):

    delta = U - W S
    o = scale (q exp(G) S + Aqk delta)
    S <- exp(G_last) S + (k exp(G_last - G))^T delta

A checkpoint at in-chunk position p < 16 is the same update truncated to the chunk's first p
tokens; one at p == 16 is the chunk-end state itself, so aligned checkpoints equal, bit for bit,
the final state of a run over the prefix. The chunk mirror in kdabench.oracles spells out the
same algorithm in plain torch. On a non-zero error code the program only poisons its share
of the output with NaN and never touches the pool.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import load_keys, pick, pool_tile, row_of


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
def _state_pass(
    q, k, out, pool, cu_seqlens, chunk_offsets, init_idx, final_idx, ck_off, ck_idx,
    ws_G, ws_W, ws_U, ws_Aqk, scale, num_chunk_slots, n, iv, h,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    CHUNK: tl.constexpr, CK: tl.constexpr, QK_L2NORM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    bos = tl.load(cu_seqlens + n).to(tl.int64)
    seqlen = tl.load(cu_seqlens + n + 1).to(tl.int64) - bos
    first_chunk = tl.load(chunk_offsets + n).to(tl.int64)
    rk = tl.arange(0, K)
    rv = iv * BV + tl.arange(0, BV)
    rc = tl.arange(0, CHUNK)
    rck = tl.arange(0, CK)

    init_slot = tl.load(init_idx + n).to(tl.int64)
    has_init = (rk[:, None] * 0 + rv[None, :] * 0 + init_slot) >= 0  # full mask for the interpreter
    state = tl.load(pool_tile(pool, tl.maximum(init_slot, 0), h, rk, rv, H, K, V),
                    mask=has_init, other=0.0)
    ck_offsets = tl.load(ck_off + n * CK + rck).to(tl.int64)
    ck_slots = tl.load(ck_idx + n * CK + rck).to(tl.int64)

    for start in range(0, seqlen, CHUNK):
        tmask = start + rc < seqlen
        rows = (bos + start + rc) * H + h
        ws_rows = (h * num_chunk_slots + first_chunk + start // CHUNK) * CHUNK + rc
        G = tl.load(ws_G + ws_rows[:, None] * K + rk[None, :])
        W = tl.load(ws_W + ws_rows[:, None] * K + rk[None, :])
        U = tl.load(ws_U + ws_rows[:, None] * V + rv[None, :])
        Aqk = tl.load(ws_Aqk + ws_rows[:, None] * CHUNK + rc[None, :])
        qq = load_keys(q, rows, rk, tmask, K, QK_L2NORM)
        kk = load_keys(k, rows, rk, tmask, K, QK_L2NORM)
        G_last = row_of(G, rc, CHUNK - 1)
        qg = qq * tl.exp(G)
        kd = kk * tl.exp(G_last[None, :] - G)

        delta = U - tl.dot(W, state, input_precision=DOT_PRECISION)
        o = tl.dot(qg, state, input_precision=DOT_PRECISION)
        o = scale * (o + tl.dot(Aqk, delta, input_precision=DOT_PRECISION))
        tl.store(out + rows[:, None] * V + rv[None, :], o.to(out.dtype.element_ty),
                 mask=tmask[:, None])
        new_state = tl.exp(G_last)[:, None] * state
        new_state += tl.dot(tl.trans(kd), delta, input_precision=DOT_PRECISION)

        end = start + CHUNK
        hits = (ck_slots >= 0) & (ck_offsets > start) & (ck_offsets <= end)
        if tl.sum(hits.to(tl.int32), axis=0) > 0:
            for c in tl.static_range(CK):
                offset = pick(ck_offsets, rck, c)
                slot = pick(ck_slots, rck, c)
                if (slot >= 0) & (offset > start) & (offset <= end):
                    p = offset - start
                    Gp = row_of(G, rc, p - 1)
                    kp = tl.where(rc[:, None] < p, kk * tl.exp(Gp[None, :] - G), 0.0)
                    partial = tl.exp(Gp)[:, None] * state
                    partial += tl.dot(tl.trans(kp), delta, input_precision=DOT_PRECISION)
                    partial = tl.where(p == CHUNK, new_state, partial)
                    tl.store(pool_tile(pool, slot, h, rk, rv, H, K, V), partial)
        state = new_state

    final_slot = tl.load(final_idx + n).to(tl.int64)
    if final_slot >= 0:
        tl.store(pool_tile(pool, final_slot, h, rk, rv, H, K, V), state)


@triton.jit
def kda_state_pass_kernel(
    q, k, out, pool, cu_seqlens, num_seqs_ptr, chunk_offsets, init_idx, final_idx,
    ck_off, ck_idx, ws_G, ws_W, ws_U, ws_Aqk, err_ptr,
    scale, token_capacity, meta_capacity, num_chunk_slots,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    CHUNK: tl.constexpr, CK: tl.constexpr, QK_L2NORM: tl.constexpr,
    DOT_PRECISION: tl.constexpr, FILL_ROWS: tl.constexpr,
):
    n = tl.program_id(0)
    iv = tl.program_id(1)
    h = tl.program_id(2)
    if tl.load(err_ptr) != 0:
        _fill_nan(out, n, iv, h, token_capacity, meta_capacity, H, V, BV, FILL_ROWS)
    elif n < tl.load(num_seqs_ptr):
        _state_pass(
            q, k, out, pool, cu_seqlens, chunk_offsets, init_idx, final_idx, ck_off, ck_idx,
            ws_G, ws_W, ws_U, ws_Aqk, scale, num_chunk_slots, n, iv, h,
            H, K, V, BV, CHUNK, CK, QK_L2NORM, DOT_PRECISION,
        )
