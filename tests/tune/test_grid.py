"""Candidate configs: the grid over KernelConfig's fields, filtered by the stated rule, with
the heuristic's config always first."""

from __future__ import annotations

import dataclasses

from kdabench.kernels import KernelConfig
from kdabench.kernels.catalog import (
    config_problems,
    shared_memory_budget,
    shared_memory_estimate,
)
from kdabench.kernels.policy import heuristic_config
from kdabench.tune import candidates, load_queries, parse_queries

QUERY = parse_queries('schema = "kdabench.tune-queries.v1"\n[[query]]\ntokens = 8192\n'
                      'heads = 8\n').queries[0]


def test_heuristic_first_then_the_valid_combinations():
    grid = {"block_v": [32, 64], "num_warps": [4, 8]}
    found = candidates(QUERY, grid)
    assert found.configs[0] == found.heuristic == heuristic_config(QUERY.caps("cpu"))
    combos = [dataclasses.replace(KernelConfig(), block_v=b, num_warps=w)
              for b in (32, 64) for w in (4, 8)]
    admitted = [c for c in combos if not config_problems(c, 128)
                and shared_memory_estimate(c, 128) <= shared_memory_budget()]
    assert found.configs[1:] == [c for c in admitted if c != found.heuristic]
    assert [c for c, _ in found.refused] == [c for c in combos if c not in admitted]
    for config in found.configs[1:]:  # the fields not in the grid keep their defaults
        assert config.num_stages == KernelConfig().num_stages
        assert config.dot_precision == KernelConfig().dot_precision


def test_the_rule_refuses_with_reasons():
    found = candidates(QUERY, {"block_v": [48, 128], "num_stages": [1, 8]})
    reasons = {(c.block_v, c.num_stages): reason for c, reason in found.refused}
    assert "block_v 48 does not divide head_dim 128" in reasons[48, 1]
    assert reasons[128, 8].startswith("shared memory estimate ")
    assert f"over the budget {shared_memory_budget()} B" in reasons[128, 8]
    for config in found.configs[1:]:
        assert config_problems(config, 128) == []
        assert shared_memory_estimate(config, 128) <= shared_memory_budget()


def test_the_rule_refuses_checkpoints_in_the_pass_beyond_16_token_chunks():
    found = candidates(QUERY, {"chunk_size": [16, 32], "checkpoints": ["kernel", "pass"]})
    assert [(c.chunk_size, c.checkpoints, reason) for c, reason in found.refused] == [
        (32, "pass", "checkpoints 'pass' runs with 16-token chunks only (got chunk_size 32)")]


def test_the_default_grid_times_every_combination_and_the_heuristic():
    queries = load_queries(None)
    found = candidates(queries.queries[0], queries.grid)
    combinations = 1
    for values in queries.grid.values():
        combinations *= len(values)
    # bf16 operands fit every combination in the CPU budget; only the inverse solve, which
    # the fused pipeline does not have, is refused there
    assert found.refused
    for config, reason in found.refused:
        assert (config.pipeline, config.solve) == ("fused", "inverse")
        assert reason == "solve 'inverse' runs in the split pipeline only (got 'fused')"
    assert len(found.refused) == combinations // 4
    assert found.configs[0] == found.heuristic not in found.configs[1:]
    assert len(found.configs) == 1 + combinations - len(found.refused) == len(set(found.configs))
    assert {(c.pipeline, c.solve) for c in found.configs} == {
        ("fused", "substitution"), ("split", "substitution"), ("split", "inverse")}
