"""Prompts of exact token counts that no cache has seen.

Every prompt of :class:`PromptFactory` starts with a fresh random nonce of
:data:`NONCE_DIGITS` decimal digits (from ``secrets``, not the seed: a re-run against the
same server must not find its prompts cached, the trap of fixed-seed benchmark prompts),
so it is unique from its first tokens. Digits, because common tokenizers split a run of
digits the same way whatever its values: another nonce of the same length counts alike,
which lets a count be taken on a copy of a prompt that shares no cache block with it.
The filler after the nonce is drawn from a seeded generator, so prompt content is
reproducible in kind. Lengths are fitted with a token counter (:mod:`kdabench.sweep.tokens`:
the user's tokenizer, the server's ``/tokenize``, or the server's usage): the first guess
uses the characters per token of the factory's last fit, so a byte-level tokenizer is hit
exactly on the first try and a subword one in a few calls.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass

WORDS = ["state", "chunk", "gate", "decay", "prefix", "block", "cache", "recurrent", "export", "kernel", "token", "head", "value", "key", "query", "delta", "rule", "retain", "boundary", "offset", "slot", "pool", "plan", "bind", "replay", "graph", "stream", "serve", "arm", "round", "sample", "warmup", "median", "window", "decode", "prefill", "attention", "linear", "hybrid", "layer", "checkpoint", "interior", "scalar", "vector", "matrix", "tensor", "memory", "bandwidth", "latency", "river", "stone", "maple", "copper", "violet", "harbor", "lantern", "meadow", "quartz", "signal", "thunder", "orbit", "canyon", "ember"]

MAX_FIT_CALLS = 24
NONCE_DIGITS = 16


class PromptError(RuntimeError):
    """No prompt of the asked token count could be made with this tokenizer."""


@dataclass(frozen=True)
class Prompt:
    """A prompt and its token count as the factory's counter reports it."""

    text: str
    tokens: int
    nonce: str


class PromptFactory:
    """Makes prompts of exact token counts as ``count_tokens`` counts them."""

    def __init__(self, count_tokens: Callable[[str], int], *, seed: int = 0) -> None:
        self._count = count_tokens
        self._rng = random.Random(seed)
        self._chars_per_token = 1.0  # of the filler, as the last fit found it

    def unique(self, n_tokens: int) -> Prompt:
        """A prompt of ``n_tokens`` tokens that starts with a fresh nonce."""
        return self.extend("", n_tokens)

    def extend(self, head: str, n_tokens: int) -> Prompt:
        """``head`` followed by a fresh nonce and filler, ``n_tokens`` tokens in all."""
        nonce = f"{secrets.randbelow(10 ** NONCE_DIGITS):0{NONCE_DIGITS}d}"
        start = f"{head}{nonce} "
        text, count = self._fit(start, n_tokens)
        return Prompt(text=text, tokens=count, nonce=nonce)

    def _filler(self, n_chars: int) -> str:
        words: list[str] = []
        length = 0
        while length < n_chars:
            word = self._rng.choice(WORDS)
            words.append(word)
            length += len(word) + 1
        return " ".join(words)

    def _fit(self, start: str, n_tokens: int) -> tuple[str, int]:
        """The longest ``start + filler[:L]`` with exactly ``n_tokens`` tokens (or fewer,
        closest, when the tokenizer cannot hit the count exactly)."""
        base = self._count(start)
        if base > n_tokens:
            raise PromptError(f"a prompt of {n_tokens} tokens is too short for its "
                              f"{base}-token start")
        if base == n_tokens:
            return start, base
        filler = self._filler(2 * (n_tokens - base) + 64)
        low: tuple[int, int] = (0, base)  # (chars, tokens) known at or under the target
        high: int | None = None  # chars known over the target
        length = max(1, round((n_tokens - base) * self._chars_per_token))
        for _ in range(MAX_FIT_CALLS):
            while length > len(filler):
                filler += " " + self._filler(len(filler))
            count = self._count(start + filler[:length])
            if count > base:
                self._chars_per_token = length / (count - base)
            if count == n_tokens:
                return start + filler[:length], count
            if count < n_tokens:
                low = max(low, (length, count))
            else:
                high = length if high is None else min(high, length)
            if high is not None and high - low[0] <= 1:
                break
            guess = length + round((n_tokens - count) * self._chars_per_token)
            lower_bound = low[0] + 1
            upper_bound = (high - 1) if high is not None else max(guess, lower_bound)
            if not lower_bound <= guess <= upper_bound:
                guess = (lower_bound + upper_bound) // 2
            length = guess
        return start + filler[: low[0]], low[1]
