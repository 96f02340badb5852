"""Parallel segments along the sequence: the state pass of R ranges at once, exact whatever the
gates.

The state pass is serial in chunks: one program walks a sequence. With few heads and few
sequences it fills a handful of SMs. KernelConfig.segments = R cuts the batch's chunks into R
ranges (common.segment_bounds, on the device) and runs them side by side in three launches:

1. kda_segment_transition_kernel, one program per (range r < R - 1, column block, head): for
   the sequence that runs past range r's end (at most one), the affine map from the state
   entering the range to the state leaving it, S_out = P_r S_in + b_r. A chunk updates
   S <- (diag(exp G_last) - kd^T W) S + kd^T U, so b_r is the chain over the range's chunks
   from a zero state with U, and P_r [K, K] the same chain from the identity without U. When
   the sequence starts inside the range, b_r is the chain from its initial state and P_r = 0;
   the program also copies that initial state to ws_entry[r] (see prefill.py). Where no
   sequence runs past the edge, P_r = b_r = 0.
2. kda_segment_scan_kernel, one program per (V block, head): ws_carry[r] = P_r ws_carry[r-1]
   + b_r in fp32 for r = 0 .. R - 2, the exact state at each range edge, the product taken in
   slices of SCAN_ROWS rows of ws_carry[r-1].
3. kda_state_pass_kernel with PARALLEL: every range from its edge state, with outputs,
   checkpoints and final states as in the serial walk.

Cost: about three serial passes of work (the transition has K more columns than V) spread
over R times as many programs. The chain here is the state pass's own arithmetic (operands
rounded as its dots take them), so the edge states carry the serial walk's rounding once more
through P_r, not a different algorithm. On a non-zero error code nothing runs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import locate_chunk, mma, pool_tile, segment_bounds


@triton.jit
def _chain(ws_KD, ws_GL, ws_W, ws_U, state, chunk_lo, chunk_hi, h, num_chunk_slots, rk, rv,
           K: tl.constexpr, V: tl.constexpr, CHUNK: tl.constexpr, WITH_U: tl.constexpr,
           DOT_PRECISION: tl.constexpr, UPCAST_DOTS: tl.constexpr):
    """`state` [K, BV] carried over global chunks [chunk_lo, chunk_hi) of head h, with the
    chunks' U (WITH_U) or without (a transition's columns)."""
    rc = tl.arange(0, CHUNK)
    for c in range(chunk_lo, chunk_hi):
        gl_row = h * num_chunk_slots + c
        ws_rows = gl_row * CHUNK + rc
        W = tl.load(ws_W + ws_rows[:, None] * K + rk[None, :])
        kd_t = tl.load(ws_KD + gl_row * CHUNK * K + rk[:, None] * CHUNK + rc[None, :])
        decay = tl.load(ws_GL + gl_row * K + rk)
        product = mma(W, state.to(W.dtype), DOT_PRECISION, UPCAST_DOTS)
        if WITH_U:
            delta = tl.load(ws_U + ws_rows[:, None] * V + rv[None, :]) - product
        else:
            delta = -product
        state = decay[:, None] * state + mma(kd_t, delta.to(W.dtype), DOT_PRECISION,
                                             UPCAST_DOTS)
    return state


@triton.jit
def kda_segment_transition_kernel(
    pool, chunk_offsets, num_seqs_ptr, init_idx, ws_KD, ws_GL, ws_W, ws_U, ws_trans, ws_bias,
    ws_entry, err_ptr, num_chunk_slots, segments,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, CHUNK: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST_DOTS: tl.constexpr, SEARCH_BLOCK: tl.constexpr,
):
    """Program (r, column block, head): blocks below V // BV are b_r's V columns, the rest
    P_r's K columns (see the module docstring)."""
    r = tl.program_id(0)
    ib = tl.program_id(1)
    h = tl.program_id(2)
    if tl.load(err_ptr) == 0:
        num_seqs = tl.load(num_seqs_ptr)
        lo, hi = segment_bounds(chunk_offsets, num_seqs, r, segments)
        # the sequence holding the range's last chunk, and whether it runs past the range
        n = locate_chunk(chunk_offsets, num_seqs, hi - 1, SEARCH_BLOCK)
        n = tl.maximum(tl.minimum(n, num_seqs - 1), 0)
        first = tl.load(chunk_offsets + n).to(tl.int64)
        crosses = (lo < hi) & (tl.load(chunk_offsets + n + 1).to(tl.int64) > hi)
        chained = first < lo  # it entered the range from the one before
        fresh = first >= lo  # it starts inside the range
        rk = tl.arange(0, K)
        if ib < V // BV:
            rv = ib * BV + tl.arange(0, BV)
            tile = ((r * H + h) * K + rk[:, None]) * V + rv[None, :]
            init_slot = tl.load(init_idx + n).to(tl.int64)
            from_init = crosses & fresh & (init_slot >= 0)
            from_init = (rk[:, None] * 0 + rv[None, :] * 0 + from_init.to(tl.int32)) > 0
            state = tl.load(pool_tile(pool, tl.maximum(init_slot, 0), h, rk, rv, H, K, V),
                            mask=from_init, other=0.0)
            if crosses & fresh:
                tl.store(ws_entry + tile, state)
            if crosses:
                state = _chain(ws_KD, ws_GL, ws_W, ws_U, state, tl.maximum(first, lo), hi, h,
                               num_chunk_slots, rk, rv, K, V, CHUNK, True, DOT_PRECISION,
                               UPCAST_DOTS)
            tl.store(ws_bias + tile, state)
        else:
            rj = (ib - V // BV) * BV + tl.arange(0, BV)
            state = tl.where((rk[:, None] == rj[None, :]) & crosses & chained, 1.0, 0.0)
            if crosses & chained:
                state = _chain(ws_KD, ws_GL, ws_W, ws_U, state, lo, hi, h, num_chunk_slots, rk,
                               rj, K, V, CHUNK, False, DOT_PRECISION, UPCAST_DOTS)
            tl.store(ws_trans + ((r * H + h) * K + rk[:, None]) * K + rj[None, :], state)


@triton.jit
def kda_segment_scan_kernel(
    ws_trans, ws_bias, ws_carry, err_ptr, segments,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, KB: tl.constexpr,
):
    """Program (V block, head): the exact state at every range edge, in fp32 products.

    Each step reads the previous edge state back from ws_carry in KB-row slices (stored by
    this program one step before, hence the barrier), so that no [K, K] tile of P_r is held
    in registers: held whole, it spilled and cost about 175 us a step on an H100."""
    iv = tl.program_id(0)
    h = tl.program_id(1)
    if tl.load(err_ptr) == 0:
        rk = tl.arange(0, K)
        rkb = tl.arange(0, KB)
        rv = iv * BV + tl.arange(0, BV)
        for r in range(segments - 1):
            rows = (r * H + h) * K + rk[:, None]
            carry = tl.load(ws_bias + rows * V + rv[None, :])
            if r > 0:
                previous = ((r - 1) * H + h) * K
                for kk in tl.static_range(0, K, KB):
                    P = tl.load(ws_trans + rows * K + kk + rkb[None, :])
                    edge = tl.load(ws_carry + (previous + kk + rkb[:, None]) * V + rv[None, :])
                    carry += tl.dot(P, edge, input_precision="ieee")
            tl.store(ws_carry + rows * V + rv[None, :], carry)
            tl.debug_barrier()
