"""Whether a sweep's requests fit a server's max_model_len, decided before any is sent."""

from __future__ import annotations

import pytest

from kdabench.sweep.arms import load_arms
from kdabench.sweep.limits import check_context, context_needs
from kdabench.sweep.options import SweepError, SweepOptions
from kdabench.sweep.runner import Sweep
from kdabench.sweep.servers import EMBEDDED_MAX_MODEL_LEN

OPTIONS = SweepOptions(prompt_tokens=(1024, 4096), probe_tokens=8, shared_prefix_tokens=2048,
                       decode_prompt_tokens=128, decode_max_tokens=512)


def test_every_kind_of_request_is_counted_with_its_answer() -> None:
    assert context_needs(OPTIONS) == [
        ("--prompt-tokens", 4096, 4), ("--prompt-tokens", 1024, 4),
        ("probe prompt tokens", 1040, 17 + 8), ("--shared-prefix-tokens", 2048, 4),
        ("decode prompt tokens", 128, 512),
    ]


def test_a_limit_that_holds_the_largest_request_passes_and_one_less_does_not() -> None:
    check_context(OPTIONS, 4100, "the server")
    with pytest.raises(SweepError, match=r"^--prompt-tokens 4096: a request would need 4100 "
                       r"tokens \(prompt and answer\) and the server takes at most 4099 "
                       r"\(its max_model_len\); give at most 4095$"):
        check_context(OPTIONS, 4099, "the server")


def test_a_request_that_cannot_fit_at_any_prompt_size_gives_no_advice() -> None:
    with pytest.raises(SweepError, match=r"^--prompt-tokens 4096: .* at most 10 \(its "
                       r"max_model_len\)$"):
        check_context(OPTIONS, 10, "the server")


def test_the_decode_window_counts_its_max_tokens() -> None:
    options = SweepOptions(prompt_tokens=(64,), shared_prefix_tokens=64, decode_prompt_tokens=32,
                           decode_max_tokens=1024)
    with pytest.raises(SweepError, match="decode prompt tokens 32: a request would need 1056"):
        check_context(options, 1000, "the server")


def test_the_embedded_mode_is_refused_when_it_is_built() -> None:
    arms = load_arms("local")
    largest = EMBEDDED_MAX_MODEL_LEN - 4  # four answer tokens per sample
    Sweep(arms, SweepOptions(prompt_tokens=(1024, largest)), mode="embedded", out_dir="unused")
    with pytest.raises(SweepError, match=f"^--prompt-tokens {largest + 1}: .* the embedded "
                       f"server takes at most {EMBEDDED_MAX_MODEL_LEN} "):
        Sweep(arms, SweepOptions(prompt_tokens=(1024, largest + 1)), mode="embedded",
              out_dir="unused")
    Sweep(arms, SweepOptions(prompt_tokens=(100_000,)), mode="attach", endpoint="http://x",
          out_dir="unused")  # an attached server's limit is read from it once it is up
