"""The runners that check valid calls against the float64 recurrence: accuracy, inactive,
poisoned, prefix, and mirror (the chunk mirror itself against the recurrence)."""

from __future__ import annotations

import random

import torch

from kdabench.matrix import Case
from kdabench.oracles import chunk_kda_mirror, prefix_batch, recurrent_kda, relative_error
from kdabench.qualify.harness import (
    SENTINEL,
    Context,
    Outcome,
    case_caps,
    case_inputs,
    check_valid,
    index_dtype,
    kernel_record,
    make_pool,
    prefill_call,
    result_of,
    shape_record,
    time_call,
    valid_run,
)
from kdabench.qualify.metadata import CHUNK, CannotBuild, Metadata, choose_offsets

# An aligned checkpoint against its prefix run under the interpreter: the same fp32 arithmetic
# summed in the host BLAS's order; reordering a sum of K = 128 products moves it by at most
# 128 * 2**-24 = 7.6e-6 of the sum of magnitudes (measured: 0 to 3.5e-8).
INTERPRETED_ALIGNED_TOL = 1e-5


def run_accuracy(ctx: Context, case: Case, *, meta_edit=None, poison: bool = False) -> Outcome:
    """Outputs, final states and every checkpoint against the float64 recurrence.

    meta_edit(meta, rng, outcome) edits the metadata first (the inactive scenario);
    poison: the output buffer starts as NaN and every live row must be written.
    """
    out = Outcome()
    x, meta, rng = valid_run(ctx, case, scatter=meta_edit is not None)
    if meta_edit is not None:
        meta_edit(meta, rng, out)
    dtype = index_dtype(case)
    pool = make_pool(ctx, meta, x)
    before = pool.clone()
    buffer = None
    if poison:
        buffer = torch.full(x.v.shape, float("nan"), dtype=x.v.dtype, device=ctx.device)
    call = prefill_call(ctx, x, meta, pool, dtype, out=buffer)
    output, code = result_of(call())
    out.shape = shape_record(meta)
    out.checks["error_code"] = code
    if poison:
        finite = bool(torch.isfinite(output).all())
        out.checks["live_rows_finite"] = finite
        out.require(finite, "a live output row kept its NaN poison")
        out.require(output.data_ptr() == buffer.data_ptr(), "the output is not the buffer given")
    check_valid(out, ctx, case, x, meta, pool, before, output, code)
    out.kernel = kernel_record(ctx, case_caps(ctx, case, meta, x.q.shape[0]))
    out.samples_ms = time_call(ctx, call)
    return out


def _deactivate(meta: Metadata, rng: random.Random, out: Outcome) -> None:
    """Inactive entries with garbage offsets, and null final slots (slots stay in the pool)."""
    entries = meta.active_entries()
    dropped = {(n, i) for n, i, _, _ in entries if rng.random() < 0.5}
    if entries and len(dropped) == len(entries):
        dropped.discard((entries[0][0], entries[0][1]))
    if entries and not dropped:
        dropped.add((entries[-1][0], entries[-1][1]))
    garbage = [0, -3, 2**30]
    for n, row in enumerate(meta.slots):
        live = [c for c, s in enumerate(row) if s >= 0]
        for i, c in enumerate(live):
            if (n, i) in dropped:
                row[c] = -1
                meta.offsets[n][c] = rng.choice([*garbage, meta.lengths[n] + 7])
        for c, s in enumerate(row):
            if s < 0 and (n, c) not in dropped:
                meta.offsets[n][c] = rng.choice(garbage)
    nulls = [n for n in range(len(meta.final)) if rng.random() < 0.34] or [len(meta.final) - 1]
    if len(meta.final) > 1 and len(nulls) == len(meta.final):
        nulls = nulls[1:]
    for n in nulls:
        meta.final[n] = -1
    inactive = sum(1 for row in meta.slots for s in row if s < 0)
    out.details.update(inactive_entries=inactive, null_final_slots=len(nulls))


def run_inactive(ctx: Context, case: Case) -> Outcome:
    """Inactive entries (with garbage offsets) and null final slots write nothing."""
    return run_accuracy(ctx, case, meta_edit=_deactivate)


def run_poisoned(ctx: Context, case: Case) -> Outcome:
    """An output poisoned with NaN before a valid run comes back finite in every live row."""
    return run_accuracy(ctx, case, poison=True)


def run_prefix(ctx: Context, case: Case) -> Outcome:
    """Checkpoints vs kernel runs over each prefix: bit for bit where the offset is aligned."""
    out = Outcome()
    x, meta, _ = valid_run(ctx, case)
    dtype, capacity = index_dtype(case), case.params["capacity"]
    pool = make_pool(ctx, meta, x)
    before = pool.clone()
    call = prefill_call(ctx, x, meta, pool, dtype)
    output, code = result_of(call())
    out.shape = shape_record(meta)
    out.checks["error_code"] = code
    check_valid(out, ctx, case, x, meta, pool, before, output, code)
    if code:
        return out
    batch = prefix_batch(meta.cu_seqlens, meta.actives())
    count = len(batch.owners)
    if not count:
        raise CannotBuild("no active checkpoint in this layout: nothing to compare")
    # One sequence per prefix, same capacity (all entries inactive), fresh final slots.
    initial = [meta.initial[n] for n, _ in batch.owners]
    prefix_meta = Metadata(
        cu_seqlens=batch.cu_seqlens.tolist(),
        initial=[i if initial[i] >= 0 else -1 for i in range(count)],
        final=[count + i for i in range(count)], offsets=[[1] * capacity] * count,
        slots=[[-1] * capacity] * count, num_slots=2 * count, capacity=capacity,
    )
    prefix_pool = torch.full((2 * count, *pool.shape[1:]), SENTINEL, dtype=pool.dtype,
                             device=ctx.device)
    for i, slot in enumerate(initial):
        if slot >= 0:
            prefix_pool[i] = before[slot]
    rows = batch.token_index.to(ctx.device)
    _, prefix_code = result_of(prefill_call(ctx, x, prefix_meta, prefix_pool, dtype, rows=rows)())
    out.require(prefix_code == 0, f"the prefix run was rejected (code {prefix_code})")
    aligned = equal = 0
    worst_abs, worst_aligned, worst_unaligned = 0.0, 0.0, 0.0
    entries = meta.active_entries()
    on_gpu = torch.device(ctx.device).type == "cuda"
    for i, (n, _, offset, slot) in enumerate(entries):
        mine, theirs = pool[slot], prefix_pool[count + i]
        if offset % CHUNK == 0:
            aligned += 1
            same = bool(torch.equal(mine, theirs))
            equal += same
            worst_abs = max(worst_abs, float((mine - theirs).abs().max()))
            worst_aligned = max(worst_aligned, relative_error(theirs, mine))
            out.require(same or not on_gpu, f"checkpoint of sequence {n} at aligned offset "
                        f"{offset} differs from the prefix run's final state (max |diff| "
                        f"{worst_abs:.3e})")
        else:
            worst_unaligned = max(worst_unaligned, relative_error(theirs, mine))
    out.errors["prefix_aligned_max_abs"] = worst_abs
    if not on_gpu:
        # Under the interpreter tl.dot is the host's BLAS, whose kernel may sum a product in
        # another order when the prefix run's operands have other shapes: fp32 rounding, not bits.
        out.within("prefix_aligned", worst_aligned, INTERPRETED_ALIGNED_TOL)
    if aligned < len(entries):
        out.within("prefix_unaligned", worst_unaligned, case.options["tolerances"]["state"])
    out.checks.update(aligned_checkpoints=aligned, aligned_bitwise_equal=equal)
    out.require(aligned > 0 or case.params["offsets"] != "aligned",
                "no aligned checkpoint fits this layout")
    out.kernel = kernel_record(ctx, case_caps(ctx, case, meta, x.q.shape[0]))
    out.samples_ms = time_call(ctx, call)
    return out


def run_mirror(ctx: Context, case: Case) -> Outcome:
    """The chunk mirror (fp32) against the float64 recurrence: outputs, finals, checkpoints."""
    out = Outcome()
    rng = ctx.rng(case)
    x = case_inputs(ctx, case, case.lengths)
    offsets = [choose_offsets(n, 4, case.params["offsets"], rng) for n in case.lengths]
    tol = case.options["tolerances"]
    kwargs = {"cu_seqlens": x.cu_seqlens, "initial_state": x.initial_state, **x.gate_kwargs()}
    mirror = chunk_kda_mirror(x.q, x.k, x.v, x.g, x.beta, checkpoint_offsets=offsets, **kwargs)
    ref = recurrent_kda(x.q, x.k, x.v, x.g, x.beta, prefix_lengths=offsets, **kwargs)
    out.within("output", relative_error(ref.o, mirror.o), tol["output"])
    for n in range(len(case.lengths)):
        out.within("final_state", relative_error(ref.final_state[n], mirror.final_state[n]),
                   tol["state"])
        for i in range(len(offsets[n])):
            out.within("checkpoint", relative_error(ref.prefix_states[n][i],
                                                    mirror.checkpoint_states[n][i]), tol["state"])
    out.shape = {"num_seqs": len(case.lengths), "tokens": sum(case.lengths),
                 "lengths": list(case.lengths)}
    return out
