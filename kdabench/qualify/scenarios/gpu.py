"""The GPU-tier runners that need the device's machinery: graph (CUDA-graph capture and
replay) and int32-boundary (slots past the 2^31-element line of a pool of several GB)."""

from __future__ import annotations

import torch

from kdabench.kernel_records import plan_record
from kdabench.matrix import Case
from kdabench.qualify.faults import DUPLICATE
from kdabench.qualify.harness import (
    SENTINEL,
    Context,
    Outcome,
    case_caps,
    case_inputs,
    check_rejected,
    check_valid,
    index_dtype,
    kernel_record,
    kernels_api,
    load_initial,
    prefill_call,
    result_of,
    shape_record,
    time_call,
)
from kdabench.qualify.metadata import Metadata, build_metadata

INT32_LINE = 2**31  # elements: slots past it need 64-bit addressing


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
    planned = kernels.plan(case_caps(ctx, case, shape_meta, tokens), ctx.config)
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
