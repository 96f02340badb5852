"""The reference server's prefix cache: recurrent states keyed by the sha256 of a token prefix.

A linear-attention model cannot reuse a prefix from per-token KV blocks: it needs the whole
recurrent state (every layer's [H, V, K]) at the prefix's end. So an entry is "the model's
state after exactly these L tokens", and a lookup finds the longest cached prefix L of the
prompt with L < len(prompt): at least one token must still be computed to produce logits.

Which states exist depends on checkpoint export (see `kdabench.serve.engine.plan_prefill_calls`):
with export on, every block boundary inside a prefill is exported and cached, so a prompt that
shares a block-aligned prefix with an earlier one resumes there; with export off only the
state at the end of each prompt is cached, as a server without interior checkpoints keeps.

Settings come from the environment, read once when the server starts:

    KDABENCH_LOCAL_PREFIX_CACHE=1|0        cache states at all (default 1)
    KDABENCH_LOCAL_CHECKPOINT_EXPORT=1|0   export block-boundary checkpoints (default 1)
    KDABENCH_LOCAL_BLOCK_TOKENS=N          block size in tokens (default 1024)
    KDABENCH_LOCAL_CACHE_ENTRIES=N         LRU bound on cached states (default 256)
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

ENV_PREFIX_CACHE = "KDABENCH_LOCAL_PREFIX_CACHE"
ENV_CHECKPOINT_EXPORT = "KDABENCH_LOCAL_CHECKPOINT_EXPORT"
ENV_BLOCK_TOKENS = "KDABENCH_LOCAL_BLOCK_TOKENS"
ENV_CACHE_ENTRIES = "KDABENCH_LOCAL_CACHE_ENTRIES"

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


class SettingsError(ValueError):
    """An environment variable holds a value the server cannot use."""


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingsError(f"{name}={raw!r}: expected 1 or 0")


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected a positive integer") from None
    if value < 1:
        raise SettingsError(f"{name}={raw!r}: expected a positive integer")
    return value


@dataclass(frozen=True)
class CacheSettings:
    """What the server caches; `from_env` reads the KDABENCH_LOCAL_* variables."""

    prefix_cache: bool = True
    checkpoint_export: bool = True
    block_tokens: int = 1024
    max_entries: int = 256

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CacheSettings:
        return cls(
            prefix_cache=_flag(env, ENV_PREFIX_CACHE, True),
            checkpoint_export=_flag(env, ENV_CHECKPOINT_EXPORT, True),
            block_tokens=_positive_int(env, ENV_BLOCK_TOKENS, 1024),
            max_entries=_positive_int(env, ENV_CACHE_ENTRIES, 256),
        )


def prefix_key(tokens: Sequence[int]) -> str:
    """sha256 (hex) of a byte-token prefix."""
    return hashlib.sha256(bytes(tokens)).hexdigest()


@dataclass(frozen=True)
class CacheHit:
    """The longest usable cached prefix: `length` tokens and the state after them (None: miss)."""

    length: int
    state: torch.Tensor | None


class PrefixCache:
    """LRU map sha256(prefix) -> recurrent state [layers, H, V, K]; thread-safe; disabled = no-op."""

    def __init__(self, enabled: bool = True, max_entries: int = 256):
        self.enabled = enabled
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[int, torch.Tensor]] = OrderedDict()
        self._lengths: dict[int, int] = {}  # prefix length -> how many entries have it
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def insert(self, tokens: Sequence[int], state: torch.Tensor) -> None:
        """Cache `state`, the model's state after exactly `tokens` (stored as a detached copy)."""
        if not self.enabled or not tokens:
            return
        key = prefix_key(tokens)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return
            self._entries[key] = (len(tokens), state.detach().clone())
            self._lengths[len(tokens)] = self._lengths.get(len(tokens), 0) + 1
            while len(self._entries) > self.max_entries:
                _, (length, _) = self._entries.popitem(last=False)
                self._drop_length(length)

    def _drop_length(self, length: int) -> None:
        self._lengths[length] -= 1
        if not self._lengths[length]:
            del self._lengths[length]

    def lookup(self, tokens: Sequence[int]) -> CacheHit:
        """The longest cached prefix of `tokens` shorter than the whole; marks it recently used.

        Only lengths that some entry has are hashed, longest first, so a lookup costs at
        most one sha256 per distinct cached length.
        """
        if not self.enabled:
            return CacheHit(0, None)
        with self._lock:
            for length in sorted((n for n in self._lengths if n < len(tokens)), reverse=True):
                key = prefix_key(tokens[:length])
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
                    return CacheHit(length, entry[1])
        return CacheHit(0, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._lengths.clear()
