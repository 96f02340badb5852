"""One OpenAI-compatible server over HTTP, as the sweep sees it.

:class:`ServerClient` sends greedy streaming completions and measures TTFT: the time on
a monotonic clock (``time.perf_counter``) from sending the request to the first streamed
chunk that carries generated text. A role-only chunk, an empty text or a usage chunk does
not stop the clock. Prompt, completion and cached token counts come from the server's
``usage`` (``stream_options.include_usage``); ``/metrics`` is read as Prometheus text.

Transport failures (refused connection, a connection closed mid-stream, a timeout) raise
:class:`ServerGone`; an HTTP error status or a malformed stream raises
:class:`ServerError`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


class ServerError(RuntimeError):
    """The server answered, but not as the OpenAI API says (an error status, bad JSON)."""


class ServerGone(ServerError):
    """The server cannot be reached or dropped the connection: it is down or dying."""


@dataclass
class Completion:
    """One streamed completion, as measured by the client."""

    text: str = ""
    tokens: list[str] = field(default_factory=list)  # token strings, where reported
    token_logprobs: list[float | None] = field(default_factory=list)
    ttft_s: float | None = None  # send -> first chunk with generated text
    total_s: float = 0.0
    content_chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # None: the server did not report it
    finish_reason: str | None = None

    def token_texts(self) -> list[str]:
        return list(self.tokens)


@dataclass
class DecodeWindow:
    """Output tokens counted over a fixed window after the first generated token."""

    window_s: float
    elapsed_s: float
    tokens: int
    ttft_s: float | None
    ended_early: bool  # the stream ended (max tokens, end of text) before the window

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 and self.tokens else None


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum each metric's samples over all its label sets: {name: total}."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, rest = line.partition("{")
            _, _, rest = rest.rpartition("}")
        else:
            name, _, rest = line.partition(" ")
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        name = name.strip()
        totals[name] = totals.get(name, 0.0) + value
    return totals


class ServerClient:
    """HTTP client for one server at ``base_url`` (no trailing /v1).

    ``api_key`` is sent as a bearer token and never stored anywhere else. ``model`` is the
    model id for requests; :meth:`resolve_model` reads it from ``/v1/models``.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None,
                 request_timeout_s: float = 600.0, model: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.base_url = self.base_url.removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers,
            timeout=httpx.Timeout(request_timeout_s, connect=5.0),
        )
        self.model = model

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServerClient:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plain requests

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise ServerGone(f"{method} {self.base_url}{path}: {type(error).__name__}: "
                             f"{error}") from error

    def health(self, timeout_s: float = 2.0) -> bool:
        """True when GET /health answers 200."""
        try:
            response = self._http.get("/health", timeout=timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def get_json(self, path: str) -> dict[str, Any] | None:
        """GET ``path`` as JSON; None when it answers an error status or no JSON."""
        response = self._request("GET", path)
        if response.status_code != 200:
            return None
        try:
            doc = response.json()
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else {"value": doc}

    def resolve_model(self) -> dict[str, Any]:
        """Read /v1/models; sets :attr:`model` to the first id. Returns {id, root, revision,
        count, max_model_len} (max_model_len: as vLLM lists it, else None)."""
        doc = self.get_json("/v1/models") or {}
        data = doc.get("data") or []
        first = data[0] if data and isinstance(data[0], dict) else {}
        if self.model is None:
            self.model = first.get("id")
        if self.model is None:
            raise ServerError(f"{self.base_url}/v1/models lists no model")
        return {"id": first.get("id"), "root": first.get("root"),
                "revision": first.get("revision"), "count": len(data),
                "max_model_len": _token_limit(first.get("max_model_len"))}

    def tokenize(self, prompt: str) -> int:
        """Token count of ``prompt`` from POST /tokenize."""
        doc = self._tokenize(prompt)
        count = doc.get("count")
        if count is None and isinstance(doc.get("tokens"), list):
            count = len(doc["tokens"])
        if not isinstance(count, int):
            raise ServerError(f"POST /tokenize gave no token count: {str(doc)[:200]}")
        return count

    def tokenize_limit(self) -> int | None:
        """The ``max_model_len`` that POST /tokenize reports (vLLM, the embedded server);
        None when it reports none."""
        return _token_limit(self._tokenize("limit").get("max_model_len"))

    def _tokenize(self, prompt: str) -> dict[str, Any]:
        """POST /tokenize's answer for ``prompt``."""
        body: dict[str, Any] = {"prompt": prompt}
        if self.model:
            body["model"] = self.model
        response = self._request("POST", "/tokenize", json=body)
        if response.status_code != 200:
            raise ServerError(f"POST /tokenize answered {response.status_code}: "
                              f"{response.text[:200]}")
        try:
            doc = response.json()
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise ServerError(f"POST /tokenize answered no JSON object: {response.text[:200]}")
        return doc

    def metrics(self) -> dict[str, float] | None:
        """The /metrics counters summed over labels; None when /metrics is not served."""
        response = self._request("GET", "/metrics")
        if response.status_code != 200:
            return None
        return parse_prometheus(response.text)

    # ------------------------------------------------------------------ streaming

    def complete(self, prompt: str, *, max_tokens: int, logprobs: bool = True) -> Completion:
        """One greedy streaming completion of ``prompt``, timed (see the module docstring)."""
        result = Completion()
        start = time.perf_counter()
        for chunk in self._stream(prompt, max_tokens=max_tokens, logprobs=logprobs):
            now = time.perf_counter()
            self._absorb(result, chunk, now - start)
        result.total_s = time.perf_counter() - start
        return result

    def decode_window(self, prompt: str, *, window_s: float, max_tokens: int) -> DecodeWindow:
        """Count output tokens for ``window_s`` seconds after the first generated token.

        The first token (the prefill's) is not counted; the stream is closed when the
        window ends. Tokens are counted from the per-token logprobs of each chunk (so a
        chunk carrying several speculative tokens counts each), else one per chunk.
        """
        ttft: float | None = None
        first_at = last_at = 0.0
        tokens = 0
        ended_early = True
        start = time.perf_counter()
        stream = self._stream(prompt, max_tokens=max_tokens, logprobs=True)
        try:
            for chunk in stream:
                now = time.perf_counter()
                count = _chunk_token_count(chunk)
                if count == 0:
                    continue
                if ttft is None:
                    ttft, first_at, last_at = now - start, now, now
                    continue
                if now - first_at > window_s:
                    ended_early = False
                    break
                tokens += count
                last_at = now
        finally:
            stream.close()
        elapsed = (last_at - first_at) if ended_early else window_s
        return DecodeWindow(window_s=window_s, elapsed_s=elapsed, tokens=tokens, ttft_s=ttft,
                            ended_early=ended_early)

    def _stream(self, prompt: str, *, max_tokens: int, logprobs: bool) -> Iterator[dict]:
        body: dict[str, Any] = {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
        }
        if logprobs:
            body["logprobs"] = 1
        try:
            with self._http.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    response.read()
                    raise ServerError(f"POST /v1/completions answered {response.status_code}:"
                                      f" {response.text[:200]}")
                done = False
                for line in response.iter_lines():  # read to the end: the connection
                    if done or not line.startswith("data:"):  # then goes back to the pool
                        continue
                    payload = line[len("data:"):].strip()
                    if payload == "[DONE]":
                        done = True
                        continue
                    try:
                        chunk = json.loads(payload)
                    except ValueError as error:
                        raise ServerError(f"a stream chunk is not JSON: {payload[:120]!r}") \
                            from error
                    if isinstance(chunk, dict) and "error" in chunk:
                        raise ServerError(f"the server streamed an error: "
                                          f"{str(chunk['error'])[:200]}")
                    yield chunk
                if not done:
                    raise ServerGone(f"{self.base_url}: the stream ended without [DONE]")
        except httpx.TransportError as error:
            raise ServerGone(f"POST {self.base_url}/v1/completions: {type(error).__name__}: "
                             f"{error or 'connection lost'}") from error

    @staticmethod
    def _absorb(result: Completion, chunk: dict[str, Any], at_s: float) -> None:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            result.prompt_tokens = usage.get("prompt_tokens", result.prompt_tokens)
            result.completion_tokens = usage.get("completion_tokens", result.completion_tokens)
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                result.cached_tokens = int(details["cached_tokens"])
        for choice in chunk.get("choices") or []:
            text = _choice_text(choice)
            if text:
                result.content_chunks += 1
                result.text += text
                if result.ttft_s is None:
                    result.ttft_s = at_s
            lp = choice.get("logprobs")
            if isinstance(lp, dict):
                result.token_logprobs.extend(lp.get("token_logprobs") or [])
                result.tokens.extend(lp.get("tokens") or [])
            if choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]


def _token_limit(value: Any) -> int | None:
    """A server's token limit as it reported it: a positive integer, else None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def _choice_text(choice: dict[str, Any]) -> str:
    text = choice.get("text")
    if text is None:
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else None
    return text or ""


def _chunk_token_count(chunk: dict[str, Any]) -> int:
    count = 0
    for choice in chunk.get("choices") or []:
        lp = choice.get("logprobs")
        if isinstance(lp, dict) and lp.get("token_logprobs"):
            count += len(lp["token_logprobs"])
        elif _choice_text(choice):
            count += 1
    return count
