"""The candidate configs of one query: the grid of the queries file, filtered by the rule.

Every combination of the grid's values (KernelConfig fields not in the grid keep the
dataclass's defaults) is a candidate unless the rule refuses it:

1. kdabench.kernels.catalog.config_problems: block_v a power of two in [16, head_dim]
   dividing head_dim, chunk_size a multiple of 16, warps in 1..16 (powers of two),
   num_stages >= 1, a Triton dot precision, a known operand dtype;
2. the shared-memory estimate of the state pass (catalog.shared_memory_estimate:
   num_stages * E * max(C*K + K*BV, K*C + C*BV, C*C + C*BV) bytes, E = 4, or 2 for bf16
   operands) within what a program may use on the device tuned (a CUDA device's opt-in
   limit, 227 KB on sm_90; elsewhere kernels.config.SHARED_MEMORY_BUDGET_BYTES). The estimate
   is a lower bound: a config that still does not fit fails to compile and is recorded.

The heuristic's config is always a candidate (first), whatever the rule says of it, so a
profile entry is never chosen without being timed against what AUTO would fall back to.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Candidates:
    """The configs to time, and those the rule refused with the reason."""

    configs: list[Any]
    heuristic: Any
    refused: list[tuple[Any, str]]
    rule: str


RULE = ("config_problems(config, head_dim) is empty, and shared_memory_estimate(config, "
        "head_dim) = num_stages * E * max(C*K + K*BV, K*C + C*BV, C*C + C*BV) <= the "
        "device's shared memory per program (E = 4 bytes, 2 for bf16 operands); the "
        "heuristic's config is always timed")


def shared_memory_limit(device: Any = "cpu") -> int:
    """Shared memory one program may use on `device`: a CUDA device's opt-in limit, else the
    kernel's portable budget (kernels.config.SHARED_MEMORY_BUDGET_BYTES)."""
    import torch

    from kdabench.kernels.catalog import shared_memory_budget

    device = torch.device(device)
    if device.type == "cuda":
        limit = getattr(torch.cuda.get_device_properties(device),
                        "shared_memory_per_block_optin", None)
        if limit:
            return int(limit)
    return shared_memory_budget()


def candidates(query: Any, grid: dict[str, list[Any]], device: Any = "cpu") -> Candidates:
    """The heuristic's config on `device`, then every valid grid combination (grid order)."""
    from kdabench.kernels import KernelConfig
    from kdabench.kernels.catalog import config_problems, shared_memory_estimate
    from kdabench.kernels.policy import heuristic_config

    heuristic = heuristic_config(query.caps(device))
    budget = shared_memory_limit(device)
    configs, refused = [heuristic], []
    names = list(grid)
    for values in itertools.product(*(grid[name] for name in names)):
        config = dataclasses.replace(KernelConfig(), **dict(zip(names, values, strict=True)))
        if config in configs:
            continue
        problems = config_problems(config, query.head_dim)
        estimate = shared_memory_estimate(config, query.head_dim)
        if not problems and estimate > budget:
            problems = [f"shared memory estimate {estimate} B over the budget {budget} B"]
        if problems:
            refused.append((config, "; ".join(problems)))
        else:
            configs.append(config)
    return Candidates(configs, heuristic, refused, RULE)


def narrowed(found: Candidates, first_query: str, shortlist: list[Any]) -> Candidates:
    """The heuristic and the shortlisted configs of `found` (a shape's later query reusing the
    fastest configs of its first); the rest are refused as outside the shortlist."""
    kept = [found.heuristic] + [c for c in shortlist if c != found.heuristic and c in found.configs]
    reason = f"outside the shortlist (the {len(shortlist)} fastest of {first_query})"
    refused = found.refused + [(c, reason) for c in found.configs if c not in kept]
    return Candidates(kept, found.heuristic, refused, found.rule)
