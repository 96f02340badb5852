"""Checking captured graphs before their time counts: each input set's graph is replayed once
and what it writes is compared with an eager call's on the same set.

    check = check_replays(captured, eager)     # captured: [(graph, [tensors it writes])]
    check["problem"]                           # None, or why the graphs must not be timed

``captured[i]`` is set i's graph with the tensors its replay writes (the output; for kdabench
also the pool slots of the final states and checkpoints); ``eager[i]()`` runs set i eagerly
and returns the same tensors, in the same order. The captured tensors are zeroed before the
replay, so a graph that skips its work, or replays another set's (stale) work, is caught.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kdabench.bench.sanity import SANITY_TOLERANCE, relative_error


def replay_error(graph: Any, written: Sequence[Any], eager: Callable[[], Sequence[Any]]) -> float:
    """The largest relative error, over the tensors a replay of ``graph`` writes
    (``written``), against what ``eager()`` returns on the same input set."""
    import torch

    expected = [t.float().clone() for t in eager()]
    with torch.inference_mode():  # a captured output may be an inference tensor (fla's are)
        for tensor in written:
            tensor.zero_()
    graph.replay()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return max(relative_error(got, want) for got, want in zip(written, expected, strict=True))


def check_replays(captured: Sequence[tuple[Any, Sequence[Any]]],
                  eager: Sequence[Callable[[], Sequence[Any]]],
                  tolerance: float = SANITY_TOLERANCE) -> dict[str, Any]:
    """Every set's replay against its eager call: {sets, errors (one per set), max_error,
    tolerance, problem (None when every error is within ``tolerance``)}."""
    errors = [replay_error(graph, written, call)
              for (graph, written), call in zip(captured, eager, strict=True)]
    bad = [index for index, error in enumerate(errors) if not error <= tolerance]
    worst = max(errors) if errors else None
    problem = None
    if bad:
        problem = (f"graph replay of input set(s) {', '.join(map(str, bad))} of {len(errors)} "
                   f"differs from an eager call on the same set (relative error up to "
                   f"{worst:.2e} > {tolerance:g}): graph timing not taken")
    return {"sets": len(errors), "errors": errors, "max_error": worst, "tolerance": tolerance,
            "problem": problem}
