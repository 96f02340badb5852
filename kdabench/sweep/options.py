"""What a sweep measures: :class:`SweepOptions`, resolved and validated once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kdabench.sweep.client import APIS

MIN_PROMPT_TOKENS = 16  # the shortest prompt a sweep sends
SCHEDULES = ("interleaved", "blocks")
#: (P1 tokens, tokens P2 shares with it): half of 8,192, and a long prompt sharing all but
#: its last 8,192 tokens (one prefill call of a serving engine's default chunk).
SHARED_PREFIX_CASES = ((8192, 4096), (65536, 57344))


class SweepError(ValueError):
    """Options that cannot make a sweep; one line for the user."""


@dataclass(frozen=True)
class SweepOptions:
    """What to measure; defaults come from the arms file's [sweep], then from here."""

    prompt_tokens: tuple[int, ...] = (8192, 16384, 32768)
    samples: int = 5  # cold samples per arm and prompt size
    rounds: int | None = None  # rounds they are spread over (default: samples)
    warmups: int = 1
    decode_window_s: float = 2.0
    decode_prompt_tokens: int = 256
    decode_max_tokens: int = 1024
    probe_tokens: int = 16
    probe_prompt_tokens: int | None = None  # default: the smallest prompt size + 16
    drift_bound: float = 0.05
    shared_prefix: tuple[tuple[int, int], ...] = SHARED_PREFIX_CASES  # (P1, shared) tokens
    shared_prefix_tokens: int | None = None  # one case instead: P1's length, P2 shares half
    shared_prefix_repeats: int = 1
    health_timeout_s: float = 120.0
    request_timeout_s: float = 600.0
    api: str = "completions"  # the OpenAI endpoint timed: completions or chat (completions)
    seed: int = 0
    schedule: str = "interleaved"  # every server up at once, or one server per block
    blocks: int = 2  # blocks schedule: blocks per arm, in A B B A order (2: A B B A)
    baseline: str | None = None  # the arm the others are contrasted with (contrasts.py)

    @classmethod
    def resolve(cls, file_defaults: dict[str, Any], overrides: dict[str, Any]) -> SweepOptions:
        """Options from the arms file's [sweep], overridden by non-None ``overrides``."""
        values = {**file_defaults, **{k: v for k, v in overrides.items() if v is not None}}
        if "prompt_tokens" in values:
            values["prompt_tokens"] = tuple(int(v) for v in values["prompt_tokens"])
        if "shared_prefix" in values:
            values["shared_prefix"] = tuple(tuple(int(n) for n in pair)
                                            for pair in values["shared_prefix"])
        options = cls(**values)
        options.validate()
        return options

    @property
    def round_count(self) -> int:
        return self.rounds if self.rounds is not None else self.samples

    @property
    def probe_prompt_size(self) -> int:
        """The probes' prompt length. A server computes at least the last token of a
        repeated prompt, so a block-aligned prompt finds its last block uncached; 16 tokens
        past the smallest size let the repeat of a block-aligned size hit the cache."""
        if self.probe_prompt_tokens is not None:
            return self.probe_prompt_tokens
        return min(self.prompt_tokens) + 16

    @property
    def shared_prefix_cases(self) -> tuple[tuple[int, int], ...]:
        """Every (P1 tokens, shared tokens) case asked for."""
        if self.shared_prefix_tokens is not None:
            return ((self.shared_prefix_tokens, self.shared_prefix_tokens // 2),)
        return self.shared_prefix

    @property
    def shared_prefix_runs(self) -> tuple[tuple[int, int], ...]:
        """The cases that run: those no longer than the largest prompt size."""
        return tuple(c for c in self.shared_prefix_cases if c[0] <= max(self.prompt_tokens))

    def shared_prefix_skipped(self) -> list[dict[str, Any]]:
        """The cases skipped, each with why (the receipt records them)."""
        largest = max(self.prompt_tokens)
        return [{"total_tokens": total, "shared_tokens": shared,
                 "reason": f"{total} tokens is longer than the largest prompt size, {largest}"}
                for total, shared in self.shared_prefix_cases if total > largest]

    @property
    def blocks_schedule(self) -> bool:
        return self.schedule == "blocks"

    @property
    def samples_per_round(self) -> int:
        return self.samples // self.round_count

    def check_arms(self, names: list[str]) -> None:
        """Refuse a baseline that names no arm."""
        if self.baseline is not None and self.baseline not in names:
            raise SweepError(f"baseline {self.baseline!r} is not an arm (arms: "
                             f"{', '.join(names)})")

    def validate(self) -> None:
        if not self.prompt_tokens or any(n < MIN_PROMPT_TOKENS for n in self.prompt_tokens):
            raise SweepError(f"prompt sizes must be at least {MIN_PROMPT_TOKENS} tokens each")
        if len(set(self.prompt_tokens)) != len(self.prompt_tokens):
            raise SweepError("prompt sizes must not repeat")
        for name in ("samples", "probe_tokens", "decode_prompt_tokens", "decode_max_tokens",
                     "shared_prefix_repeats"):
            if getattr(self, name) < 1:
                raise SweepError(f"{name.replace('_', ' ')} must be at least 1")
        if self.schedule not in SCHEDULES:
            raise SweepError(f"schedule {self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.blocks < 1:
            raise SweepError("blocks must be at least 1")
        if self.api not in APIS:
            raise SweepError(f"api {self.api!r} is not one of {', '.join(APIS)}")
        if self.warmups < 0:
            raise SweepError("warmups must be 0 or more")
        if self.probe_prompt_tokens is not None and self.probe_prompt_tokens < MIN_PROMPT_TOKENS:
            raise SweepError(f"probe prompt tokens must be at least {MIN_PROMPT_TOKENS}")
        if self.probe_tokens < 2:
            raise SweepError("probe tokens must be at least 2 (the extension uses half)")
        if self.round_count < 1 or self.samples % self.round_count:
            raise SweepError(f"{self.samples} samples cannot be spread evenly over "
                             f"{self.round_count} rounds; make rounds divide samples")
        if self.shared_prefix_tokens is not None and (
                self.shared_prefix_tokens < 32 or self.shared_prefix_tokens % 2):
            raise SweepError("shared prefix tokens must be an even number, at least 32")
        for total, shared in self.shared_prefix_cases:
            if not MIN_PROMPT_TOKENS <= shared < total:
                raise SweepError(f"shared prefix {total}:{shared}: P2 must share at least "
                                 f"{MIN_PROMPT_TOKENS} tokens and fewer than P1's {total}")
        for name in ("decode_window_s", "drift_bound", "health_timeout_s", "request_timeout_s"):
            if getattr(self, name) <= 0:
                raise SweepError(f"{name.replace('_', ' ')} must be positive")
