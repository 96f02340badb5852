"""The embedded server's prefill on a GPU (GPU tier; skipped without CUDA): the Triton kernel
path through the device state cache against the chunk path on the same weights.

A Kimi-Linear-shaped model (heads of 128, low-rank gate, bf16) cut to 2 layers and 2 heads,
prompts of 3,000 tokens in calls of 1,024 with blocks of 256: every retained state, the
logits, and a shared prefix resumed from a checkpoint agree with the chunk path; and with
CUDA graphs (calls replayed per token bucket, padded) with the eager kernel path.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kdabench.oracles import relative_error
from kdabench.serve.engine import Engine
from kdabench.serve.model import KdaModel, preset_config
from kdabench.serve.prefix_cache import PrefixCache
from kdabench.serve.settings import CacheSettings

pytestmark = pytest.mark.gpu

STATE_TOL = 3e-3  # bf16 q/k/v, fp32 states: the kernel tests' state tolerance
LOGIT_TOL = 5e-3
SETTINGS = CacheSettings(block_tokens=256, max_batched_tokens=1024)


@pytest.fixture(scope="module")
def model() -> KdaModel:
    config = replace(preset_config("kimi-linear-tp4", seed=3), num_layers=2, num_heads=2)
    return KdaModel(config, device="cuda")


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_kernel_path_retains_the_chunk_paths_states(model):
    engines = {name: Engine(model, name, max_tokens=1024, max_slots=64 + 2)
               for name in ("kernel", "chunk")}
    caches = {name: PrefixCache(model.config.state_shape, 64 * model.config.state_bytes,
                                device="cuda") for name in engines}
    first = prompt(3000, seed=1)
    second = first[:2304] + prompt(700, seed=2)  # resumes at the 2,304 checkpoint
    results = {}
    for name, engine in engines.items():
        cold = engine.prefill_prompt(first, caches[name], SETTINGS)
        shared = engine.prefill_prompt(second, caches[name], SETTINGS)
        assert (cold.kernel_calls, cold.checkpoints_exported) == (3, 11)
        assert (shared.cached_tokens, shared.computed_tokens) == (2304, 700)
        # the device's own time for the calls sits inside the host's compute time on CUDA
        assert 0 < shared.compute_detail["device_ms"] <= shared.timing["compute_ms"]
        results[name] = cold, shared
    for index in (0, 1):
        kernel, chunk = results["kernel"][index], results["chunk"][index]
        assert relative_error(chunk.state, kernel.state) <= STATE_TOL
        assert relative_error(chunk.logits, kernel.logits) <= LOGIT_TOL
    for length in (256, 1024, 2304, 2816):
        states = []
        for name in engines:
            hit = caches[name].lookup(bytes(first[: length + 1]))
            assert hit.length == length
            states.append(caches[name].state(hit.slot))
        assert relative_error(states[1], states[0]) <= STATE_TOL


def test_graph_replays_retain_what_eager_calls_do(model):
    engines = {graphs: Engine(model, "kernel", max_tokens=1024, max_slots=64 + 2,
                              cuda_graphs=graphs) for graphs in (False, True)}
    caches = {graphs: PrefixCache(model.config.state_shape, 64 * model.config.state_bytes,
                                  device="cuda") for graphs in engines}
    assert engines[True].capture_graphs(caches[True]) == [512, 1024]
    first = prompt(3000, seed=5)
    second = first[:2304] + prompt(300, seed=6)  # resumes at 2,304, then a 300-token call
    results = {}
    for graphs, engine in engines.items():
        results[graphs] = [engine.prefill_prompt(p, caches[graphs], SETTINGS)
                           for p in (first, second)]
    for eager, replayed in zip(results[False], results[True], strict=True):
        assert (replayed.cached_tokens, replayed.kernel_calls) == \
            (eager.cached_tokens, eager.kernel_calls)
        # padded rows change the projections' GEMM shapes, and with them cuBLAS's algorithm
        assert relative_error(eager.state, replayed.state) <= STATE_TOL
        assert relative_error(eager.logits, replayed.logits) <= LOGIT_TOL
    for length in (256, 1024, 2304, 2816):
        states = [caches[graphs].state(caches[graphs].lookup(bytes(first[: length + 1])).slot)
                  for graphs in engines]
        assert relative_error(states[0], states[1]) <= STATE_TOL
