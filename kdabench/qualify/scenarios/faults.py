"""The runners that break metadata on purpose: fault (one rule), invalid-fourth (a bad fourth
checkpoint destination) and fuzz (seeded random sets judged by the metadata oracle)."""

from __future__ import annotations

import torch

from kdabench.inputs import lengths_with_edges
from kdabench.matrix import FAULT_VARIANTS, OFFSET_MODES, Case
from kdabench.qualify.faults import FAULT_BITS, FAULTS, FOURTH_BITS, RANDOM_MUTATIONS
from kdabench.qualify.harness import (
    Context,
    Outcome,
    case_caps,
    case_inputs,
    check_rejected,
    check_valid,
    fault_base,
    kernel_record,
    make_pool,
    prefill_call,
    rejected_run,
    result_of,
)
from kdabench.qualify.metadata import CannotBuild, build_metadata, choose_offsets


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
