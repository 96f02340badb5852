"""The reference server's prefix cache: recurrent states keyed by the sha256 of a token prefix,
held in a pool preallocated on the server's device.

A linear-attention model cannot reuse a prefix from per-token KV blocks: it needs the whole
recurrent state (every layer's [H, V, K]) at the prefix's end. So an entry is "the model's
state after exactly these L tokens", and a lookup finds the longest cached prefix L of the
prompt with L < len(prompt): at least one token must still be computed to produce logits.

The pool is one fp32 tensor [layers, slots + SCRATCH_SLOTS, H, V, K]: `slots` cache slots (as
many whole states as KDABENCH_LOCAL_CACHE_GIB holds) and two scratch slots the prefill hands
its state from one call to the next through. `pool[layer]` is the [slots, H, V, K] state pool
the kernel reads initial states from and writes final states and checkpoints into, so a state
enters the cache where the kernel writes it: no copy, no allocation, no host sync. The host
side only keeps the map key -> slot, least recently used first: `reserve` takes free slots
(evicting the least recently used entries, never a pinned one), `commit` keys a written slot.

Keys of one prompt come from one pass over its bytes (`prefix_digests`), however many prefix
lengths are looked up or committed.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

SCRATCH_SLOTS = 2


def prefix_key(tokens: Sequence[int]) -> str:
    """sha256 (hex) of a byte-token prefix."""
    return hashlib.sha256(bytes(tokens)).hexdigest()


def prefix_digests(data: bytes, lengths: Iterable[int]) -> dict[int, str]:
    """{L: prefix_key(data[:L])} for each length, hashing `data` once."""
    view, digest, done, keys = memoryview(data), hashlib.sha256(), 0, {}
    for length in sorted(set(lengths)):
        digest.update(view[done:length])
        done = length
        keys[length] = digest.copy().hexdigest()
    return keys


@dataclass(frozen=True)
class CacheHit:
    """The longest usable cached prefix: `length` tokens and its slot (None: a miss)."""

    length: int
    slot: int | None


@dataclass(frozen=True)
class CacheStats:
    """Occupancy and evictions, as /metrics reports them."""

    entries: int
    slots: int
    state_bytes: int
    evictions: int

    @property
    def used_bytes(self) -> int:
        return self.entries * self.state_bytes

    @property
    def capacity_bytes(self) -> int:
        return self.slots * self.state_bytes

    @property
    def usage(self) -> float:
        return self.entries / self.slots if self.slots else 0.0


class PrefixCache:
    """LRU map sha256(prefix) -> slot of a device state pool; thread-safe."""

    def __init__(
        self,
        state_shape: tuple[int, int, int, int],
        capacity_bytes: int,
        device: str | torch.device = "cpu",
    ):
        layers, heads, value_dim, key_dim = state_shape
        self.state_bytes = layers * heads * value_dim * key_dim * 4
        self.slots = capacity_bytes // self.state_bytes
        self.pool = torch.empty(
            layers, self.slots + SCRATCH_SLOTS, heads, value_dim, key_dim,
            dtype=torch.float32, device=device,
        )  # fmt: skip
        self._entries: OrderedDict[str, tuple[int, int]] = OrderedDict()  # key -> (length, slot)
        self._lengths: Counter[int] = Counter()  # prefix length -> entries that have it
        self._free = list(range(self.slots - 1, -1, -1))
        self._evictions = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.slots > 0

    def __len__(self) -> int:
        return len(self._entries)

    def scratch(self, index: int) -> int:
        """The slot of scratch state `index` (0 or 1)."""
        return self.slots + index % SCRATCH_SLOTS

    def state(self, slot: int) -> torch.Tensor:
        """The state in `slot`: a view [layers, H, V, K] of the pool."""
        return self.pool[:, slot]

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(len(self._entries), self.slots, self.state_bytes, self._evictions)

    def lookup(self, data: bytes) -> CacheHit:
        """The longest cached prefix of the prompt `data` shorter than it; marks it recently
        used. One pass over the prompt hashes every cached length below its own."""
        with self._lock:
            lengths = [n for n in self._lengths if n < len(data)]
            keys = prefix_digests(data, lengths)
            for length in sorted(lengths, reverse=True):
                entry = self._entries.get(keys[length])
                if entry is not None:
                    self._entries.move_to_end(keys[length])
                    return CacheHit(length, entry[1])
        return CacheHit(0, None)

    def reserve(self, count: int, pinned: int | None = None) -> list[int]:
        """Up to `count` slots to write states into, evicting least recently used entries
        (never the one in slot `pinned`); hand each back with `commit` or `release`."""
        with self._lock:
            taken = [self._free.pop() for _ in range(min(count, len(self._free)))]
            for key in list(self._entries):
                if len(taken) == count:
                    break
                length, slot = self._entries[key]
                if slot == pinned:
                    continue
                del self._entries[key]
                self._drop_length(length)
                self._evictions += 1
                taken.append(slot)
            return taken

    def commit(self, key: str, length: int, slot: int) -> None:
        """Key the state written into the reserved `slot` (a prefix of `length` tokens)."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._drop_length(old[0])
                self._free.append(old[1])
            self._entries[key] = (length, slot)
            self._lengths[length] += 1

    def release(self, slots: Iterable[int]) -> None:
        """Hand back reserved slots that were not committed."""
        with self._lock:
            self._free.extend(slots)

    def clear(self) -> None:
        with self._lock:
            self._free.extend(slot for _, slot in self._entries.values())
            self._entries.clear()
            self._lengths.clear()

    def _drop_length(self, length: int) -> None:
        self._lengths[length] -= 1
        if not self._lengths[length]:
            del self._lengths[length]
