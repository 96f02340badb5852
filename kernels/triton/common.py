"""Small Triton helpers shared by the prefill kernels."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mma(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b accumulated in fp32. UPCAST multiplies in fp32 instead: the Triton interpreter's
    bf16 dots are wrong, and bf16 -> fp32 is exact, so its products match the tensor cores'."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def row_of(matrix, rows, i):
    """Row i of a 2-D tensor as a 1-D tensor (rows = arange over its first dimension)."""
    return tl.sum(tl.where(rows[:, None] == i, matrix, 0.0), axis=0)


@triton.jit
def pool_tile(pool, slot, h, rk, rv, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """Pointers to the [K, BV] tile of pool slot `slot`, head h (pool is [slots, H, V, K])."""
    base = (slot.to(tl.int64) * H + h) * (V * K)
    return pool + base + rv[None, :].to(tl.int64) * K + rk[:, None]


@triton.jit
def load_keys(x, rows, rk, tmask, K: tl.constexpr, L2NORM: tl.constexpr):
    """q or k rows [CHUNK, K] in fp32 (zero on padded rows), L2-normalised when asked."""
    xx = tl.load(x + rows[:, None] * K + rk[None, :], mask=tmask[:, None], other=0.0)
    xx = xx.to(tl.float32)
    if L2NORM:
        xx = xx * tl.rsqrt(tl.sum(xx * xx, axis=1) + 1e-6)[:, None]
    return xx


@triton.jit
def load_log_decay(g, a_log, dt_bias, rows, rk, tmask, h, lower_bound,
                   K: tl.constexpr, GATE: tl.constexpr):
    """Per-channel log decay [CHUNK, K] in fp32 (gate fused when GATE > 0), zero on padding."""
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
def locate_chunk(chunk_offsets, num_seqs, c, BLOCK: tl.constexpr):
    """Sequence n whose chunks hold global chunk c: the count of chunk_offsets[1..N] <= c."""
    r = tl.arange(0, BLOCK)
    n = tl.zeros((), dtype=tl.int32)
    for n0 in range(0, num_seqs, BLOCK):
        ends = tl.load(chunk_offsets + 1 + n0 + r, mask=n0 + r < num_seqs, other=2147483647)
        n += tl.sum((ends <= c).to(tl.int32), axis=0)
    return n


@triton.jit
def segment_bounds(chunk_offsets, num_seqs, part, parts):
    """Global chunks [lo, hi) of range `part` when the batch's chunks are cut into `parts`
    ranges of equal size (the last one shorter): computed on the device from the chunk count
    the validation wrote, so a captured graph cuts each replay's batch afresh."""
    total = tl.load(chunk_offsets + num_seqs).to(tl.int64)
    size = (total + parts - 1) // parts
    lo = tl.minimum(part * size, total)
    return lo, tl.minimum(lo + size, total)


@triton.jit
def chunk_of(cu_seqlens, num_seqs_ptr, chunk_offsets, err_ptr, c, CHUNK: tl.constexpr,
              SEARCH_BLOCK: tl.constexpr):
    """(live, bos, start, seqlen) of global chunk c: its sequence's first token, the chunk's
    first position in it, the sequence's length; live is false past the batch or on error.
    On error no sequence is searched: a live count past the metadata's capacity (one of the
    faults the validation reports) would read past chunk_offsets."""
    healthy = tl.load(err_ptr) == 0
    num_seqs = tl.where(healthy, tl.load(num_seqs_ptr), 0)
    n = locate_chunk(chunk_offsets, num_seqs, c, SEARCH_BLOCK)
    live = healthy & (n < num_seqs)
    n = tl.maximum(tl.minimum(n, num_seqs - 1), 0)
    bos = tl.load(cu_seqlens + n).to(tl.int64)
    seqlen = tl.load(cu_seqlens + n + 1).to(tl.int64) - bos
    start = (c - tl.load(chunk_offsets + n)).to(tl.int64) * CHUNK
    return live, bos, start, seqlen


@triton.jit
def unit_lower_inverse(M, SUB: tl.constexpr):
    """(I + M)^-1 for strictly lower-triangular M [16, 16]: M is nilpotent (M^16 = 0), so
    (I + M)^-1 = (I - M)(I + M^2)(I + M^4)(I + M^8), six small fp32 products."""
    tl.static_assert(SUB == 16, "the squaring inverse needs M^16 = 0 and 16-wide dots")
    rs = tl.arange(0, SUB)
    eye = tl.where(rs[:, None] == rs[None, :], 1.0, 0.0)
    M2 = tl.dot(M, M, input_precision="ieee")
    M4 = tl.dot(M2, M2, input_precision="ieee")
    M8 = tl.dot(M4, M4, input_precision="ieee")
    inv = tl.dot(eye - M, eye + M2, input_precision="ieee")
    inv = tl.dot(inv, eye + M4, input_precision="ieee")
    return tl.dot(inv, eye + M8, input_precision="ieee")
