"""Stage 2 of the prefill: the sequential state pass, with interior checkpoint export.

One program owns (sequence, V block, head) and walks the sequence's chunks, keeping the fp32
state S [K, BV] in registers. From stage 1's workspaces (see prepare.py):

    delta = U - W S
    o = scale (qg S + Aqk delta),  qg = q exp(G)
    S <- exp(G_last) S + kd^T delta,  kd = k exp(G_last - G) (stored transposed)

The fused pipeline computes o in the loop. The split one (SPLIT_OUTPUT) keeps only the state
chain there, storing each chunk's start state (as the dots take it) and delta (over U), and
kda_output_kernel computes o for every chunk in parallel. A launch covers the global chunks
[chunk_lo, chunk_hi), range number `part`: the split pipeline runs the pass in ranges
(launch.split_range_count), each starting from the state the range before left in ws_carry (one
edge state per range, as a range edge lies inside at most one sequence), so that one range's
pass overlaps the next range's stage 1. With PARALLEL the launch covers every range of the
config's segments at once (segments.py): the batch's chunks cut evenly on the device, each
range starting from the exact edge state the segment scan left in ws_carry, or, for a sequence
that starts inside the range and runs past it, from the copy of its initial state the
transition pass took (the last range may write that slot while the first would still read it).

A checkpoint at in-chunk position p < CHUNK is the same update truncated to the chunk's first p
tokens, exp(G_p) S + (k exp(G_p - G))[:p]^T delta[:p], behind the loop's one scalar test per
chunk. Where it is finished is the config's `checkpoints`: "kernel" (CHECKPOINTS_IN_PASS off)
leaves the chunk-start state in the checkpoint's slot and the chunk's delta in ws_U, and
kda_checkpoint_kernel finishes every such checkpoint in parallel after the pass, from G in ws_G
and the caller's keys (off the programs' chains, at the price of a second write and a read-back
of the slot); "pass" (16-token chunks only) forms it in the pass from kd^T, the chunk-start
state and delta in registers and two G rows, as exp(G_p - G_last) (exp(G_last) S + kd^T
delta[:p]), and writes it once (on the program's chain). One at p == CHUNK is the chunk-end
state itself, so chunk-aligned checkpoints equal, bit for bit, the final state of a run over the
prefix. The chunk mirror in kdabench.oracles spells out the same algorithm in plain torch. On a
non-zero error code the program only poisons its share of the output with NaN and never touches
the pool.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..config import PASS_CHECKPOINT_CHUNK
from ..contract import MIN_LOWER_BOUND
from .common import chunk_of, load_keys, mma, pool_tile, row_of, segment_bounds

PASS_CHUNK = tl.constexpr(PASS_CHECKPOINT_CHUNK)
# The largest lift G_p - G_last for which _checkpoint_from_kd is exact (its docstring), and the
# gates' floor, which bounds the lift at (CHUNK - 1) * -floor.
MAX_LIFT = tl.constexpr(75.0)
GATE_FLOOR = tl.constexpr(MIN_LOWER_BOUND)


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
def _stage_interior(pool, ws_U, state, delta, ck_off, ck_idx, n, ws_rows, start, h, rk, rv,
                    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, CHUNK: tl.constexpr,
                    CK: tl.constexpr, DELTA_STORED: tl.constexpr):
    """For each checkpoint strictly inside this chunk: the chunk-start state to its slot and
    (unless the split pass stored it already) the chunk's delta over U (read by no one else),
    for kda_checkpoint_kernel. Called before the state update, so the old state's registers are
    free again by then. The checkpoint loops here are unrolled (static_range): rolled, they cost
    capacity 4 30-50% more instructions per chunk than capacity 1 even where no checkpoint falls
    (sm_90 SASS), the export overhead's main part."""
    for c in tl.static_range(CK):
        offset = tl.load(ck_off + n * CK + c).to(tl.int64)
        slot = tl.load(ck_idx + n * CK + c).to(tl.int64)
        if (slot >= 0) & (offset > start) & (offset < start + CHUNK):
            tl.store(pool_tile(pool, slot, h, rk, rv, H, K, V), state)
            if not DELTA_STORED:
                tl.store(ws_U + ws_rows[:, None] * V + rv[None, :], delta)


@triton.jit
def _checkpoint_from_kd(kd_t, state, decay, step, lift, p, CHUNK: tl.constexpr,
                        DOT_PRECISION: tl.constexpr, UPCAST_DOTS: tl.constexpr):
    """exp(lift) (exp(G_last) S + kd^T delta[:p]), delta's rows from p on zeroed: the truncated
    update, as k exp(G_p - G) = kd exp(G_p - G_last), from operands the loop holds already.
    Exact in fp32 while lift <= MAX_LIFT (75): exp(75) = 3.7e32 stays finite, and a term
    k exp(G_p - G) (or exp(G_p) S) leaves fp32's and bf16's normal range (exp(-87)) as kd's entry
    (or exp(G_last) S) only below exp(-12) = 6e-6 |k| (or |S|). Gates are at least GATE_FLOOR
    (the contract's lower bound, -5), so at 16-token chunks a lift is at most 15 * 5 = 75."""
    rc = tl.arange(0, CHUNK)
    head = tl.where(rc[:, None] < p, step, tl.zeros_like(step))
    partial = decay[:, None] * state + mma(kd_t, head, DOT_PRECISION, UPCAST_DOTS)
    return tl.exp(lift)[:, None] * partial


@triton.jit
def _interior_checkpoints(pool, ws_G, kd_t, state, decay, step, ck_off, ck_idx, n, gl_row, start,
                          h, rk, rv, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          CHUNK: tl.constexpr, CK: tl.constexpr, DOT_PRECISION: tl.constexpr,
                          UPCAST_DOTS: tl.constexpr):
    """Each checkpoint strictly inside this 16-token chunk, at in-chunk position p, to its slot:
    the chunk's update truncated to its first p tokens, from kd^T (the loop's operand), the
    chunk-start state and the chunk's delta (`step`, in the dots' operand dtype), called before
    the state update; two G rows are its only loads. The loop over checkpoints is unrolled
    (static_range): rolled, it cost capacity 4 30-50% more instructions per chunk than capacity
    1 even where no checkpoint falls (sm_90 SASS)."""
    tl.static_assert(CHUNK == PASS_CHUNK, "checkpoints in the pass run at PASS_CHUNK only")
    tl.static_assert((CHUNK - 1) * -GATE_FLOOR <= MAX_LIFT, "a chunk's lift may exceed MAX_LIFT")
    for c in tl.static_range(CK):
        offset = tl.load(ck_off + n * CK + c).to(tl.int64)
        slot = tl.load(ck_idx + n * CK + c).to(tl.int64)
        if (slot >= 0) & (offset > start) & (offset < start + CHUNK):
            p = offset - start
            Gp = tl.load(ws_G + (gl_row * CHUNK + p - 1) * K + rk)
            lift = Gp - tl.load(ws_G + (gl_row * CHUNK + CHUNK - 1) * K + rk)
            partial = _checkpoint_from_kd(kd_t, state, decay, step, lift, p, CHUNK,
                                          DOT_PRECISION, UPCAST_DOTS)
            tl.store(pool_tile(pool, slot, h, rk, rv, H, K, V), partial)


@triton.jit
def _slot_at(ck_off, ck_idx, n, offset, CK: tl.constexpr):
    """The slot of sequence n's active checkpoint at `offset`, -1 when none."""
    found = tl.full((), -1, tl.int64)
    for c in tl.static_range(CK):
        slot = tl.load(ck_idx + n * CK + c).to(tl.int64)
        hit = (slot >= 0) & (tl.load(ck_off + n * CK + c).to(tl.int64) == offset)
        found = tl.where(hit, slot, found)
    return found


@triton.jit
def _next_checkpoint(ck_off, ck_idx, n, after, none_offset, CK: tl.constexpr):
    """The smallest active checkpoint offset of sequence n above `after` (`none_offset` when
    none), from scalar loads: the loop's one test per chunk, with no reduction across threads."""
    nearest = none_offset
    for c in tl.static_range(CK):
        offset = tl.load(ck_off + n * CK + c).to(tl.int64)
        active = (tl.load(ck_idx + n * CK + c) >= 0) & (offset > after)
        nearest = tl.where(active & (offset < nearest), offset, nearest)
    return nearest


@triton.jit
def _state_pass(
    out, pool, cu_seqlens, chunk_offsets, init_idx, final_idx, ck_off, ck_idx, ws_G, ws_QG,
    ws_KD, ws_GL, ws_W, ws_U, ws_Aqk, ws_S, ws_carry, ws_entry, scale, num_chunk_slots, part,
    chunk_lo, chunk_hi, n, iv, h, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, CHUNK: tl.constexpr, CK: tl.constexpr, DOT_PRECISION: tl.constexpr,
    UPCAST_DOTS: tl.constexpr, SPLIT_OUTPUT: tl.constexpr, PARALLEL: tl.constexpr,
    CHECKPOINTS_IN_PASS: tl.constexpr,
):
    bos = tl.load(cu_seqlens + n).to(tl.int64)
    seqlen = tl.load(cu_seqlens + n + 1).to(tl.int64) - bos
    first_chunk = tl.load(chunk_offsets + n).to(tl.int64)
    chunks = (seqlen + CHUNK - 1) // CHUNK
    # this launch's share of the sequence: its chunks within global chunks [chunk_lo, chunk_hi)
    lo = tl.minimum(tl.maximum(chunk_lo - first_chunk, 0), chunks)
    hi = tl.minimum(tl.maximum(chunk_hi - first_chunk, 0), chunks)
    if (lo < hi) | ((chunks == 0) & (part == 0)):
        rk = tl.arange(0, K)
        rv = iv * BV + tl.arange(0, BV)
        # a range edge lies inside at most one sequence: range r's edge state sits in slot r
        edge_row = (part * H + h) * K + rk[:, None]
        carried = ws_carry + edge_row * V + rv[None, :]
        if lo == 0:
            init_slot = tl.load(init_idx + n).to(tl.int64)
            has_init = (rk[:, None] * 0 + rv[None, :] * 0 + init_slot) >= 0  # a full mask
            if PARALLEL and (hi < chunks):  # the copy taken before any range wrote the pool
                state = tl.load(ws_entry + edge_row * V + rv[None, :])
            else:
                state = tl.load(pool_tile(pool, tl.maximum(init_slot, 0), h, rk, rv, H, K, V),
                                mask=has_init, other=0.0)
        else:  # the state where the range before this one left it
            state = tl.load(carried - H * K * V)
        state = _walk_chunks(
            out, pool, ck_off, ck_idx, ws_G, ws_QG, ws_KD, ws_GL, ws_W, ws_U, ws_Aqk, ws_S, state,
            scale, num_chunk_slots, bos, seqlen, first_chunk, lo * CHUNK, hi * CHUNK, n, h, rk,
            rv, H, K, V, CHUNK, CK, DOT_PRECISION, UPCAST_DOTS, SPLIT_OUTPUT, CHECKPOINTS_IN_PASS)
        if hi == chunks:
            final_slot = tl.load(final_idx + n).to(tl.int64)
            if final_slot >= 0:
                tl.store(pool_tile(pool, final_slot, h, rk, rv, H, K, V), state)
        elif not PARALLEL:  # the segment scan wrote the edge states before this launch
            tl.store(carried, state)


@triton.jit
def _walk_chunks(
    out, pool, ck_off, ck_idx, ws_G, ws_QG, ws_KD, ws_GL, ws_W, ws_U, ws_Aqk, ws_S, state,
    scale, num_chunk_slots, bos, seqlen, first_chunk, begin, end, n, h, rk, rv,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, CHUNK: tl.constexpr, CK: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST_DOTS: tl.constexpr, SPLIT_OUTPUT: tl.constexpr,
    CHECKPOINTS_IN_PASS: tl.constexpr,
):
    """The state from token `begin` to `end` (chunk boundaries) of sequence n, chunk by chunk,
    with the output (fused) or the chunk-start states (split) and the checkpoints on the way."""
    rc = tl.arange(0, CHUNK)
    beyond = seqlen + CHUNK  # an offset no chunk reaches
    next_checkpoint = _next_checkpoint(ck_off, ck_idx, n, begin, beyond, CK)
    for start in range(begin, end, CHUNK):
        gl_row = h * num_chunk_slots + first_chunk + start // CHUNK
        ws_rows = gl_row * CHUNK + rc
        W = tl.load(ws_W + ws_rows[:, None] * K + rk[None, :])
        kd_t = tl.load(ws_KD + gl_row * CHUNK * K + rk[:, None] * CHUNK + rc[None, :])
        U = tl.load(ws_U + ws_rows[:, None] * V + rv[None, :])
        decay = tl.load(ws_GL + gl_row * K + rk)

        held = state.to(W.dtype)  # the dots' operand: fp32 (tf32 dots) or bf16
        delta = U - mma(W, held, DOT_PRECISION, UPCAST_DOTS)
        step = delta.to(W.dtype)
        if SPLIT_OUTPUT:
            tl.store(ws_S + (gl_row * K + rk[:, None]) * V + rv[None, :], held)
            tl.store(ws_U + ws_rows[:, None] * V + rv[None, :], delta)
        else:
            qg = tl.load(ws_QG + ws_rows[:, None] * K + rk[None, :])
            Aqk = tl.load(ws_Aqk + ws_rows[:, None] * CHUNK + rc[None, :])
            o = scale * (mma(qg, held, DOT_PRECISION, UPCAST_DOTS)
                         + mma(Aqk, step, DOT_PRECISION, UPCAST_DOTS))
            tl.store(out + ((bos + start + rc) * H + h)[:, None] * V + rv[None, :],
                     o.to(out.dtype.element_ty), mask=(start + rc < seqlen)[:, None])
        if next_checkpoint < start + CHUNK:
            if CHECKPOINTS_IN_PASS:
                _interior_checkpoints(pool, ws_G, kd_t, state, decay, step, ck_off, ck_idx, n,
                                      gl_row, start, h, rk, rv, H, K, V, CHUNK, CK, DOT_PRECISION,
                                      UPCAST_DOTS)
            else:
                _stage_interior(pool, ws_U, state, delta, ck_off, ck_idx, n, ws_rows, start, h,
                                rk, rv, H, K, V, CHUNK, CK, SPLIT_OUTPUT)
        state = decay[:, None] * state + mma(kd_t, step, DOT_PRECISION, UPCAST_DOTS)
        if next_checkpoint <= start + CHUNK:
            end_slot = _slot_at(ck_off, ck_idx, n, start + CHUNK, CK)
            if end_slot >= 0:
                tl.store(pool_tile(pool, end_slot, h, rk, rv, H, K, V), state)
            next_checkpoint = _next_checkpoint(ck_off, ck_idx, n, start + CHUNK, beyond, CK)
    return state


@triton.jit
def kda_state_pass_kernel(
    out, pool, cu_seqlens, num_seqs_ptr, chunk_offsets, init_idx, final_idx,
    ck_off, ck_idx, ws_G, ws_QG, ws_KD, ws_GL, ws_W, ws_U, ws_Aqk, ws_S, ws_carry, ws_entry,
    err_ptr, scale, token_capacity, meta_capacity, num_chunk_slots, part, chunk_lo, chunk_hi,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    CHUNK: tl.constexpr, CK: tl.constexpr, DOT_PRECISION: tl.constexpr,
    UPCAST_DOTS: tl.constexpr, SPLIT_OUTPUT: tl.constexpr, FILL_ROWS: tl.constexpr,
    PARALLEL: tl.constexpr, CHECKPOINTS_IN_PASS: tl.constexpr,
):
    """One program per (sequence slot, V block, head); with PARALLEL, `part` is the range
    count and the first axis runs over (range, sequence slot)."""
    pid = tl.program_id(0)
    n = pid % meta_capacity
    iv = tl.program_id(1)
    h = tl.program_id(2)
    if tl.load(err_ptr) != 0:
        if pid < meta_capacity:
            _fill_nan(out, n, iv, h, token_capacity, meta_capacity, H, V, BV, FILL_ROWS)
    else:
        num_seqs = tl.load(num_seqs_ptr)
        if n < num_seqs:
            if PARALLEL:  # the last range first: under the interpreter, which runs programs
                # in order, a range that read a slot the later ones write would read it late
                index = part - 1 - pid // meta_capacity
                range_lo, range_hi = segment_bounds(chunk_offsets, num_seqs, index, part)
                _state_pass(
                    out, pool, cu_seqlens, chunk_offsets, init_idx, final_idx, ck_off, ck_idx,
                    ws_G, ws_QG, ws_KD, ws_GL, ws_W, ws_U, ws_Aqk, ws_S, ws_carry, ws_entry,
                    scale, num_chunk_slots, index, range_lo, range_hi, n, iv, h, H, K, V, BV,
                    CHUNK, CK, DOT_PRECISION, UPCAST_DOTS, SPLIT_OUTPUT, PARALLEL,
                    CHECKPOINTS_IN_PASS,
                )
            else:
                _state_pass(
                    out, pool, cu_seqlens, chunk_offsets, init_idx, final_idx, ck_off, ck_idx,
                    ws_G, ws_QG, ws_KD, ws_GL, ws_W, ws_U, ws_Aqk, ws_S, ws_carry, ws_entry,
                    scale, num_chunk_slots, part, chunk_lo, chunk_hi, n, iv, h, H, K, V, BV,
                    CHUNK, CK, DOT_PRECISION, UPCAST_DOTS, SPLIT_OUTPUT, PARALLEL,
                    CHECKPOINTS_IN_PASS,
                )


@triton.jit
def kda_output_kernel(
    out, cu_seqlens, num_seqs_ptr, chunk_offsets, ws_QG, ws_Aqk, ws_U, ws_S, err_ptr, scale,
    num_chunk_slots, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    CHUNK: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOTS: tl.constexpr,
    SEARCH_BLOCK: tl.constexpr,
):
    """The split pipeline's output, one program per (chunk, V block, head): o = scale (qg S +
    Aqk delta) from the chunk-start state S and delta the state pass stored."""
    c = tl.program_id(0)
    iv = tl.program_id(1)
    h = tl.program_id(2)
    live, bos, start, seqlen = chunk_of(cu_seqlens, num_seqs_ptr, chunk_offsets, err_ptr, c,
                                        CHUNK, SEARCH_BLOCK)
    if live:
        rk = tl.arange(0, K)
        rv = iv * BV + tl.arange(0, BV)
        rc = tl.arange(0, CHUNK)
        gl_row = h * num_chunk_slots + c.to(tl.int64)
        ws_rows = gl_row * CHUNK + rc
        qg = tl.load(ws_QG + ws_rows[:, None] * K + rk[None, :])
        held = tl.load(ws_S + (gl_row * K + rk[:, None]) * V + rv[None, :])
        Aqk = tl.load(ws_Aqk + ws_rows[:, None] * CHUNK + rc[None, :])
        step = tl.load(ws_U + ws_rows[:, None] * V + rv[None, :]).to(qg.dtype)
        o = scale * (mma(qg, held, DOT_PRECISION, UPCAST_DOTS)
                     + mma(Aqk, step, DOT_PRECISION, UPCAST_DOTS))
        rows = (bos + start + rc) * H + h
        tl.store(out + rows[:, None] * V + rv[None, :], o.to(out.dtype.element_ty),
                 mask=(start + rc < seqlen)[:, None])


@triton.jit
def kda_checkpoint_kernel(
    k, pool, cu_seqlens, num_seqs_ptr, chunk_offsets, ck_off, ck_idx, ws_G, ws_U, err_ptr,
    num_chunk_slots, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    CHUNK: tl.constexpr, CK: tl.constexpr, OPERAND_BF16: tl.constexpr,
    QK_L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOTS: tl.constexpr,
):
    """After the state pass, one program per (checkpoint, V block, head): a checkpoint strictly
    inside a chunk becomes the chunk's update truncated to its first p tokens,
    exp(G_p) S_start + (k exp(G_p - G))[:p]^T delta[:p], from the chunk-start state the pass
    left in its slot and the chunk's delta in ws_U."""
    w = tl.program_id(0)
    iv = tl.program_id(1)
    h = tl.program_id(2)
    n = w // CK
    if (tl.load(err_ptr) == 0) & (n < tl.load(num_seqs_ptr)):
        offset = tl.load(ck_off + w).to(tl.int64)
        slot = tl.load(ck_idx + w).to(tl.int64)
        if (slot >= 0) & (offset % CHUNK != 0):
            operand = tl.bfloat16 if OPERAND_BF16 else tl.float32
            bos = tl.load(cu_seqlens + n).to(tl.int64)
            start = offset // CHUNK * CHUNK
            p = offset - start
            rk = tl.arange(0, K)
            rv = iv * BV + tl.arange(0, BV)
            rc = tl.arange(0, CHUNK)
            first_chunk = tl.load(chunk_offsets + n).to(tl.int64)
            ws_rows = (h * num_chunk_slots + first_chunk) * CHUNK + start + rc
            G = tl.load(ws_G + ws_rows[:, None] * K + rk[None, :])
            kk = load_keys(k, (bos + start + rc) * H + h, rk, rc < p, K, QK_L2NORM)
            Gp = row_of(G, rc, p - 1)
            kp = kk * tl.exp(tl.minimum(Gp[None, :] - G, 0.0))
            delta = tl.load(ws_U + ws_rows[:, None] * V + rv[None, :]).to(operand)
            tile = pool_tile(pool, slot, h, rk, rv, H, K, V)
            partial = tl.exp(Gp)[:, None] * tl.load(tile)
            partial += mma(tl.trans(kp.to(operand)), delta, DOT_PRECISION, UPCAST_DOTS)
            tl.store(tile, partial)
