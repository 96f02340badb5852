"""One runner per scenario (profile-configs: kdabench.qualify.profile_configs), and RUNNERS,
the table from scenario name to runner.

A runner takes the run's Context and a Case and returns the Outcome it found.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import torch

from kdabench.inputs import lengths_with_edges, make_inputs
from kdabench.kernel_records import plan_record
from kdabench.matrix import FAULT_VARIANTS, OFFSET_MODES, Case
from kdabench.oracles import chunk_kda_mirror, prefix_batch, recurrent_kda, relative_error
from kdabench.qualify.faults import DUPLICATE, FAULT_BITS, FAULTS, FOURTH_BITS, RANDOM_MUTATIONS
from kdabench.qualify.harness import (
    SENTINEL,
    Context,
    Outcome,
    case_caps,
    case_inputs,
    check_rejected,
    check_valid,
    fault_base,
    index_dtype,
    kernel_record,
    kernels_api,
    load_initial,
    make_pool,
    prefill_call,
    rejected_run,
    result_of,
    shape_record,
    time_call,
    valid_run,
)
from kdabench.qualify.metadata import CHUNK, CannotBuild, Metadata, build_metadata, choose_offsets
from kdabench.qualify.profile_configs import run_profile_configs

INT32_LINE = 2**31  # elements: slots past it need 64-bit addressing
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


def run_fault(ctx: Context, case: Case) -> Outcome:
    """One fault class: its exact bit, the pool bit for bit unchanged, the output all NaN."""
    out = Outcome()
    x, meta, rng = fault_base(ctx, case)
    variant = case.params["variant"]
    FAULTS[variant](meta, rng)
    rejected_run(ctx, case, x, meta, FAULT_BITS[variant], out)
    return out


def run_invalid_fourth(ctx: Context, case: Case) -> Outcome:
    """Capacity 4, three good destinations and a bad fourth one."""
    out = Outcome()
    x, meta, rng = fault_base(ctx, case)
    n = max(range(len(meta.lengths)), key=lambda i: meta.lengths[i])
    length = meta.lengths[n]
    if length < 5:
        raise CannotBuild("the longest sequence is too short for four checkpoints")
    offsets = choose_offsets(length, 4, case.params["offsets"], rng)
    if len(offsets) < 4:
        offsets = sorted(rng.sample(range(1, length), 4))
    meta.offsets[n] = offsets
    for c in range(4):  # fresh slots at the end of the pool for entries that had none
        if meta.slots[n][c] < 0:
            meta.slots[n][c] = meta.num_slots
            meta.num_slots += 1
    variant = case.params["variant"]
    others = [m for m in range(len(meta.initial)) if m != n and meta.initial[m] >= 0]
    meta.slots[n][3] = {
        "out-of-range": meta.num_slots,
        "negative": -2,
        "duplicate-final": meta.final[others[0]] if others else meta.final[n],
        "duplicate-checkpoint": meta.slots[n][0],
        "aliases-initial": meta.initial[others[0]] if others else None,
    }[variant]
    if meta.slots[n][3] is None:
        raise CannotBuild("no other sequence has an initial slot to alias")
    out.details["fourth_destination"] = meta.slots[n][3]
    rejected_run(ctx, case, x, meta, FOURTH_BITS[variant], out)
    return out


def run_fuzz(ctx: Context, case: Case) -> Outcome:
    """Seeded random metadata sets; the metadata oracle says which are valid and their code."""
    out = Outcome()
    p, o = case.params, case.options
    capacity = p["capacity"]
    mutations = {name: FAULTS[name] for name, needs in FAULT_VARIANTS.items()
                 if needs <= capacity and not name.startswith("live-count")}
    mutations.update(RANDOM_MUTATIONS)
    sets, valid, invalid = [], 0, 0
    for s in range(o["sets"]):
        rng = ctx.rng(case, f"set{s}")
        count = rng.randint(1, o["max_seqs"])
        lengths = lengths_with_edges(rng, count, o["max_len"])
        meta = build_metadata(lengths, capacity, rng.choice(OFFSET_MODES), rng,
                              num_slots=None, initial_share=0.7, scatter=True)
        for n in range(count):
            if rng.random() < 0.2:
                meta.final[n] = -1
        applied = []
        if rng.random() < o["invalid_share"]:
            for name in rng.sample(sorted(mutations), rng.choice((1, 1, 2))):
                try:
                    mutations[name](meta, rng)
                except (CannotBuild, IndexError):  # the set has no room for this one
                    continue
                applied.append(name)
        x = case_inputs(ctx, case, lengths, f"set{s}")
        dtype = rng.choice((torch.int32, torch.int64))
        expected = meta.expected_code(x.q.shape[0])
        pool = make_pool(ctx, meta, x)
        before = pool.clone()
        output, code = result_of(prefill_call(ctx, x, meta, pool, dtype)())
        if not out.kernel:  # what the first set resolved (each set plans its own call)
            out.kernel = kernel_record(ctx, case_caps(ctx, case, meta, x.q.shape[0]))
        failures_before = len(out.failures)
        tag = f"set {s}: "
        if expected:
            invalid += 1
            check_rejected(out, pool, before, output, code, expected, expected, prefix=tag)
        else:
            valid += 1
            check_valid(out, ctx, case, x, meta, pool, before, output, code, prefix=tag)
        sets.append({"set": s, "lengths": lengths, "mutations": applied, "expected": expected,
                     "code": code, "ok": len(out.failures) == failures_before})
    out.checks.pop("error_code", None)
    out.checks.pop("expected_error_code", None)
    out.details.update(valid_sets=valid, invalid_sets=invalid, sets=sets)
    out.shape = {"sets": len(sets), "max_seqs": o["max_seqs"], "max_len": o["max_len"]}
    return out


def run_graph(ctx: Context, case: Case) -> Outcome:
    """One planned binding captured once, replayed with new lengths, offsets, slots and
    sequence counts: `replays` replays checked against the oracle, plus one (the third)
    whose metadata must be rejected, after which the replays must recover."""
    out = Outcome()
    kernels = kernels_api()
    p = case.params
    capacity, layout = p["capacity"], list(case.lengths)
    rng = ctx.rng(case)
    dtype = index_dtype(case)
    x = case_inputs(ctx, case, layout)
    max_seqs, tokens = len(layout), sum(layout)
    num_slots = max_seqs * (2 + capacity) + 4
    shape_meta = Metadata([0] * (max_seqs + 1), [-1] * max_seqs, [-1] * max_seqs,
                          [[1] * capacity] * max_seqs, [[-1] * capacity] * max_seqs,
                          num_slots, capacity)
    static = shape_meta.tensors(ctx.device, dtype)
    pool = torch.full((num_slots, p["heads"], p["head_dim"], p["head_dim"]), SENTINEL,
                      dtype=torch.float32, device=ctx.device)
    planned = kernels.plan(case_caps(ctx, case, shape_meta, tokens))
    binding = kernels.bind(planned, x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                           A_log=x.A_log, dt_bias=x.dt_bias, **static)

    def load(meta: Metadata) -> None:
        live = len(meta.initial)
        fresh = meta.tensors(ctx.device, dtype)
        tail = max_seqs - live
        static["cu_seqlens"].copy_(torch.cat([fresh["cu_seqlens"],
                                              fresh["cu_seqlens"][-1:].repeat(tail)]))
        for key in ("initial_state_indices", "final_state_indices",
                    "checkpoint_state_indices", "checkpoint_offsets"):
            filler = torch.full((tail, *fresh[key].shape[1:]), -1 if "offsets" not in key else 1,
                                dtype=dtype, device=ctx.device)
            static[key].copy_(torch.cat([fresh[key], filler]))
        binding.set_num_seqs(live)
        pool.fill_(SENTINEL)
        load_initial(pool, meta, x, range(num_slots))

    def draw(r: int) -> Metadata:
        count = max_seqs if r in (0, 2) else 1 if r == 1 else rng.randint(1, max_seqs)
        chosen = rng.sample(layout, count)
        meta = build_metadata(chosen, capacity, p["offsets"], rng, num_slots=num_slots,
                              scatter=r % 2 == 1)
        if r == 2:  # one rejected replay in the middle: two sequences share a final slot
            meta.final[1] = meta.final[0]
        return meta

    first = draw(0)
    load(first)
    kernels.run(binding)  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernels.run(binding)
    replays = []
    for r in range(case.options["replays"] + 1):
        meta = first if r == 0 else draw(r)
        load(meta)
        before = pool.clone()
        graph.replay()
        torch.cuda.synchronize()
        code = int(planned.error_code.item())
        tag = f"replay {r}: "
        if r == 2:
            expected = meta.expected_code(tokens)
            check_rejected(out, pool, before, binding.out, code, DUPLICATE, expected, prefix=tag)
        else:
            check_valid(out, ctx, case, x, meta, pool, before, binding.out, code, prefix=tag)
        replays.append({"num_seqs": len(meta.initial), "tokens": meta.cu_seqlens[-1],
                        "code": code, "rejected_on_purpose": r == 2})
    out.checks.pop("error_code", None)
    out.checks.pop("expected_error_code", None)
    out.details["replays"] = replays
    out.shape = {"max_seqs": max_seqs, "max_tokens": tokens, "num_slots": num_slots}
    out.kernel = plan_record(planned)
    out.samples_ms = time_call(ctx, graph.replay)
    del graph
    return out


def run_int32_boundary(ctx: Context, case: Case) -> Outcome:
    """Initial, final and checkpoint slots past the 2^31-element line of a ~9 GB pool."""
    out = Outcome()
    p = case.params
    rng = ctx.rng(case)
    x = case_inputs(ctx, case, case.lengths)
    slot_elements = p["heads"] * p["head_dim"] * p["head_dim"]
    line = -(-INT32_LINE // slot_elements)  # first slot starting at or past 2^31 elements
    meta = build_metadata(case.lengths, p["capacity"], p["offsets"], rng)
    base = line - 1  # slots used: base .. base + num_slots - 1 (all but one past the line)
    meta.initial = [s + base if s >= 0 else s for s in meta.initial]
    meta.final = [s + base if s >= 0 else s for s in meta.final]
    meta.slots = [[s + base if s >= 0 else s for s in row] for row in meta.slots]
    used = meta.num_slots
    meta.num_slots = base + used + 1
    pool = torch.empty((meta.num_slots, p["heads"], p["head_dim"], p["head_dim"]),
                       dtype=torch.float32, device=ctx.device)
    watched = [0, 1, *range(base, meta.num_slots)]
    pool[watched] = SENTINEL
    load_initial(pool, meta, x, range(meta.num_slots))
    before = {s: pool[s].clone() for s in watched}
    dtype = index_dtype(case)
    call = prefill_call(ctx, x, meta, pool, dtype)
    output, code = result_of(call())
    out.shape = {**shape_record(meta), "pool_bytes": pool.numel() * 4,
                 "first_slot_past_line": line,
                 "highest_write_element": (max(meta.write_slots()) + 1) * slot_elements}
    out.checks["error_code"] = code
    out.require(max(meta.write_slots()) * slot_elements >= INT32_LINE,
                "no destination slot lies past the 2^31-element line")
    check_valid(out, ctx, case, x, meta, pool, before, output, code)
    out.kernel = kernel_record(ctx, case_caps(ctx, case, meta, x.q.shape[0]))
    out.samples_ms = time_call(ctx, call)
    del pool, before, call
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


def run_contract(ctx: Context, case: Case) -> Outcome:
    """Host-side contracts: plan refuses what it cannot run, bind refuses bad shapes."""
    out = Outcome()
    kernels = kernels_api()
    variant = case.params["variant"]
    base = kernels.Caps(device=ctx.device, num_heads=2, head_dim=64, max_tokens=32, max_seqs=2,
                        max_state_slots=64, max_checkpoints=2, backend=ctx.backend)
    if variant == "decode-names-every-bit":
        text = kernels.decode_error_code(sum(int(f) for f in kernels.MetadataFault))
        missing = [f.name for f in kernels.MetadataFault if f.name not in text]
        out.require(not missing, f"decode_error_code leaves out {missing}")
        out.require(kernels.decode_error_code(0) == "accepted",
                    "code 0 does not decode as accepted")
        return out
    refusals = {
        "plan-refuses-capacity-3": ({"max_checkpoints": 3}, "max_checkpoints"),
        "plan-refuses-head-dim-96": ({"head_dim": 96}, "head_dim"),
        "plan-refuses-lower-bound-6": ({"lower_bound": -6.0}, "lower_bound"),
        "plan-refuses-unknown-backend": ({"backend": "no-such-backend"}, "backend"),
    }
    if variant in refusals:
        change, word = refusals[variant]

        def attempt():
            return kernels.plan(dataclasses.replace(base, **change))
    else:
        planned = kernels.plan(base)
        heads = 3 if variant == "bind-refuses-wrong-heads" else 2
        x = make_inputs([16, 16], heads, 64, seed=ctx.seed(case), device=ctx.device)
        meta = build_metadata([16, 16], 2, "unaligned", ctx.rng(case))
        tensors = meta.tensors(ctx.device, torch.int32)
        if variant == "bind-refuses-vector-metadata-for-capacity-2":
            tensors["checkpoint_offsets"] = tensors["checkpoint_offsets"][:, 0].contiguous()
            tensors["checkpoint_state_indices"] = (
                tensors["checkpoint_state_indices"][:, 0].contiguous())
            word = "checkpoint_offsets"
        else:
            word = "q"
        pool = torch.zeros(meta.num_slots, 2, 64, 64, device=ctx.device)

        def attempt():
            return kernels.bind(planned, x.q, x.k, x.v, x.g, x.beta, state_pool=pool, **tensors)
    try:
        attempt()
    except kernels.KdaConfigError as error:
        out.details["message"] = str(error)
        out.require(word in str(error), f"the refusal does not name {word!r}: {error}")
    else:
        out.failures.append(f"{variant}: accepted instead of refused")
    return out


RUNNERS: dict[str, Callable[[Context, Case], Outcome]] = {
    "accuracy": run_accuracy,
    "prefix": run_prefix,
    "inactive": run_inactive,
    "poisoned": run_poisoned,
    "invalid-fourth": run_invalid_fourth,
    "fault": run_fault,
    "graph": run_graph,
    "int32-boundary": run_int32_boundary,
    "profile-configs": run_profile_configs,
    "fuzz": run_fuzz,
    "mirror": run_mirror,
    "contract": run_contract,
}
