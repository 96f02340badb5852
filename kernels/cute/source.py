"""The CuTe DSL kernels of the cute backend (imported only where nvidia-cutlass-dsl is installed).

Three kernels, launched in this order on one stream by kdabench.kernels.cute.launch:

* validate: blocks check the metadata (the rules of docs/DESIGN.md §2, the same bits as the
  Triton prologue) and OR the error bits into a zeroed int32 code: the first block the rules
  per sequence, every block its share of the write-slot clashes (each write against every
  other write and every other sequence's initial slot, in tiles staged in shared memory);
* prepare: one warp per (token, head) applies the input transforms (gate, q/k L2 norm, beta
  sigmoid, the output scale folded into q; `log_decay` and `beta_of`, which the chunk
  algorithm's preparation shares) and writes fp32 q, k, exp(g) and beta workspaces;
* state_pass: one block per (sequence, head, block of V columns) runs the token-by-token
  recurrence with the fp32 state in registers (each column's K rows split over `K // 16`
  neighbouring lanes, reduced with warp shuffles), writes the output, and stores the state
  into the pool at every active checkpoint offset and at the end. On a non-zero error code
  it only fills its share of the output with NaN and never touches the pool.

Every tensor is passed flat (1-D, 64-bit extent) and every address is computed in Int64, so
pool slots past the 2^31-element line are addressed correctly.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.memory import SmemAllocator

from ..contract import NULL_SLOT, MetadataFault

# The contract's error bits as plain ints: the DSL traces module-level Python values.
DUPLICATE_BIT = int(MetadataFault.DUPLICATE_WRITE_SLOT)
LENGTHS_BIT = int(MetadataFault.MALFORMED_LENGTHS)
RANGE_BIT = int(MetadataFault.SLOT_OUT_OF_RANGE)
OFFSET_BIT = int(MetadataFault.BAD_CHECKPOINT_OFFSET)

VALIDATE_THREADS = 256
CLASH_TILE = 1024  # slots a validate block stages in shared memory per step of the clash check
CLASH_GRID = (16, 8)  # validate blocks: over tiles of writes, over tiles of slots to match
PREPARE_WARPS = 4
PASS_THREADS = 128
ROWS_PER_THREAD = 16
L2_NORM_EPS = 1e-6


def columns_per_block(head_dim: int) -> int:
    """V columns one state-pass block owns: 128 threads, K // 16 threads per column."""
    return PASS_THREADS // (head_dim // ROWS_PER_THREAD)


@cute.jit
def _write_slot(final_idx: cute.Tensor, ck_idx: cute.Tensor, w: Int64,
                ck: cutlass.Constexpr) -> Int64:
    """Slot of write destination w = n * (1 + CK) + j (j = 0 final, j >= 1 checkpoint j - 1)."""
    n = w // (1 + ck)
    j = w % (1 + ck)
    slot = Int64(NULL_SLOT)
    if j == 0:
        slot = final_idx[n]
    else:
        slot = ck_idx[n * ck + j - 1]
    return slot


@cute.jit
def _clash_slot(final_idx: cute.Tensor, ck_idx: cute.Tensor, init_idx: cute.Tensor, e: Int64,
                num_writes: Int64, ck: cutlass.Constexpr) -> Int64:
    """Entry e of the clash check: write destination e below num_writes (`_write_slot`), then
    sequence e - num_writes's initial slot."""
    slot = Int64(NULL_SLOT)
    if e < num_writes:
        slot = _write_slot(final_idx, ck_idx, e, ck)
    else:
        slot = init_idx[e - num_writes]
    return slot


@cute.kernel
def validate_kernel(
    cu: cute.Tensor, live: cute.Tensor, init_idx: cute.Tensor, final_idx: cute.Tensor,
    ck_off: cute.Tensor, ck_idx: cute.Tensor, err: cute.Tensor,
    meta_capacity: Int64, token_capacity: Int64, num_slots: Int64, CK: cutlass.Constexpr,
):
    tid = Int64(cute.arch.thread_idx()[0])
    bx, by, _ = cute.arch.block_idx()
    first_block = Int32(0)
    if bx == 0:
        if by == 0:
            first_block = Int32(1)
    smem = SmemAllocator()
    tile = smem.allocate_tensor(Int64, cute.make_layout(CLASH_TILE), byte_alignment=16)
    num_seqs = Int64(live[0])
    bits = Int32(0)
    if num_seqs < 1 or num_seqs > meta_capacity:
        if first_block != 0:
            bits = bits | LENGTHS_BIT
    else:
        if first_block != 0:
            if tid == 0:
                if cu[0] != 0 or cu[num_seqs] > token_capacity:
                    bits = bits | LENGTHS_BIT
            for n in cutlass.range(tid, num_seqs, VALIDATE_THREADS):
                seqlen = cu[n + 1] - cu[n]
                if seqlen < 0:
                    bits = bits | LENGTHS_BIT
                init = init_idx[n]
                final = final_idx[n]
                if init < NULL_SLOT or init >= num_slots or final < NULL_SLOT or final >= num_slots:
                    bits = bits | RANGE_BIT
                prev = Int64(-1)
                for c in cutlass.range_constexpr(CK):
                    offset = ck_off[n * CK + c]
                    slot = ck_idx[n * CK + c]
                    if slot < NULL_SLOT or slot >= num_slots:
                        bits = bits | RANGE_BIT
                    if slot != NULL_SLOT:
                        if offset < 1 or offset > seqlen - 1 or offset <= prev:
                            bits = bits | OFFSET_BIT
                        if offset > prev:
                            prev = offset
        # Every active write destination distinct, and none on another sequence's initial
        # slot: write a (a thread each) against entry e (writes, then initial slots), the
        # entries staged CLASH_TILE at a time in shared memory; block (bx, by) takes the
        # write tiles bx, bx + 16, ... against the entry tiles by, by + 8, ... (CLASH_GRID)
        num_writes = num_seqs * (1 + CK)
        num_entries = num_writes + num_seqs
        write_tiles = (num_writes + VALIDATE_THREADS - 1) // VALIDATE_THREADS
        entry_tiles = (num_entries + CLASH_TILE - 1) // CLASH_TILE
        for wt in cutlass.range(Int64(bx), write_tiles, CLASH_GRID[0]):
            a = wt * VALIDATE_THREADS + tid
            slot_a = Int64(NULL_SLOT)
            if a < num_writes:
                slot_a = _write_slot(final_idx, ck_idx, a, CK)
            owner_a = a // (1 + CK)
            for et in cutlass.range(Int64(by), entry_tiles, CLASH_GRID[1]):
                e0 = et * CLASH_TILE
                count = num_entries - e0  # the tile's entries
                if count > CLASH_TILE:
                    count = Int64(CLASH_TILE)
                cute.arch.sync_threads()  # the tile before is read
                for i in cutlass.range(tid, count, VALIDATE_THREADS):
                    tile[i] = _clash_slot(final_idx, ck_idx, init_idx, e0 + i, num_writes, CK)
                cute.arch.sync_threads()
                if slot_a >= 0:
                    # matches counted, less the two allowed: write a itself, and its own
                    # sequence's initial slot (an in-place write)
                    hits = Int32(0)
                    for i in cutlass.range(count, unroll=8):
                        if tile[i] == slot_a:
                            hits = hits + 1
                    allowed = Int32(0)
                    if a >= e0:
                        if a < e0 + count:
                            allowed = allowed + 1
                    own = num_writes + owner_a
                    if own >= e0:
                        if own < e0 + count:
                            if tile[own - e0] == slot_a:
                                allowed = allowed + 1
                    if hits > allowed:
                        bits = bits | DUPLICATE_BIT
    bits = cute.arch.warp_reduction(bits, lambda x, y: x | y)
    if tid % 32 == 0:
        if bits != 0:
            cute.arch.atomic_or(err.iterator, bits)


@cute.jit
def log_decay(raw: Float32, rate: Float32, bias: Float32, lower_bound: Float32,
              GATE: cutlass.Constexpr) -> Float32:
    """One channel's log decay from its raw gate (GATE: the index of contract.GATE_MODES;
    rate = exp(A_log[h]), bias = dt_bias[h, channel], both unused when precomputed)."""
    gate = raw
    if cutlass.const_expr(GATE == 1):
        x = rate * (raw + bias)
        gate = lower_bound / (Float32(1.0) + cute.math.exp(-x))
    if cutlass.const_expr(GATE == 2):
        x = raw + bias
        softplus = cute.math.max(x, Float32(0.0)) + cute.math.log1p(
            cute.math.exp(-cute.math.abs(x)))
        gate = cute.math.max(-rate * softplus, lower_bound)
    return gate


@cute.jit
def beta_of(raw: Float32, BETA_SIGMOID: cutlass.Constexpr) -> Float32:
    """beta, or sigmoid(beta) when the call asks for it."""
    b = raw
    if cutlass.const_expr(BETA_SIGMOID):
        b = Float32(1.0) / (Float32(1.0) + cute.math.exp(-raw))
    return b


@cute.kernel
def prepare_kernel(
    q: cute.Tensor, k: cute.Tensor, g: cute.Tensor, beta: cute.Tensor, A_log: cute.Tensor,
    dt_bias: cute.Tensor, wq: cute.Tensor, wk: cute.Tensor, wd: cute.Tensor, wb: cute.Tensor,
    rows: Int64, H: Int64, scale: Float32, lower_bound: Float32,
    K: cutlass.Constexpr, GATE: cutlass.Constexpr, QK_L2NORM: cutlass.Constexpr,
    BETA_SIGMOID: cutlass.Constexpr,
):
    E = K // 32
    tid = cute.arch.thread_idx()[0]
    lane = Int64(tid % 32)
    row = Int64(cute.arch.block_idx()[0]) * PREPARE_WARPS + Int64(tid // 32)
    if row < rows:
        h = row % H
        base = row * K + lane * E
        qv = cute.make_rmem_tensor(cute.make_layout(E), Float32)
        kv = cute.make_rmem_tensor(cute.make_layout(E), Float32)
        for e in cutlass.range_constexpr(E):
            qv[e] = Float32(q[base + e])
            kv[e] = Float32(k[base + e])
        q_scale = scale
        k_scale = Float32(1.0)
        if cutlass.const_expr(QK_L2NORM):
            qq = Float32(0.0)
            kk = Float32(0.0)
            for e in cutlass.range_constexpr(E):
                qq = qq + qv[e] * qv[e]
                kk = kk + kv[e] * kv[e]
            qq = cute.arch.warp_reduction_sum(qq)
            kk = cute.arch.warp_reduction_sum(kk)
            q_scale = scale / cute.math.sqrt(qq + L2_NORM_EPS)
            k_scale = Float32(1.0) / cute.math.sqrt(kk + L2_NORM_EPS)
        for e in cutlass.range_constexpr(E):
            wq[base + e] = qv[e] * q_scale
            wk[base + e] = kv[e] * k_scale
        rate = Float32(1.0)
        if cutlass.const_expr(GATE != 0):
            rate = cute.math.exp(Float32(A_log[h]))
        for e in cutlass.range_constexpr(E):
            bias = Float32(0.0)
            if cutlass.const_expr(GATE != 0):
                bias = Float32(dt_bias[h * K + lane * E + e])
            wd[base + e] = cute.math.exp(
                log_decay(Float32(g[base + e]), rate, bias, lower_bound, GATE))
        if lane == 0:
            wb[row] = beta_of(Float32(beta[row]), BETA_SIGMOID)


@cute.jit
def active_checkpoints(ck_off: cute.Tensor, ck_idx: cute.Tensor, n: Int64,
                       CK: cutlass.Constexpr) -> tuple[cute.Tensor, cute.Tensor]:
    """Sequence n's checkpoint (offsets, slots) in registers; an inactive one's offset is -1,
    which no token count matches."""
    offsets = cute.make_rmem_tensor(cute.make_layout(CK), Int64)
    slots = cute.make_rmem_tensor(cute.make_layout(CK), Int64)
    for c in cutlass.range_constexpr(CK):
        slots[c] = ck_idx[n * CK + c]
        offsets[c] = checkpoint_offset(ck_off, slots[c], n * CK + c)
    return offsets, slots


@cute.jit
def checkpoint_offset(ck_off: cute.Tensor, slot: Int64, at: Int64) -> Int64:
    """The offset of the checkpoint at metadata index `at` whose slot is `slot`; -1 when the
    slot is negative (inactive), which no token count matches."""
    offset = Int64(-1)
    if slot >= 0:
        offset = ck_off[at]
    return offset


@cute.jit
def _fill_nan(out: cute.Tensor, n: Int64, h: Int64, col: Int64, H: Int64, token_capacity: Int64,
              meta_capacity: Int64, K: cutlass.Constexpr):
    """Poison column `col` of head h in rows n, n + meta_capacity, ... of the output."""
    nan = Float32(float("nan")).to(out.element_type)
    for i in cutlass.range((token_capacity - n + meta_capacity - 1) // meta_capacity):
        out[((n + i * meta_capacity) * H + h) * K + col] = nan


@cute.kernel
def state_pass_kernel(
    v: cute.Tensor, out: cute.Tensor, pool: cute.Tensor, wq: cute.Tensor, wk: cute.Tensor,
    wd: cute.Tensor, wb: cute.Tensor, cu: cute.Tensor, live: cute.Tensor,
    init_idx: cute.Tensor, final_idx: cute.Tensor, ck_off: cute.Tensor, ck_idx: cute.Tensor,
    err: cute.Tensor, H: Int64, token_capacity: Int64, meta_capacity: Int64,
    K: cutlass.Constexpr, CK: cutlass.Constexpr,
):
    R = ROWS_PER_THREAD
    TPC = K // R
    COLS = PASS_THREADS // TPC
    tid = cute.arch.thread_idx()[0]
    bidx, bidy, bidz = cute.arch.block_idx()
    n = Int64(bidx)
    h = Int64(bidy)
    col = Int64(bidz) * COLS + Int64(tid // TPC)
    j = Int64(tid % TPC)
    if err[0] != 0:
        if j == 0:
            _fill_nan(out, n, h, col, H, token_capacity, meta_capacity, K)
    else:
        if n < Int64(live[0]):
            bos = cu[n]
            length = cu[n + 1] - bos
            S = cute.make_rmem_tensor(cute.make_layout(R), Float32)
            kv = cute.make_rmem_tensor(cute.make_layout(R), Float32)
            dv = cute.make_rmem_tensor(cute.make_layout(R), Float32)
            qv = cute.make_rmem_tensor(cute.make_layout(R), Float32)
            offsets, slots = active_checkpoints(ck_off, ck_idx, n, CK)
            head_col = (h * K + col) * K + j * R
            first = init_idx[n]
            for r in cutlass.range_constexpr(R):
                S[r] = Float32(0.0)
            if first >= 0:
                for r in cutlass.range_constexpr(R):
                    S[r] = pool[first * H * K * K + head_col + r]
            for t in cutlass.range(length):
                rh = (bos + t) * H + h
                base = rh * K + j * R
                for r in cutlass.range_constexpr(R):
                    kv[r] = wk[base + r]
                    dv[r] = wd[base + r]
                    qv[r] = wq[base + r]
                x = Float32(v[rh * K + col])
                b = wb[rh]
                p = Float32(0.0)
                for r in cutlass.range_constexpr(R):
                    S[r] = S[r] * dv[r]
                    p = p + kv[r] * S[r]
                p = cute.arch.warp_reduction_sum(p, threads_in_group=TPC)
                u = b * (x - p)
                o = Float32(0.0)
                for r in cutlass.range_constexpr(R):
                    S[r] = S[r] + kv[r] * u
                    o = o + qv[r] * S[r]
                o = cute.arch.warp_reduction_sum(o, threads_in_group=TPC)
                if j == 0:
                    out[rh * K + col] = o.to(out.element_type)
                for c in cutlass.range_constexpr(CK):
                    if t + 1 == offsets[c]:
                        for r in cutlass.range_constexpr(R):
                            pool[slots[c] * H * K * K + head_col + r] = S[r]
            last = final_idx[n]
            if last >= 0:
                for r in cutlass.range_constexpr(R):
                    pool[last * H * K * K + head_col + r] = S[r]


@cute.jit
def kda_validate(
    cu: cute.Tensor, live: cute.Tensor, init_idx: cute.Tensor, final_idx: cute.Tensor,
    ck_off: cute.Tensor, ck_idx: cute.Tensor, err: cute.Tensor,
    meta_capacity: Int64, token_capacity: Int64, num_slots: Int64, stream,
    CK: cutlass.Constexpr,
):
    validate_kernel(cu, live, init_idx, final_idx, ck_off, ck_idx, err, meta_capacity,
                    token_capacity, num_slots, CK).launch(
        grid=(CLASH_GRID[0], CLASH_GRID[1], 1), block=(VALIDATE_THREADS, 1, 1), stream=stream)


@cute.jit
def kda_prepare(
    q: cute.Tensor, k: cute.Tensor, g: cute.Tensor, beta: cute.Tensor, A_log: cute.Tensor,
    dt_bias: cute.Tensor, wq: cute.Tensor, wk: cute.Tensor, wd: cute.Tensor, wb: cute.Tensor,
    rows: Int64, H: Int64, scale: Float32, lower_bound: Float32, stream,
    K: cutlass.Constexpr, GATE: cutlass.Constexpr, QK_L2NORM: cutlass.Constexpr,
    BETA_SIGMOID: cutlass.Constexpr,
):
    blocks = (rows + PREPARE_WARPS - 1) // PREPARE_WARPS
    prepare_kernel(q, k, g, beta, A_log, dt_bias, wq, wk, wd, wb, rows, H, scale, lower_bound,
                   K, GATE, QK_L2NORM, BETA_SIGMOID).launch(
        grid=(Int32(blocks), 1, 1), block=(32 * PREPARE_WARPS, 1, 1), stream=stream)


@cute.jit
def kda_state_pass(
    v: cute.Tensor, out: cute.Tensor, pool: cute.Tensor, wq: cute.Tensor, wk: cute.Tensor,
    wd: cute.Tensor, wb: cute.Tensor, cu: cute.Tensor, live: cute.Tensor,
    init_idx: cute.Tensor, final_idx: cute.Tensor, ck_off: cute.Tensor, ck_idx: cute.Tensor,
    err: cute.Tensor, H: Int64, token_capacity: Int64, meta_capacity: Int64, stream,
    K: cutlass.Constexpr, CK: cutlass.Constexpr,
):
    state_pass_kernel(v, out, pool, wq, wk, wd, wb, cu, live, init_idx, final_idx, ck_off,
                      ck_idx, err, H, token_capacity, meta_capacity, K, CK).launch(
        grid=(Int32(meta_capacity), Int32(H), K // columns_per_block(K)),
        block=(PASS_THREADS, 1, 1), stream=stream)
