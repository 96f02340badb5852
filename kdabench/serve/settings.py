"""The reference server's KDABENCH_LOCAL_* settings: what it caches and how it prefills.

Read once when the server starts (:meth:`CacheSettings.from_env`):

    KDABENCH_LOCAL_PREFIX_CACHE=1|0           cache recurrent states at all (default 1)
    KDABENCH_LOCAL_CHECKPOINT_EXPORT=1|0      retain block-boundary states (default 1); 0 caches
                                              only each prompt's final state
    KDABENCH_LOCAL_BLOCK_TOKENS=N             block size in tokens (default 1024)
    KDABENCH_LOCAL_MAX_BATCHED_TOKENS=N       tokens per prefill kernel call (default 8192)
    KDABENCH_LOCAL_CACHE_GIB=X                the state cache's size in GiB (default 4)
    KDABENCH_LOCAL_CUDA_GRAPHS=1|0            replay each prefill call as a CUDA graph per
                                              token bucket (default: on where the server can,
                                              the kernel backend on CUDA; 1 elsewhere is an
                                              error)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

ENV_PREFIX_CACHE = "KDABENCH_LOCAL_PREFIX_CACHE"
ENV_CHECKPOINT_EXPORT = "KDABENCH_LOCAL_CHECKPOINT_EXPORT"
ENV_BLOCK_TOKENS = "KDABENCH_LOCAL_BLOCK_TOKENS"
ENV_MAX_BATCHED_TOKENS = "KDABENCH_LOCAL_MAX_BATCHED_TOKENS"
ENV_CACHE_GIB = "KDABENCH_LOCAL_CACHE_GIB"
ENV_CUDA_GRAPHS = "KDABENCH_LOCAL_CUDA_GRAPHS"
GIB = 1 << 30

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


class SettingsError(ValueError):
    """An environment variable holds a value the server cannot use."""


def _raw(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name)
    return None if raw is None or raw.strip() == "" else raw.strip()


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _raw(env, name)
    if raw is None:
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise SettingsError(f"{name}={env[name]!r}: expected 1 or 0")


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = _raw(env, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise SettingsError(f"{name}={env[name]!r}: expected a positive integer")
    return value


def _non_negative(env: Mapping[str, str], name: str, default: float) -> float:
    raw = _raw(env, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0.0 or value == float("inf"):
        raise SettingsError(f"{name}={env[name]!r}: expected a size in GiB, 0 or more")
    return value


@dataclass(frozen=True)
class CacheSettings:
    """What the server caches and how it splits a prefill; `from_env` reads them."""

    prefix_cache: bool = True
    checkpoint_export: bool = True
    block_tokens: int = 1024
    max_batched_tokens: int = 8192
    cache_gib: float = 4.0
    cuda_graphs: bool | None = None  # None: on where the engine can (kernel backend, CUDA)

    def __post_init__(self) -> None:
        if self.max_batched_tokens < self.block_tokens:
            raise SettingsError(
                f"{ENV_MAX_BATCHED_TOKENS}={self.max_batched_tokens} is smaller than "
                f"{ENV_BLOCK_TOKENS}={self.block_tokens}: a prefill call must hold a block"
            )

    @property
    def cache_bytes(self) -> int:
        return int(self.cache_gib * GIB) if self.prefix_cache else 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CacheSettings:
        return cls(
            prefix_cache=_flag(env, ENV_PREFIX_CACHE, True),
            checkpoint_export=_flag(env, ENV_CHECKPOINT_EXPORT, True),
            block_tokens=_positive_int(env, ENV_BLOCK_TOKENS, 1024),
            max_batched_tokens=_positive_int(env, ENV_MAX_BATCHED_TOKENS, 8192),
            cache_gib=_non_negative(env, ENV_CACHE_GIB, 4.0),
            cuda_graphs=None if _raw(env, ENV_CUDA_GRAPHS) is None
            else _flag(env, ENV_CUDA_GRAPHS, False),
        )

    def to_dict(self) -> dict[str, Any]:
        recorded = asdict(self)
        if self.cuda_graphs is None:
            recorded["cuda_graphs"] = "auto"
        return recorded
