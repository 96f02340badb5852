"""Which worker runs which case: cases that compile the same kernels stay together, long cases
are spread, and the same cases and worker count always give the same plan.

The GPU tier's time goes mostly to Triton compiles (single-threaded CPU work, one per distinct
set of compile-time constants and config) and, for long sequences, to the float64 oracle. A
worker compiles a kernel once and then reuses it, so `plan_workers` keeps each group of cases
with one :func:`compile_key` in one worker unless the group alone is more than a worker's share
of the estimated time; such a group is cut into as few parts as that needs. The parts then go,
longest first, to the worker with the least estimated time so far.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kdabench.matrix import Case

#: Estimated seconds to compile one group's kernels (validation, stage 1, state pass,
#: checkpoints) on first use; a cache hit on disk costs far less, which the plan ignores.
COMPILE_S = 6.0
#: Estimated seconds of a case besides its kernels' compiles and its oracle tokens: inputs,
#: kernel calls, checks, timing samples.
CASE_S = 0.5
#: Estimated seconds of the float64 token-by-token oracle per token (~60 us on an H200).
ORACLE_S_PER_TOKEN = 60e-6


def compile_key(case: Case) -> tuple:
    """What decides which kernels a case compiles, as far as the matrix says before it runs:
    the kernels' compile-time constants (heads, head dim, checkpoint capacity, gate, q/k L2
    norm, beta sigmoid) and the index dtype of the metadata (part of the kernels' signature).
    The config plan() picks is known only when the case runs, so it is not part of the key."""
    p = case.params
    return (p.get("heads"), p.get("head_dim"), p.get("capacity"), p.get("gate", "precomputed"),
            bool(p.get("qk_l2norm", False)), bool(p.get("beta_sigmoid", False)),
            p.get("index_dtype", "int32"))


def estimated_s(case: Case) -> float:
    """Estimated seconds of one case without its compiles, from the tokens its oracle runs."""
    options = case.options
    if case.scenario == "fuzz":
        tokens = options.get("sets", 1) * options.get("max_seqs", 1) * options.get("max_len", 1)
        return CASE_S * options.get("sets", 1) + ORACLE_S_PER_TOKEN * tokens / 4
    tokens = sum(case.lengths) if case.lengths else 0
    passes = options.get("replays", 0) + 1 if case.scenario == "graph" else 1
    return CASE_S + ORACLE_S_PER_TOKEN * tokens * passes


def plan_workers(cases: Sequence[Case], workers: int) -> list[list[Case]]:
    """The cases of each worker (at most `workers` lists, none empty, each in matrix order);
    every case lands in exactly one list."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    groups: dict[tuple, list[Case]] = {}
    for case in sorted(cases, key=lambda c: c.index):
        groups.setdefault(compile_key(case), []).append(case)
    total = sum(COMPILE_S + sum(estimated_s(c) for c in group) for group in groups.values())
    share = total / workers
    parts: list[tuple[float, list[Case]]] = []
    for group in groups.values():
        cost = COMPILE_S + sum(estimated_s(c) for c in group)
        parts += _cut(group, min(len(group), math.ceil(cost / share - 1e-9)))
    loads = [0.0] * workers
    plan: list[list[Case]] = [[] for _ in range(workers)]
    for cost, part in sorted(parts, key=lambda item: (-item[0], item[1][0].index)):
        lightest = min(range(workers), key=lambda w: (loads[w], w))
        loads[lightest] += cost
        plan[lightest] += part
    return [sorted(chosen, key=lambda c: c.index) for chosen in plan if chosen]


def _cut(group: list[Case], count: int) -> list[tuple[float, list[Case]]]:
    """One group in `count` parts of near-equal estimated time (longest case first into the
    lightest part), each part paying the group's compile once: (estimated s, cases)."""
    loads = [COMPILE_S] * count
    parts: list[list[Case]] = [[] for _ in range(count)]
    for case in sorted(group, key=lambda c: (-estimated_s(c), c.index)):
        lightest = min(range(count), key=lambda i: (loads[i], i))
        loads[lightest] += estimated_s(case)
        parts[lightest].append(case)
    return list(zip(loads, parts, strict=True))
