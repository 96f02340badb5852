"""The per-arm steps of a sweep: each talks to one arm's server and records into its
:class:`~kdabench.sweep.state.ArmState`.

- :func:`server_info`: ``/health``, ``/version`` (and what it says the server runs on:
  :func:`runs_on`), ``/v1/models``, whether ``/metrics`` is served, and the server's
  ``max_model_len`` (from ``/v1/models``, else ``/tokenize``).
- :func:`activation_before`, :func:`activation_after`: the arm's activation patterns over
  its server log, before timing and over the log written while measuring.
- :func:`warmups`, :func:`cold_sample`: timed samples of unique prompts, each with its
  cache evidence (:class:`CacheEvidence`): "verified-cold", "verified-cached" (discarded)
  or "unknown" (kept: cold by construction, not verified by the server). A stream cut
  short is a failed sample, kept with its reason.
- :func:`probes`: a cold prompt, its exact repeat and its extension by the first half of
  its own greedy answer must answer alike, with logprob drift under the bound; a cache
  check whose evidence is unknown is "unverifiable".
- :func:`shared_prefix`: per case, P1 (unique) then P2 = P1's shared head + another ending;
  with ``warmup=True`` the pair is kept apart and never counted (the first resumed prefill of
  a new length pays first-use costs, as a cold prompt's first does).
- :func:`decode`: output tokens/s over a fixed window, normalised by the speculative
  acceptance length read from ``/metrics``.

A step raises :class:`~kdabench.sweep.client.ServerError` or
:class:`~kdabench.sweep.prompts.PromptError` when the server fails it; the runner turns
that into the arm's failure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kdabench.sweep.arms import check_patterns
from kdabench.sweep.client import (
    SPEC_ACCEPTED,
    SPEC_DRAFTS,
    CacheDelta,
    Completion,
    Prompted,
    StreamCut,
    prefix_cache_delta,
)
from kdabench.sweep.options import SweepOptions
from kdabench.sweep.state import ArmState

SAMPLE_MAX_TOKENS = 4  # a cold sample needs only its first token; a few guard empty ones
PROBE_FILL_TOKENS = 32  # fresh text extending the probe prompt when its answer gives no prefix
VERIFIED_COLD, VERIFIED_CACHED, UNKNOWN = "verified-cold", "verified-cached", "unknown"
UNVERIFIABLE = "unverifiable"  # a probe check the server's evidence cannot decide


@dataclass(frozen=True)
class CacheEvidence:
    """What the server reported about one request's prompt tokens served from its cache."""

    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens; None: not reported
    metrics: CacheDelta | None  # the /metrics prefix-cache counters' change; None: not served

    @property
    def hits_delta(self) -> float | None:
        """Cache hits the counters show for the request; None unless they counted it."""
        if self.metrics is None:
            return None
        if self.metrics.hits or self.metrics.queries > 0:
            return self.metrics.hits
        return None

    @property
    def state(self) -> str:
        """VERIFIED_CACHED on any report of cached tokens, VERIFIED_COLD on a report of
        none, UNKNOWN when the server reports neither."""
        reports = [n for n in (self.cached_tokens, self.hits_delta) if n is not None]
        if any(reports):
            return VERIFIED_CACHED
        return VERIFIED_COLD if reports else UNKNOWN

    @property
    def count(self) -> float | None:
        """Cached prompt tokens as reported (the larger report); None when not reported."""
        reports = [n for n in (self.cached_tokens, self.hits_delta) if n is not None]
        return max(reports) if reports else None

    def reasons(self) -> list[str]:
        """Why the request counts as cached; empty when it does not."""
        reasons = []
        if self.cached_tokens:
            reasons.append(f"usage reports {self.cached_tokens} cached tokens")
        if self.hits_delta:
            reasons.append(f"/metrics prefix-cache hits rose by {self.hits_delta:g} tokens")
        return reasons

    def to_record(self) -> dict[str, Any]:
        return {"cached_tokens": self.cached_tokens, "metrics_hits_delta": self.hits_delta,
                "cache_evidence": self.state}


# -------------------------------------------------------------------- server and activation


def server_info(state: ArmState) -> None:
    client = state.client
    assert client is not None
    models = client.resolve_model()
    version = client.get_json("/version")
    state.info = {
        "server": state.server.describe(),
        "health": client.health(),
        "version": version,
        "runs_on": runs_on(version),
        "models": models,
        "metrics_served": client.metrics() is not None,
        "max_model_len": models["max_model_len"] or client.tokenize_limit(),
    }


def runs_on(version: dict[str, Any] | None) -> dict[str, Any]:
    """What the server says it runs on (its /version: device, backend, model, retention,
    torch and Triton versions); "unknown" for a server whose /version does not say
    (third-party servers)."""
    device = (version or {}).get("device")
    if not isinstance(version, dict) or not isinstance(device, dict):
        return {"status": "unknown"}
    model = version.get("model") if isinstance(version.get("model"), dict) else {}
    return {"status": "reported", "device": device.get("name"),
            "compute_capability": device.get("compute_capability"),
            "driver_version": device.get("driver_version"), "backend": version.get("backend"),
            "model": model.get("preset"), "retention": version.get("retention"),
            "torch": version.get("torch"), "triton": version.get("triton")}


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


def _measure(state: ArmState, text: Prompted, max_tokens: int,
             logprobs: bool = False) -> tuple[Completion, CacheEvidence]:
    """One completion with its cache evidence: usage, and /metrics read around it (where
    the server serves /metrics)."""
    client = state.client
    assert client is not None
    metrics_served = state.info.get("metrics_served", True)
    before = client.metrics() if metrics_served else None
    completion = client.complete(text, max_tokens=max_tokens, logprobs=logprobs)
    after = client.metrics() if metrics_served else None
    return completion, CacheEvidence(completion.cached_tokens, prefix_cache_delta(before, after))


def _timed_record(state: ArmState, size: int, **extra: Any) -> dict[str, Any]:
    """One sample of a unique ``size``-token prompt, with its cache evidence and why it
    looks cached (if it does); a stream cut short gives a record with its ``failure``."""
    assert state.prompts is not None
    prompt = state.prompts.unique(size)
    try:
        completion, evidence = _measure(state, prompt.text, SAMPLE_MAX_TOKENS)
    except StreamCut as error:
        return {**extra, "ttft_ms": None, "asked_tokens": size, "tokenized_tokens": prompt.tokens,
                "nonce": prompt.nonce, "failure": str(error), "cached_reasons": []}
    record = {
        **extra,
        "ttft_ms": _ms(completion.ttft_s),
        "server_timing": completion.server_timing,
        "total_ms": _ms(completion.total_s),
        "prompt_tokens": completion.prompt_tokens,  # as the server's usage reports them
        "asked_tokens": size,
        "tokenized_tokens": prompt.tokens,  # as the arm's token counter fitted them
        "token_mismatch": (None if completion.prompt_tokens is None
                           else completion.prompt_tokens - size),
        **evidence.to_record(),
        "nonce": prompt.nonce,
    }
    record["cached_reasons"] = evidence.reasons()
    return record


def warmups(state: ArmState, options: SweepOptions) -> None:
    for size in options.prompt_tokens:
        for index in range(options.warmups):
            record = _timed_record(state, size, warmup=index)
            state.warmups.setdefault(size, []).append(record)


def cold_sample(state: ArmState, size: int, round_index: int, position: int) -> dict[str, Any]:
    """One cold sample, kept as a sample, as discarded (cached or empty) or as failed (its
    stream cut short); returns it."""
    record = _timed_record(state, size, round=round_index, position=position, at=time.time())
    if "failure" in record:
        state.failed_samples.setdefault(size, []).append(record)
        return record
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
    cold, cold_evidence = _measure(state, prompt.text, n, logprobs=True)
    repeat, repeat_evidence = _measure(state, prompt.text, n, logprobs=True)
    prefix_tokens, prefix_text = _clean_prefix(cold, n // 2)
    extension_text: Prompted
    if state.client is not None and state.client.api == "chat":
        # a chat continues as a next turn, after the answer: its cache, no comparison
        prefix_tokens, prefix_text = 0, ""
        extension_text = [{"role": "user", "content": prompt.text},
                          {"role": "assistant", "content": cold.text},
                          {"role": "user", "content": state.prompts.unique(PROBE_FILL_TOKENS).text}]
    elif prefix_tokens:
        extension_text = prompt.text + prefix_text
    else:  # no clean answer text to extend with: extend with fresh text, no comparison
        extension_text = prompt.text + " " + state.prompts.unique(PROBE_FILL_TOKENS).text
    extension, extension_evidence = _measure(state, extension_text, n, logprobs=True)

    expected_rest = cold.text[len(prefix_text):] if prefix_tokens else None
    checks: dict[str, Any] = {
        "cold_uncached": _cache_check([cold_evidence], expect_hit=False),
        "repeat_same_answer": repeat.text == cold.text and bool(cold.text),
        "extension_same_answer": (None if expected_rest is None
                                  else _same_start(extension.text, expected_rest)),
    }
    reused = [repeat_evidence, extension_evidence]
    if state.arm.prefix_cache:  # a cache of final states only serves the extension
        checks["cache_reused"] = _cache_check(reused, expect_hit=True)
    else:
        checks["cache_unused"] = _cache_check(reused, expect_hit=False)
    drift_repeat = _drift(cold.token_logprobs, repeat.token_logprobs)
    drift_extension = (_drift(cold.token_logprobs[prefix_tokens:], extension.token_logprobs)
                       if prefix_tokens else None)
    drifts = [d for d in (drift_repeat, drift_extension) if d is not None]
    drift = max(drifts) if drifts else None
    checks["drift_within_bound"] = None if drift is None else drift <= options.drift_bound
    state.probe = {
        "prompt_tokens": cold.prompt_tokens, "tokenized_tokens": prompt.tokens,
        "answer_tokens": n, "extension_answer_tokens": prefix_tokens,
        "cold": _answer(cold, cold_evidence), "repeat": _answer(repeat, repeat_evidence),
        "extension": _answer(extension, extension_evidence),
        "repeat_cached_tokens": repeat_evidence.count,
        "extension_cached_tokens": extension_evidence.count,
        "drift_repeat": drift_repeat, "drift_extension": drift_extension,
        "drift": drift, "drift_bound": options.drift_bound, "checks": checks,
    }


def shared_prefix(state: ArmState, options: SweepOptions, *, warmup: bool = False) -> None:
    """One repeat of every shared-prefix case that runs (see SweepOptions.shared_prefix_runs);
    a warmup repeat goes to ``state.shared_prefix_warmups``."""
    for total, shared in options.shared_prefix_runs:
        _shared_prefix_pair(state, total, shared, warmup)


def _shared_prefix_pair(state: ArmState, total: int, shared: int, warmup: bool) -> None:
    """P1 (unique, `total` tokens) then P2: P1's first `shared` tokens and another ending."""
    assert state.prompts is not None
    head = state.prompts.unique(shared)
    first = state.prompts.extend(head.text, total)
    second = state.prompts.extend(head.text, total)
    p1, p1_evidence = _measure(state, first.text, SAMPLE_MAX_TOKENS)
    p2, p2_evidence = _measure(state, second.text, SAMPLE_MAX_TOKENS)
    records = state.shared_prefix_warmups if warmup else state.shared_prefix
    records.append({
        "shared_tokens": head.tokens, "total_tokens": total,
        "p1_ttft_ms": _ms(p1.ttft_s), "p1_prompt_tokens": p1.prompt_tokens,
        "p1_cached_tokens": p1_evidence.count,
        "p1_metrics_hits_delta": p1_evidence.hits_delta,
        "p1_cache_evidence": p1_evidence.state,
        "p2_ttft_ms": _ms(p2.ttft_s), "p2_prompt_tokens": p2.prompt_tokens,
        "p2_cached_tokens": p2_evidence.count,
        "p2_metrics_hits_delta": p2_evidence.hits_delta,
        "p2_cache_evidence": p2_evidence.state,
        "p1_server_timing": p1.server_timing, "p2_server_timing": p2.server_timing,
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
        "output_tokens": window.tokens, "tokens_counted_by": window.counted_by,
        "ended_early": window.ended_early,
        "ttft_ms": _ms(window.ttft_s), "prompt_tokens": prompt.tokens,
        "spec_drafts": drafts, "spec_accepted_tokens": accepted,
        "acceptance_length": acceptance, "tokens_per_s": tokens_per_s,
        "steps_per_s": None if tokens_per_s is None else tokens_per_s / acceptance,
    }


# -------------------------------------------------------------------- helpers


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _cache_check(evidence: list[CacheEvidence], *, expect_hit: bool) -> bool | str:
    """A cache check over requests: ``expect_hit`` when any reports cached tokens, else
    UNVERIFIABLE when any reports nothing, else ``not expect_hit``."""
    states = {e.state for e in evidence}
    if VERIFIED_CACHED in states:
        return expect_hit
    return UNVERIFIABLE if UNKNOWN in states else not expect_hit


def _answer(completion: Completion, evidence: CacheEvidence) -> dict[str, Any]:
    return {"text": completion.text, "token_logprobs": completion.token_logprobs,
            "ttft_ms": _ms(completion.ttft_s), "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens, **evidence.to_record()}


def _clean_prefix(completion: Completion, want: int) -> tuple[int, str]:
    """The first ``want`` answer tokens as text, cut before any token that is not plain
    printable ASCII (which might not tokenize back to itself); (tokens, text). Without
    token strings, characters are tokens only where the usage shows one per token
    (byte-level); else (0, "")."""
    pieces = completion.tokens
    if len(pieces) < want:
        byte_level = completion.completion_tokens == len(completion.text)
        pieces = list(completion.text) if byte_level else []
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
