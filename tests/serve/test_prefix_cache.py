"""The prefix cache, its environment settings, and prefill through it (engine level, CPU)."""

from __future__ import annotations

import pytest
import torch

from kdabench.oracles import assert_close
from kdabench.serve.engine import Engine
from kdabench.serve.model import KdaModel
from kdabench.serve.prefix_cache import CacheSettings, PrefixCache, SettingsError


def state(value: float) -> torch.Tensor:
    return torch.full((2, 2, 64, 64), value)


def test_settings_defaults_and_parsing():
    assert CacheSettings.from_env({}) == CacheSettings(True, True, 1024, 256)
    env = {
        "KDABENCH_LOCAL_PREFIX_CACHE": "0",
        "KDABENCH_LOCAL_CHECKPOINT_EXPORT": "off",
        "KDABENCH_LOCAL_BLOCK_TOKENS": "64",
        "KDABENCH_LOCAL_CACHE_ENTRIES": "8",
    }
    assert CacheSettings.from_env(env) == CacheSettings(False, False, 64, 8)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KDABENCH_LOCAL_PREFIX_CACHE", "maybe"),
        ("KDABENCH_LOCAL_CHECKPOINT_EXPORT", "2"),
        ("KDABENCH_LOCAL_BLOCK_TOKENS", "0"),
        ("KDABENCH_LOCAL_BLOCK_TOKENS", "1k"),
    ],
)
def test_bad_settings_are_refused_with_the_variable_named(name, value):
    with pytest.raises(SettingsError, match=name):
        CacheSettings.from_env({name: value})


def test_lookup_finds_the_longest_prefix_shorter_than_the_prompt():
    cache = PrefixCache()
    prompt = list(range(10))
    cache.insert(prompt[:3], state(3))
    cache.insert(prompt[:6], state(6))
    cache.insert(prompt, state(10))
    cache.insert([9, 9, 9, 9, 9, 9, 9], state(-1))  # same length class, other tokens
    hit = cache.lookup(prompt)
    assert hit.length == 6 and torch.equal(hit.state, state(6))
    assert cache.lookup(prompt + [1]).length == 10  # the whole earlier prompt
    assert cache.lookup(prompt[:6]).length == 3  # never the prompt itself
    assert cache.lookup([1, 2, 3]).length == 0 and cache.lookup([1, 2, 3]).state is None


def test_lru_evicts_the_least_recently_used():
    cache = PrefixCache(max_entries=2)
    a, b, c = [1, 1], [2, 2], [3, 3]
    cache.insert(a, state(1))
    cache.insert(b, state(2))
    assert cache.lookup(a + [0]).length == 2  # a is now the most recent
    cache.insert(c, state(3))
    assert len(cache) == 2
    assert cache.lookup(b + [0]).length == 0
    assert cache.lookup(a + [0]).length == 2 and cache.lookup(c + [0]).length == 2


def test_disabled_cache_stores_nothing():
    cache = PrefixCache(enabled=False)
    cache.insert([1, 2], state(1))
    assert len(cache) == 0 and cache.lookup([1, 2, 3]).length == 0


def test_inserted_state_is_a_copy():
    cache, s = PrefixCache(), state(1)
    cache.insert([1, 2], s)
    s.fill_(5)
    assert torch.equal(cache.lookup([1, 2, 3]).state, state(1))


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(KdaModel())


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("export", [True, False], ids=["export_on", "export_off"])
def test_shared_prefix_resumes_only_with_checkpoint_export(engine, export):
    settings = CacheSettings(checkpoint_export=export, block_tokens=64)
    cache = PrefixCache()
    first = prompt(512, seed=1)
    second = first[:256] + prompt(256, seed=2)
    cold = engine.prefill_prompt(first, cache, settings)
    assert cold.cached_tokens == 0 and cold.computed_tokens == 512
    assert cold.checkpoints_exported == (7 if export else 0)
    assert cold.kernel_calls == (2 if export else 1)
    shared = engine.prefill_prompt(second, cache, settings)
    if export:
        assert (shared.cached_tokens, shared.computed_tokens) == (256, 256)
    else:
        assert (shared.cached_tokens, shared.computed_tokens) == (0, 512)
    reference = engine.prefill_prompt(second, PrefixCache(enabled=False), settings)
    assert_close("logits", reference.logits, shared.logits, 1e-5)
    assert_close("state", reference.state, shared.state, 1e-5)


def test_prompt_end_state_serves_an_extension(engine):
    settings = CacheSettings(checkpoint_export=False, block_tokens=64)
    cache = PrefixCache()
    first = prompt(100, seed=3)
    engine.prefill_prompt(first, cache, settings)
    extended = engine.prefill_prompt(first + [65, 66], cache, settings)
    assert (extended.cached_tokens, extended.computed_tokens) == (100, 2)
    again = engine.prefill_prompt(first, cache, settings)  # a repeat: the end state needs logits
    assert again.cached_tokens == 0
