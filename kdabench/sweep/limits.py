"""Whether the sweep's requests fit a server's context, checked before any is sent.

A server takes at most ``max_model_len`` tokens per request, prompt and answer together
(vLLM lists it in ``/v1/models`` and ``/tokenize``; the embedded server's limit is the
one the sweep starts it with). A sweep asking for more would see its first long request
refused mid-run; :func:`check_context` refuses it up front as bad input.
"""

from __future__ import annotations

from kdabench.sweep.options import MIN_PROMPT_TOKENS, SweepError, SweepOptions
from kdabench.sweep.phases import PROBE_FILL_TOKENS, SAMPLE_MAX_TOKENS


def context_needs(options: SweepOptions) -> list[tuple[str, int, int]]:
    """Each kind of request the sweep sends, as (the option that sizes its prompt, its
    value, the further tokens the request takes), the measured prompt sizes first."""
    probe_extension = max(options.probe_tokens // 2, PROBE_FILL_TOKENS + 1)
    return [
        *(("--prompt-tokens", size, SAMPLE_MAX_TOKENS)
          for size in sorted(options.prompt_tokens, reverse=True)),
        ("probe prompt tokens", options.probe_prompt_size,
         probe_extension + options.probe_tokens),
        ("--shared-prefix-tokens", options.shared_prefix_tokens, SAMPLE_MAX_TOKENS),
        ("decode prompt tokens", options.decode_prompt_tokens, options.decode_max_tokens),
    ]


def check_context(options: SweepOptions, limit: int, server: str) -> None:
    """SweepError naming the first request that does not fit ``limit`` tokens of context."""
    for option, value, further in context_needs(options):
        if value + further > limit:
            fits = limit - further
            raise SweepError(
                f"{option} {value}: a request would need {value + further} tokens (prompt and "
                f"answer) and {server} takes at most {limit} (its max_model_len)"
                + (f"; give at most {fits}" if fits >= MIN_PROMPT_TOKENS else ""))
