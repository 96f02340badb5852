"""A deterministic stand-in for KernelRunner: a time model per config, oracle errors on
demand, broken candidates on demand (shared by the tune library and CLI tests)."""

from __future__ import annotations

import dataclasses

import torch

from kdabench.tune import Timed

H200 = "NVIDIA H200"
TINY_QUERIES = """
schema = "kdabench.tune-queries.v1"
name = "tiny"
head_dim = 64
capacities = [4, 1]
[timing]
reps = 9
warmup = 1
[grid]
block_v = [16, 32, 64]
num_warps = [4, 8]
num_stages = [1, 2]
[[query]]
tokens = 64
heads = 1
seqs = 2
[[query]]
tokens = 128
heads = 2
"""

# Relative cost per field value; the product times a size term is the median.
COST = {"block_v": {16: 1.3, 32: 1.0, 64: 0.8, 128: 0.9},
        "num_warps": {2: 1.1, 4: 1.0, 8: 0.95},
        "num_stages": {1: 1.02, 2: 1.0, 3: 0.99}}
PATTERN = (1.0, 0.98, 1.02, 0.99, 1.01)
# the CuTe backend's time per key split over its cute_factor: key split 2 fastest, so a tuned
# entry's cute config differs from the default (4)
CUTE_SPLIT_FACTOR = {1: 1.2, 2: 1.0, 4: 1.1, 8: 1.15}


def fake_ms(query, config) -> float:
    size = query.shape.tokens * query.shape.heads / 1024 * (1.1 if query.capacity == 4 else 1.0)
    factor = 1.0
    for name, table in COST.items():
        factor *= table.get(getattr(config, name), 1.0)
    return size * factor


class FakeRunner:
    """inaccurate: configs whose oracle errors exceed any tolerance; broken: block_v values
    whose candidates fail to compile; unavailable: the reason it cannot run; cute_factor: the
    CuTe backend's time at its fastest key split over the fastest Triton config's (None: it
    cannot run here)."""

    def __init__(self, *, name=H200, unavailable=None, inaccurate=(), broken=(),
                 cute_factor=None):
        self.timer = None
        self.name, self._unavailable = name, unavailable
        self.inaccurate, self.broken = list(inaccurate), set(broken)
        self.cute_factor = cute_factor
        self.measured, self.checked = [], []

    def unavailable(self):
        return self._unavailable

    def backend_unavailable(self, backend, query):
        return "no CuTe build here" if self.cute_factor is None else None

    def identity(self):
        return {"kind": "fake", "device": "fake:0", "name": self.name}

    def device_name(self):
        return self.name

    def target(self):
        return torch.device("cpu")

    def measure(self, query, configs, warmup, reps, seed):
        self.measured.append((query.id, list(configs), warmup, reps))
        timed = []
        for config in configs:
            if getattr(config, "backend", "triton") == "cute":
                triton = [c for c in configs if not hasattr(c, "backend")]
                ms = fake_ms(query, best(query, triton)) * self.cute_factor * \
                    CUTE_SPLIT_FACTOR[config.key_split]
                timed.append(Timed([ms] * reps, None, 3))
                continue
            if config.block_v in self.broken:
                timed.append(Timed([], "OutOfResources: out of resource: shared memory", 3))
                continue
            ms = fake_ms(query, config)
            timed.append(Timed([ms * PATTERN[i % len(PATTERN)] for i in range(reps)], None, 3))
        return timed

    def check(self, query, config, check, seed):
        self.checked.append((query.id, config))
        bad = config in self.inaccurate
        return {"instance": {"tokens": 64, "heads": query.shape.heads, "seqs": 2},
                "errors": {"output": 0.5 if bad else 1e-3, "final_state": 2e-4,
                           "checkpoint": 2e-4}}


def best(query, configs):
    """The fastest config under the time model (ties: the first)."""
    return min(configs, key=lambda c: fake_ms(query, c))


def replace(config, **changes):
    return dataclasses.replace(config, **changes)
