"""What the reference server runs: the device, the model preset, the engine and the state
cache, built after checking that they fit; and how the server describes them (/version).

`resolve_device("auto")` is CUDA where torch sees a GPU, else the CPU. `build_runtime` checks
the preset against the device's free memory before drawing any weight: weights, the
activations of one prefill call (at most KDABENCH_LOCAL_MAX_BATCHED_TOKENS tokens of the
longest prompt; chunked prefill bounds them), and the state cache with its scratch slots.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from .engine import CHECKPOINT_CAPACITY, Engine
from .model import KdaModel, ModelConfig, preset_config
from .prefix_cache import SCRATCH_SLOTS, PrefixCache
from .settings import GIB, CacheSettings

DEVICES = ("auto", "cpu", "cuda")
ACTIVATION_FACTOR = 24  # bytes per token and projected channel one call holds at its peak
HEADROOM = 1.1  # the caching allocator's fragmentation and the CUDA context


class FitError(ValueError):
    """The preset, its activations and the state cache do not fit the device."""


def resolve_device(device: str) -> str:
    """auto -> cuda where a GPU is visible, else cpu; ValueError for what cannot run."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; expected {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA GPU is visible; use --device cpu")
    return device


def default_preset(device: str) -> str:
    """The preset a server runs when none is named: a real geometry on a GPU, tiny on a CPU."""
    return "kimi-linear-tp4" if device == "cuda" else "tiny"


def memory_needed(config: ModelConfig, settings: CacheSettings, max_prompt_tokens: int
                  ) -> dict[str, int]:
    """Bytes the server holds: weights, one call's activations, the state cache."""
    tokens = min(settings.max_batched_tokens, max_prompt_tokens)
    channels = config.d_model + 4 * config.num_heads * config.head_dim + config.mlp_hidden
    state_slots = settings.cache_bytes // config.state_bytes + SCRATCH_SLOTS
    return {
        "weights": config.parameters * config.torch_dtype.itemsize,
        "activations": tokens * channels * ACTIVATION_FACTOR,
        "state_cache": state_slots * config.state_bytes,
    }


def free_memory(device: str) -> int:
    """Bytes free on the device now (host memory available for the CPU)."""
    if device == "cuda":
        return int(torch.cuda.mem_get_info()[0])
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fit(config: ModelConfig, settings: CacheSettings, max_prompt_tokens: int,
              device: str) -> None:
    """FitError, one line, when the server would not fit the device's free memory."""
    needed = memory_needed(config, settings, max_prompt_tokens)
    total, free = sum(needed.values()) * HEADROOM, free_memory(device)
    if total > free:
        parts = ", ".join(f"{name.replace('_', ' ')} {size / GIB:.1f}" for name, size in
                          needed.items())
        raise FitError(
            f"model preset {config.preset!r} does not fit {device}: it needs about "
            f"{total / GIB:.1f} GiB ({parts} GiB, with {HEADROOM - 1:.0%} headroom) and "
            f"{free / GIB:.1f} GiB is free; choose a smaller preset or a smaller "
            "KDABENCH_LOCAL_CACHE_GIB"
        )


@dataclass
class Runtime:
    """The model, its engine and its state cache on one device."""

    device: str
    model: KdaModel
    engine: Engine
    cache: PrefixCache
    settings: CacheSettings

    def describe(self) -> dict[str, Any]:
        """What the server runs on and with, for /version and the sweep's receipt."""
        from kdabench.environment import device_identity, toolchain

        identity, versions = device_identity(self.device), toolchain()
        stats = self.cache.stats()
        return {
            "device": {key: identity.get(key) for key in (
                "kind", "device", "name", "compute_capability", "driver_version",
                "cuda_runtime_version", "total_memory_bytes")},
            **self.engine.describe(),
            "torch": versions["torch"],
            "triton": versions["triton"],
            "model": self.model.config.describe(),
            "retention": {**self.settings.to_dict(), "checkpoint_capacity": CHECKPOINT_CAPACITY,
                          "cache_slots": stats.slots, "cache_capacity_bytes":
                          stats.capacity_bytes},
        }


def build_runtime(device: str, preset: str | None, seed: int, settings: CacheSettings,
                  max_prompt_tokens: int) -> Runtime:
    """Resolve the device and preset, check the fit, then build (ValueError on bad input)."""
    device = resolve_device(device)
    config = preset_config(preset or default_preset(device), seed)
    check_fit(config, settings, max_prompt_tokens, device)
    model = KdaModel(config, device=device)
    cache = PrefixCache(config.state_shape, settings.cache_bytes, device=device)
    engine = Engine(model, max_tokens=settings.max_batched_tokens,
                    max_slots=max(cache.slots + SCRATCH_SLOTS, 2 + CHECKPOINT_CAPACITY),
                    cuda_graphs=settings.cuda_graphs)
    return Runtime(device, model, engine, cache, settings)
