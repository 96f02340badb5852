"""Device-side metadata validation: one program checks every rule but the write-slot clashes
and writes the error code; kda_clash_kernel then compares the write slots tile against tile, one
program per pair of tiles, and ORs the duplicate bit into that code.

Both run before the prefill kernels on the same stream; those read the code first and touch
nothing but the output (NaN) when it is non-zero, so a bad call never writes the pool. On the
way the first writes chunk_offsets[n] (the first global chunk of sequence n), which the prefill
uses to map chunks to sequences.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..contract import NULL_SLOT, MetadataFault

# The contract's null slot and error bits, as the constexpr globals a jitted function may read.
NULL = tl.constexpr(NULL_SLOT)
DUPLICATE_BIT = tl.constexpr(int(MetadataFault.DUPLICATE_WRITE_SLOT))
LENGTHS_BIT = tl.constexpr(int(MetadataFault.MALFORMED_LENGTHS))
RANGE_BIT = tl.constexpr(int(MetadataFault.SLOT_OUT_OF_RANGE))
OFFSET_BIT = tl.constexpr(int(MetadataFault.BAD_CHECKPOINT_OFFSET))


@triton.jit
def _write_slot(final_idx, ck_idx, w, owner_count, CK: tl.constexpr):
    """Slot of write destination w (w = n * (1 + CK) + j; j = 0 final, j >= 1 checkpoint j - 1)."""
    n = w // (1 + CK)
    j = w % (1 + CK)
    live = n < owner_count
    final = tl.load(final_idx + n, mask=live & (j == 0), other=NULL).to(tl.int64)
    ck = tl.load(ck_idx + n * CK + j - 1, mask=live & (j > 0), other=NULL).to(tl.int64)
    return tl.where(live, tl.where(j == 0, final, ck), NULL), n


@triton.jit
def kda_validate_kernel(
    cu_seqlens,
    num_seqs_ptr,
    init_idx,
    final_idx,
    ck_off,
    ck_idx,
    err_ptr,
    chunk_offsets,
    meta_capacity,
    token_capacity,
    num_slots,
    CK: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    num_seqs = tl.load(num_seqs_ptr).to(tl.int64)
    err = tl.full((), 0, tl.int32)
    if (num_seqs < 1) | (num_seqs > meta_capacity):
        err = err | LENGTHS_BIT
    else:
        rb = tl.arange(0, BLOCK)
        rck = tl.arange(0, CK)
        first = tl.load(cu_seqlens).to(tl.int64)
        last = tl.load(cu_seqlens + num_seqs).to(tl.int64)
        if (first != 0) | (last > token_capacity):
            err = err | LENGTHS_BIT
        # Each rule's failures accumulate elementwise over the blocks, each bit is reduced once:
        # a reduction per rule and block is a branch and a barrier on the GPU, and under the
        # interpreter a nested call apiece (the CPU fuzz's main cost).
        bad_length = tl.full((BLOCK,), 0, tl.int32)
        bad_slot = tl.full((BLOCK, CK), 0, tl.int32)
        bad_offset = tl.full((BLOCK, CK, CK), 0, tl.int32)
        # Active offsets strictly increasing: no active pair i < j with offset i >= offset j.
        earlier = rck[:, None] < rck[None, :]
        chunks_before = tl.full((), 0, tl.int32)
        for n0 in range(0, num_seqs, BLOCK):
            n = n0 + rb
            live = n < num_seqs
            bos = tl.load(cu_seqlens + n, mask=live, other=0).to(tl.int64)
            eos = tl.load(cu_seqlens + n + 1, mask=live, other=0).to(tl.int64)
            seqlen = eos - bos
            bad_length = bad_length | (live & (seqlen < 0)).to(tl.int32)
            chunks = tl.where(live, (tl.maximum(seqlen, 0) + CHUNK - 1) // CHUNK, 0).to(tl.int32)
            inclusive = tl.cumsum(chunks, axis=0)
            tl.store(chunk_offsets + n, chunks_before + inclusive - chunks, mask=live)
            chunks_before += tl.sum(chunks, axis=0)
            init = tl.load(init_idx + n, mask=live, other=NULL).to(tl.int64)
            final = tl.load(final_idx + n, mask=live, other=NULL).to(tl.int64)
            row_slot = (init < NULL) | (init >= num_slots) | (final < NULL) | (final >= num_slots)
            cmask = live[:, None] & (rck[None, :] < CK)
            offs = tl.load(ck_off + n[:, None] * CK + rck[None, :], mask=cmask, other=0).to(tl.int64)
            slots = tl.load(ck_idx + n[:, None] * CK + rck[None, :], mask=cmask,
                            other=NULL).to(tl.int64)
            slot_range = (live & row_slot)[:, None] | (cmask & ((slots < NULL) | (slots >= num_slots)))
            bad_slot = bad_slot | slot_range.to(tl.int32)
            active = cmask & (slots != NULL)
            outside = (offs < 1) | (offs > seqlen[:, None] - 1)
            pair = active[:, :, None] & active[:, None, :] & earlier[None, :, :]
            unordered = pair & (offs[:, :, None] >= offs[:, None, :])
            bad_offset = bad_offset | (unordered | (active & outside)[:, :, None]).to(tl.int32)
        err = err | tl.where(tl.max(bad_length, axis=0) > 0, LENGTHS_BIT, 0)
        err = err | tl.where(tl.max(tl.reshape(bad_slot, (BLOCK * CK,)), axis=0) > 0, RANGE_BIT, 0)
        bad_offset = tl.reshape(bad_offset, (BLOCK * CK * CK,))
        err = err | tl.where(tl.max(bad_offset, axis=0) > 0, OFFSET_BIT, 0)
        tl.store(chunk_offsets + num_seqs, chunks_before)
    tl.store(err_ptr, err)


@triton.jit
def kda_clash_kernel(init_idx, final_idx, ck_idx, num_seqs_ptr, err_ptr, meta_capacity,
                     CK: tl.constexpr, BLOCK: tl.constexpr):
    """Every active write destination distinct, and none on another sequence's initial slot:
    program (a, b) compares write tile a with write tile b, or, past the live write tiles, with
    tile b - (write tiles) of the initial slots, and ORs the duplicate bit into the error code on
    a clash. The grid covers the metadata's capacity; tiles past the live count do nothing."""
    num_seqs = tl.load(num_seqs_ptr).to(tl.int64)
    a0 = tl.program_id(0) * BLOCK
    num_writes = num_seqs * (1 + CK)
    if (num_seqs >= 1) & (num_seqs <= meta_capacity) & (a0 < num_writes):
        rb = tl.arange(0, BLOCK)
        wa = a0 + rb
        slot_a, owner_a = _write_slot(final_idx, ck_idx, wa, num_seqs, CK)
        write_tiles = (num_writes + BLOCK - 1) // BLOCK
        b = tl.program_id(1)
        if b < write_tiles:
            wb = b * BLOCK + rb
            slot_b, _ = _write_slot(final_idx, ck_idx, wb, num_seqs, CK)
            clash = (slot_a[:, None] == slot_b[None, :]) & (wa[:, None] != wb[None, :])
        else:
            m = (b - write_tiles) * BLOCK + rb
            init_m = tl.load(init_idx + m, mask=m < num_seqs, other=NULL).to(tl.int64)
            clash = (slot_a[:, None] == init_m[None, :]) & (owner_a[:, None] != m[None, :])
        clash = clash & (slot_a[:, None] >= 0)
        if tl.max(tl.reshape(clash.to(tl.int32), (BLOCK * BLOCK,)), axis=0) > 0:
            tl.atomic_or(err_ptr, DUPLICATE_BIT)
