"""Device-side metadata validation: one program checks every rule and writes the error code.

It runs before the prefill kernels on the same stream; they read the code first and touch
nothing but the output (NaN) when it is non-zero, so a bad call never writes the pool. On the
way it writes chunk_offsets[n] (the first global chunk of sequence n), which the prefill uses
to map chunks to sequences.
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
def _any(mask):
    return tl.max(mask.to(tl.int32), axis=0) > 0


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
    err = tl.zeros((), dtype=tl.int32)
    if (num_seqs < 1) | (num_seqs > meta_capacity):
        err = err | LENGTHS_BIT
    else:
        rb = tl.arange(0, BLOCK)
        rck = tl.arange(0, CK)
        first = tl.load(cu_seqlens).to(tl.int64)
        last = tl.load(cu_seqlens + num_seqs).to(tl.int64)
        if (first != 0) | (last > token_capacity):
            err = err | LENGTHS_BIT
        chunks_before = tl.zeros((), dtype=tl.int32)
        for n0 in range(0, num_seqs, BLOCK):
            n = n0 + rb
            live = n < num_seqs
            bos = tl.load(cu_seqlens + n, mask=live, other=0).to(tl.int64)
            eos = tl.load(cu_seqlens + n + 1, mask=live, other=0).to(tl.int64)
            seqlen = eos - bos
            if _any(live & (seqlen < 0)):
                err = err | LENGTHS_BIT
            chunks = tl.where(live, (tl.maximum(seqlen, 0) + CHUNK - 1) // CHUNK, 0).to(tl.int32)
            inclusive = tl.cumsum(chunks, axis=0)
            tl.store(chunk_offsets + n, chunks_before + inclusive - chunks, mask=live)
            chunks_before += tl.sum(chunks, axis=0)
            init = tl.load(init_idx + n, mask=live, other=NULL).to(tl.int64)
            final = tl.load(final_idx + n, mask=live, other=NULL).to(tl.int64)
            bad_slot = (init < NULL) | (init >= num_slots) | (final < NULL) | (final >= num_slots)
            if _any(live & bad_slot):
                err = err | RANGE_BIT
            cmask = live[:, None] & (rck[None, :] < CK)
            offs = tl.load(ck_off + n[:, None] * CK + rck[None, :], mask=cmask, other=0).to(tl.int64)
            slots = tl.load(ck_idx + n[:, None] * CK + rck[None, :], mask=cmask,
                            other=NULL).to(tl.int64)
            if _any(tl.reshape(cmask & ((slots < NULL) | (slots >= num_slots)), (BLOCK * CK,))):
                err = err | RANGE_BIT
            active = cmask & (slots != NULL)
            outside = (offs < 1) | (offs > seqlen[:, None] - 1)
            if _any(tl.reshape(active & outside, (BLOCK * CK,))):
                err = err | OFFSET_BIT
            # Active offsets strictly increasing: each one above the largest active one before it.
            prev = tl.full((BLOCK,), -1, tl.int64)
            for c in tl.static_range(CK):
                off_c = tl.sum(tl.where(rck[None, :] == c, offs, 0), axis=1)
                act_c = tl.sum(tl.where(rck[None, :] == c, active.to(tl.int32), 0), axis=1) > 0
                if _any(act_c & (off_c <= prev)):
                    err = err | OFFSET_BIT
                prev = tl.where(act_c, tl.maximum(prev, off_c), prev)
        tl.store(chunk_offsets + num_seqs, chunks_before)
        # Every active write destination distinct, and none on another sequence's initial slot.
        # Clashes accumulate elementwise and are reduced once: a reduction (and branch) per block
        # pair would serialise the loads, which dominate this program at many sequences.
        num_writes = num_seqs * (1 + CK)
        clash = tl.zeros((BLOCK, BLOCK), dtype=tl.int32)
        for a0 in range(0, num_writes, BLOCK):
            wa = a0 + rb
            slot_a, owner_a = _write_slot(final_idx, ck_idx, wa, num_seqs, CK)
            for b0 in range(0, num_writes, BLOCK):
                wb = b0 + rb
                slot_b, _ = _write_slot(final_idx, ck_idx, wb, num_seqs, CK)
                same = (slot_a[:, None] == slot_b[None, :]) & (slot_a[:, None] >= 0)
                clash = clash | (same & (wa[:, None] != wb[None, :])).to(tl.int32)
            for m0 in range(0, num_seqs, BLOCK):
                m = m0 + rb
                init_m = tl.load(init_idx + m, mask=m < num_seqs, other=NULL).to(tl.int64)
                alias = (slot_a[:, None] == init_m[None, :]) & (slot_a[:, None] >= 0)
                clash = clash | (alias & (owner_a[:, None] != m[None, :])).to(tl.int32)
        if _any(tl.reshape(clash, (BLOCK * BLOCK,))):
            err = err | DUPLICATE_BIT
    tl.store(err_ptr, err)
