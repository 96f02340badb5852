"""The device state cache, the server's settings, and prefill through the cache (CPU tier)."""

from __future__ import annotations

import pytest
import torch

from kdabench.oracles import assert_close
from kdabench.serve.engine import Engine
from kdabench.serve.model import KdaModel
from kdabench.serve.prefix_cache import PrefixCache, prefix_digests, prefix_key
from kdabench.serve.settings import GIB, CacheSettings, SettingsError

SHAPE = (2, 2, 64, 64)  # the tiny model's state: 128 KiB
STATE_BYTES = 2 * 2 * 64 * 64 * 4


def test_settings_defaults_and_parsing():
    assert CacheSettings.from_env({}) == CacheSettings(True, True, 1024, 8192, 4.0)
    env = {
        "KDABENCH_LOCAL_PREFIX_CACHE": "0",
        "KDABENCH_LOCAL_CHECKPOINT_EXPORT": "off",
        "KDABENCH_LOCAL_BLOCK_TOKENS": "64",
        "KDABENCH_LOCAL_MAX_BATCHED_TOKENS": "256",
        "KDABENCH_LOCAL_CACHE_GIB": "0.5",
    }
    settings = CacheSettings.from_env(env)
    assert settings == CacheSettings(False, False, 64, 256, 0.5)
    assert settings.cache_bytes == 0  # prefix cache off: no cache slots at all
    assert CacheSettings(cache_gib=0.5).cache_bytes == GIB // 2


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KDABENCH_LOCAL_PREFIX_CACHE", "maybe"),
        ("KDABENCH_LOCAL_CHECKPOINT_EXPORT", "2"),
        ("KDABENCH_LOCAL_BLOCK_TOKENS", "0"),
        ("KDABENCH_LOCAL_BLOCK_TOKENS", "1k"),
        ("KDABENCH_LOCAL_MAX_BATCHED_TOKENS", "512"),  # smaller than a block of 1024
        ("KDABENCH_LOCAL_CACHE_GIB", "-1"),
        ("KDABENCH_LOCAL_CACHE_GIB", "lots"),
    ],
)
def test_bad_settings_are_refused_with_the_variable_named(name, value):
    with pytest.raises(SettingsError, match=name):
        CacheSettings.from_env({name: value})


def test_prefix_digests_hash_once_and_match_prefix_key():
    data = bytes(range(200))
    assert prefix_digests(data, [150, 3, 64, 64]) == {
        n: prefix_key(list(data[:n])) for n in (3, 64, 150)
    }


def fill(cache: PrefixCache, tokens: list[int], value: float, pinned: int | None = None) -> int:
    """Reserve a slot, write `value` into it and key it as the state after `tokens`."""
    (slot,) = cache.reserve(1, pinned)
    cache.pool[:, slot] = value
    cache.commit(prefix_key(tokens), len(tokens), slot)
    return slot


def test_slots_come_from_the_byte_size():
    cache = PrefixCache(SHAPE, 3 * STATE_BYTES + STATE_BYTES // 2)
    assert cache.slots == 3 and cache.pool.shape == (2, 3 + 2, 2, 64, 64)
    assert {cache.scratch(0), cache.scratch(1)} == {3, 4}
    assert PrefixCache(SHAPE, 0).enabled is False and PrefixCache(SHAPE, 0).reserve(2) == []


def test_lookup_finds_the_longest_prefix_shorter_than_the_prompt():
    cache = PrefixCache(SHAPE, 8 * STATE_BYTES)
    prompt = list(range(10))
    fill(cache, prompt[:3], 3)
    six = fill(cache, prompt[:6], 6)
    fill(cache, prompt, 10)
    fill(cache, [9] * 6, -1)  # same length, other tokens
    hit = cache.lookup(bytes(prompt))
    assert hit.length == 6 and hit.slot == six
    assert torch.equal(cache.state(hit.slot), torch.full(SHAPE, 6.0))
    assert cache.lookup(bytes(prompt + [1])).length == 10  # the whole earlier prompt
    assert cache.lookup(bytes(prompt[:6])).length == 3  # never the prompt itself
    miss = cache.lookup(bytes([1, 2, 3]))
    assert (miss.length, miss.slot) == (0, None)


def test_lru_evicts_the_least_recently_used_never_the_pinned():
    cache = PrefixCache(SHAPE, 2 * STATE_BYTES)
    a = fill(cache, [1, 1], 1)
    fill(cache, [2, 2], 2)
    assert cache.lookup(bytes([1, 1, 0])).length == 2  # a is now the most recent
    fill(cache, [3, 3], 3)  # evicts b
    assert cache.lookup(bytes([2, 2, 0])).length == 0
    assert cache.lookup(bytes([1, 1, 0])).length == 2 and cache.lookup(bytes([3, 3, 0])).length == 2
    stats = cache.stats()
    assert (stats.entries, stats.evictions, stats.used_bytes) == (2, 1, 2 * STATE_BYTES)
    taken = cache.reserve(2, pinned=a)  # room for one: a is pinned
    assert taken != [] and a not in taken and len(taken) == 1
    cache.release(taken)
    assert cache.lookup(bytes([1, 1, 0])).slot == a


def test_commit_of_a_known_key_frees_the_old_slot():
    cache = PrefixCache(SHAPE, 2 * STATE_BYTES)
    fill(cache, [5, 5], 1)
    fill(cache, [5, 5], 2)
    assert len(cache) == 1 and len(cache.reserve(1)) == 1
    assert torch.equal(cache.state(cache.lookup(bytes([5, 5, 0])).slot), torch.full(SHAPE, 2.0))


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(KdaModel())


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


SETTINGS = {"block_tokens": 64, "max_batched_tokens": 256}


@pytest.mark.parametrize("export", [True, False], ids=["export_on", "export_off"])
def test_shared_prefix_resumes_only_with_checkpoint_export(engine, export):
    settings = CacheSettings(checkpoint_export=export, **SETTINGS)
    cache = PrefixCache(SHAPE, 64 * STATE_BYTES)
    first = prompt(1000, seed=1)
    second = first[:640] + prompt(360, seed=2)
    cold = engine.prefill_prompt(first, cache, settings)
    assert cold.cached_tokens == 0 and cold.computed_tokens == 1000
    assert cold.checkpoints_exported == (15 if export else 0)  # every block: 4 per 256 tokens
    assert cold.kernel_calls == 4  # calls of 256 tokens either way
    assert len(cache) == cold.checkpoints_exported + 1
    shared = engine.prefill_prompt(second, cache, settings)
    if export:
        assert (shared.cached_tokens, shared.computed_tokens, shared.kernel_calls) == (640, 360, 2)
    else:
        assert (shared.cached_tokens, shared.computed_tokens) == (0, 1000)
    reference = engine.prefill(torch.tensor(second))
    assert_close("logits", reference.logits, shared.logits, 1e-5)
    assert_close("state", reference.final_state, shared.state, 1e-5)


def test_retained_states_equal_the_states_of_their_prefixes(engine):
    settings = CacheSettings(**SETTINGS)
    cache = PrefixCache(SHAPE, 64 * STATE_BYTES)
    tokens = prompt(600, seed=4)
    engine.prefill_prompt(tokens, cache, settings)
    for length in (64, 256, 512, 576):
        hit = cache.lookup(bytes(tokens[: length + 1]))
        assert hit.length == length
        reference = engine.prefill(torch.tensor(tokens[:length])).final_state
        assert_close(f"state@{length}", reference, cache.state(hit.slot), 1e-5)


def test_prompt_end_state_serves_an_extension(engine):
    settings = CacheSettings(checkpoint_export=False, **SETTINGS)
    cache = PrefixCache(SHAPE, 8 * STATE_BYTES)
    first = prompt(100, seed=3)
    engine.prefill_prompt(first, cache, settings)
    extended = engine.prefill_prompt(first + [65, 66], cache, settings)
    assert (extended.cached_tokens, extended.computed_tokens) == (100, 2)
    again = engine.prefill_prompt(first, cache, settings)  # a repeat: the end state needs logits
    assert again.cached_tokens == 0


def test_a_full_cache_keeps_the_latest_states(engine):
    settings = CacheSettings(**SETTINGS)
    cache = PrefixCache(SHAPE, 3 * STATE_BYTES)
    tokens = prompt(1000, seed=5)
    result = engine.prefill_prompt(tokens, cache, settings)
    assert result.checkpoints_exported == 2 and len(cache) == 3  # 896, 960 and the end
    assert cache.lookup(bytes(tokens[:900])).length == 896
    assert cache.lookup(bytes(tokens[:800])).length == 0


def test_the_kernel_writes_retained_states_into_the_cache():
    """The Triton kernel (interpreted on a CPU) through the cache, against the chunk path."""
    model = KdaModel()
    settings = CacheSettings(block_tokens=16, max_batched_tokens=64)
    cache = PrefixCache(SHAPE, 16 * STATE_BYTES)
    kernel = Engine(model, "kernel", max_tokens=64, max_slots=cache.slots + 2)
    first = prompt(100, seed=6)
    second = first[:48] + prompt(20, seed=7)
    cold = kernel.prefill_prompt(first, cache, settings)
    assert (cold.checkpoints_exported, cold.kernel_calls) == (6, 2)
    shared = kernel.prefill_prompt(second, cache, settings)
    assert (shared.cached_tokens, shared.computed_tokens) == (48, 20)
    reference = Engine(model, "chunk").prefill(torch.tensor(second))
    assert_close("logits", reference.logits, shared.logits, 3e-3)
    assert_close("state", reference.final_state, shared.state, 3e-3)
