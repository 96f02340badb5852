"""The per-arm steps of a sweep: each talks to one arm's server and records into its
:class:`~kdabench.sweep.state.ArmState`.

- :func:`server_info`: ``/health``, ``/version``, ``/v1/models``, whether ``/metrics``
  is served, and the server's ``max_model_len`` (from ``/v1/models``, else ``/tokenize``).
- :func:`activation_before`, :func:`activation_after`: the arm's activation patterns over
  its server log, before timing and over the log written while measuring.
- :func:`warmups`, :func:`cold_sample`: timed samples of unique prompts; a cold sample
  that reports cached tokens (usage or ``/metrics``) is discarded.
- :func:`probes`: a cold prompt, its exact repeat and its extension by the first half of
  its own greedy answer must answer alike, with logprob drift under the bound.
- :func:`shared_prefix`: P1 (unique) then P2 = P1's first half + another continuation.
- :func:`decode`: output tokens/s over a fixed window, normalised by the speculative
  acceptance length read from ``/metrics``.

A step raises :class:`~kdabench.sweep.client.ServerError` or
:class:`~kdabench.sweep.prompts.PromptError` when the server fails it; the runner turns
that into the arm's failure.
"""

from __future__ import annotations

import time
from typing import Any

from kdabench.sweep.arms import check_patterns
from kdabench.sweep.client import PREFIX_CACHE_HITS, SPEC_ACCEPTED, SPEC_DRAFTS, Completion
from kdabench.sweep.options import SweepOptions
from kdabench.sweep.state import ArmState

SAMPLE_MAX_TOKENS = 4  # a cold sample needs only its first token; a few guard empty ones
PROBE_FILL_TOKENS = 16  # fresh text extending the probe prompt when its answer gives no prefix


# -------------------------------------------------------------------- server and activation


def server_info(state: ArmState) -> None:
    client = state.client
    assert client is not None
    models = client.resolve_model()
    state.info = {
        "server": state.server.describe(),
        "health": client.health(),
        "version": client.get_json("/version"),
        "models": models,
        "metrics_served": client.metrics() is not None,
        "max_model_len": models["max_model_len"] or client.tokenize_limit(),
    }


def activation_before(state: ArmState) -> None:
    log = state.server.log_text()
    state.log_offset = len(log or "")
    state.activation_before = check_patterns(state.arm.activation, log)


def activation_after(state: ArmState) -> None:
    log = state.server.log_text()
    whole = check_patterns(state.arm.activation, log)
    during = check_patterns(state.arm.activation_after,
                            None if log is None else log[state.log_offset:])
    if log is None:
        status = "not checked"
    else:
        status = "failed" if "failed" in (whole["status"], during["status"]) else "passed"
    state.activation_after = {"status": status, "missing": whole["missing"] +
                              during["missing"], "matches": {**whole["matches"],
                                                             **during["matches"]}}


# -------------------------------------------------------------------- measurements


def _measure(state: ArmState, text: str, max_tokens: int,
             logprobs: bool = False) -> tuple[Completion, float | None]:
    """One completion with the /metrics prefix-cache hit delta around it."""
    client = state.client
    assert client is not None
    before = client.metrics()
    completion = client.complete(text, max_tokens=max_tokens, logprobs=logprobs)
    after = client.metrics()
    delta = None
    if before is not None and after is not None and PREFIX_CACHE_HITS in after:
        delta = after[PREFIX_CACHE_HITS] - before.get(PREFIX_CACHE_HITS, 0.0)
    return completion, delta


def _timed_record(state: ArmState, size: int, **extra: Any) -> dict[str, Any]:
    """One sample of a unique ``size``-token prompt, with why it looks cached (if it does)."""
    assert state.prompts is not None
    prompt = state.prompts.unique(size)
    completion, hits_delta = _measure(state, prompt.text, SAMPLE_MAX_TOKENS)
    record = {
        **extra,
        "ttft_ms": _ms(completion.ttft_s),
        "total_ms": _ms(completion.total_s),
        "prompt_tokens": completion.prompt_tokens,
        "tokenized_tokens": prompt.tokens,
        "cached_tokens": completion.cached_tokens,
        "metrics_hits_delta": hits_delta,
        "nonce": prompt.nonce,
    }
    record["cached_reasons"] = _cached_reasons(completion, hits_delta)
    return record


def warmups(state: ArmState, options: SweepOptions) -> None:
    for size in options.prompt_tokens:
        for index in range(options.warmups):
            record = _timed_record(state, size, warmup=index)
            state.warmups.setdefault(size, []).append(record)


def cold_sample(state: ArmState, size: int, round_index: int, position: int) -> dict[str, Any]:
    """One cold sample, kept as a sample or (cached or empty) as discarded; returns it."""
    record = _timed_record(state, size, round=round_index, position=position, at=time.time())
    if record["ttft_ms"] is None:
        record["cached_reasons"].append("no generated text (no TTFT)")
    if record["cached_reasons"]:
        state.discarded.setdefault(size, []).append(record)
    else:
        state.samples.setdefault(size, []).append(record)
    return record


def probes(state: ArmState, options: SweepOptions) -> None:
    assert state.prompts is not None
    size = options.probe_prompt_size
    n = options.probe_tokens
    prompt = state.prompts.unique(size)
    cold, cold_hits = _measure(state, prompt.text, n, logprobs=True)
    repeat, repeat_hits = _measure(state, prompt.text, n, logprobs=True)
    prefix_tokens, prefix_text = _clean_prefix(cold, n // 2)
    if prefix_tokens:
        extension_text = prompt.text + prefix_text
    else:  # no clean answer text to extend with: extend with fresh text, no comparison
        extension_text = prompt.text + " " + state.prompts.unique(PROBE_FILL_TOKENS).text
    extension, extension_hits = _measure(state, extension_text, n, logprobs=True)

    expected_rest = cold.text[len(prefix_text):] if prefix_tokens else None
    checks: dict[str, Any] = {
        "cold_uncached": _cached_reasons(cold, cold_hits) == [],
        "repeat_same_answer": repeat.text == cold.text and bool(cold.text),
        "extension_same_answer": (None if expected_rest is None
                                  else _same_start(extension.text, expected_rest)),
    }
    repeat_cached = _cached_count(repeat, repeat_hits)
    extension_cached = _cached_count(extension, extension_hits)
    if state.arm.prefix_cache:  # a cache of final states only serves the extension
        checks["cache_reused"] = bool(repeat_cached) or bool(extension_cached)
    else:
        checks["cache_unused"] = repeat_cached == 0 and extension_cached == 0
    drift_repeat = _drift(cold.token_logprobs, repeat.token_logprobs)
    drift_extension = (_drift(cold.token_logprobs[prefix_tokens:], extension.token_logprobs)
                       if prefix_tokens else None)
    drifts = [d for d in (drift_repeat, drift_extension) if d is not None]
    drift = max(drifts) if drifts else None
    checks["drift_within_bound"] = None if drift is None else drift <= options.drift_bound
    state.probe = {
        "prompt_tokens": cold.prompt_tokens, "tokenized_tokens": prompt.tokens,
        "answer_tokens": n, "extension_answer_tokens": prefix_tokens,
        "cold": _answer(cold, cold_hits), "repeat": _answer(repeat, repeat_hits),
        "extension": _answer(extension, extension_hits),
        "repeat_cached_tokens": repeat_cached, "extension_cached_tokens": extension_cached,
        "drift_repeat": drift_repeat, "drift_extension": drift_extension,
        "drift": drift, "drift_bound": options.drift_bound, "checks": checks,
    }


def shared_prefix(state: ArmState, options: SweepOptions) -> None:
    assert state.prompts is not None
    total = options.shared_prefix_tokens
    head = state.prompts.unique(total // 2)
    first = state.prompts.extend(head.text, total)
    second = state.prompts.extend(head.text, total)
    p1, p1_hits = _measure(state, first.text, SAMPLE_MAX_TOKENS)
    p2, p2_hits = _measure(state, second.text, SAMPLE_MAX_TOKENS)
    state.shared_prefix.append({
        "shared_tokens": head.tokens, "total_tokens": total,
        "p1_ttft_ms": _ms(p1.ttft_s), "p1_prompt_tokens": p1.prompt_tokens,
        "p1_cached_tokens": p1.cached_tokens, "p1_metrics_hits_delta": p1_hits,
        "p2_ttft_ms": _ms(p2.ttft_s), "p2_prompt_tokens": p2.prompt_tokens,
        "p2_cached_tokens": p2.cached_tokens, "p2_metrics_hits_delta": p2_hits,
    })


def decode(state: ArmState, options: SweepOptions) -> None:
    assert state.prompts is not None and state.client is not None
    prompt = state.prompts.unique(options.decode_prompt_tokens)
    before = state.client.metrics() or {}
    window = state.client.decode_window(prompt.text, window_s=options.decode_window_s,
                                        max_tokens=options.decode_max_tokens)
    after = state.client.metrics() or {}
    drafts = after.get(SPEC_DRAFTS, 0.0) - before.get(SPEC_DRAFTS, 0.0)
    accepted = after.get(SPEC_ACCEPTED, 0.0) - before.get(SPEC_ACCEPTED, 0.0)
    acceptance = 1.0 + accepted / drafts if drafts > 0 else 1.0
    tokens_per_s = window.tokens_per_s
    state.decode = {
        "window_s": window.window_s, "elapsed_s": window.elapsed_s,
        "output_tokens": window.tokens, "ended_early": window.ended_early,
        "ttft_ms": _ms(window.ttft_s), "prompt_tokens": prompt.tokens,
        "spec_drafts": drafts, "spec_accepted_tokens": accepted,
        "acceptance_length": acceptance, "tokens_per_s": tokens_per_s,
        "steps_per_s": None if tokens_per_s is None else tokens_per_s / acceptance,
    }


# -------------------------------------------------------------------- helpers


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _cached_reasons(completion: Completion, hits_delta: float | None) -> list[str]:
    reasons = []
    if completion.cached_tokens:
        reasons.append(f"usage reports {completion.cached_tokens} cached tokens")
    if hits_delta:
        reasons.append(f"/metrics prefix-cache hits rose by {hits_delta:g} tokens")
    return reasons


def _cached_count(completion: Completion, hits_delta: float | None) -> float | None:
    if completion.cached_tokens is not None:
        return completion.cached_tokens
    return hits_delta


def _answer(completion: Completion, hits_delta: float | None) -> dict[str, Any]:
    return {"text": completion.text, "token_logprobs": completion.token_logprobs,
            "ttft_ms": _ms(completion.ttft_s), "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "cached_tokens": completion.cached_tokens, "metrics_hits_delta": hits_delta}


def _clean_prefix(completion: Completion, want: int) -> tuple[int, str]:
    """The first ``want`` answer tokens as text, cut before any token that is not plain
    printable ASCII (which might not tokenize back to itself); (tokens, text)."""
    pieces = completion.tokens
    if len(pieces) < want:  # no token strings: one character per token (byte-level)
        pieces = list(completion.text)
    taken: list[str] = []
    for piece in pieces[:want]:
        if not piece or not all(32 <= ord(ch) < 127 for ch in piece):
            break
        taken.append(piece)
    return len(taken), "".join(taken)


def _same_start(got: str, expected: str) -> bool:
    common = min(len(got), len(expected))
    return common > 0 and got[:common] == expected[:common]


def _drift(first: list[float | None], second: list[float | None]) -> float | None:
    pairs = [(a, b) for a, b in zip(first, second) if a is not None and b is not None]
    if not pairs:
        return None
    return max(abs(float(a) - float(b)) for a, b in pairs)
