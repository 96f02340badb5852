"""One OpenAI-compatible server over HTTP, as the sweep sees it.

:class:`ServerClient` sends greedy streaming completions, to ``/v1/completions`` or (``api=
"chat"``, the prompt as one user message) ``/v1/chat/completions``, and measures TTFT: the
time on a monotonic clock (``time.perf_counter``) from sending the request to the first
streamed chunk that carries generated text. A role-only chunk, an empty text or a usage
chunk does not stop the clock. Only standard OpenAI request fields are sent. Prompt,
completion and cached token counts come from the server's ``usage``, asked for with
``stream_options.include_usage``: in the last content chunk or in a final chunk of its own
(``"choices": []``); a server that answers 400 or 422 to that option is asked once more
without it, and from then on never. ``/metrics`` is read as Prometheus text.

A stream is server-sent events; it is complete at ``data: [DONE]``, or when the body ends
after a whole event once a finish_reason or usage has come. A stream cut short (the
connection lost after the answer began, the body ending inside an event, or ending with
no finish_reason, usage or [DONE]) raises :class:`StreamCut`. Other transport failures
(refused connection, no answer at all, the request timeout) raise :class:`ServerGone`; an
HTTP error status or a malformed stream raises :class:`ServerError`.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
APIS = tuple(API_PATHS)
USAGE_REFUSED_STATUSES = (400, 422)  # a request the server refused to validate
Prompted = str | list[dict[str, str]]  # a prompt, or (chat) the messages of a conversation
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


class ServerError(RuntimeError):
    """The server answered, but not as the OpenAI API says (an error status, bad JSON)."""


class ServerGone(ServerError):
    """The server cannot be reached, gave no answer or ran past the request timeout."""


class NotServed(ServerError):
    """The server does not serve the endpoint asked for (404 or 405)."""


class StreamCut(ServerError):
    """A stream that began but ended before its completion did (see the module docstring)."""


@dataclass(frozen=True)
class CacheCounters:
    """One server family's /metrics prefix-cache counters, in prompt tokens."""

    server: str
    queries: str  # prompt tokens looked up in the cache
    hits: str  # prompt tokens found there


#: Counters read as cache evidence, first match wins; extend for another server.
#: (TGI exposes no prefix-cache counter.)
PREFIX_CACHE_COUNTERS = (
    CacheCounters("vllm", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"),
    CacheCounters("sglang", "sglang:prompt_tokens_total", "sglang:cached_tokens_total"),
)


@dataclass(frozen=True)
class CacheDelta:
    """How one family's prefix-cache counters moved between two reads of /metrics."""

    server: str
    queries: float
    hits: float


def prefix_cache_delta(before: dict[str, float] | None,
                       after: dict[str, float] | None) -> CacheDelta | None:
    """The first family of :data:`PREFIX_CACHE_COUNTERS` served in ``after``, as its change
    since ``before``; None when /metrics was not served or lists none of them."""
    if before is None or after is None:
        return None
    for counters in PREFIX_CACHE_COUNTERS:
        if counters.queries in after and counters.hits in after:
            return CacheDelta(counters.server,
                              after[counters.queries] - before.get(counters.queries, 0.0),
                              after[counters.hits] - before.get(counters.hits, 0.0))
    return None


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
    server_timing: dict[str, float] | None = None  # ms per phase, where the server says


@dataclass
class DecodeWindow:
    """Output tokens counted over a fixed window after the first generated token."""

    window_s: float
    elapsed_s: float
    tokens: int
    ttft_s: float | None
    ended_early: bool  # the stream ended (max tokens, end of text) before the window
    counted_by: str  # "usage", "logprobs" (per-token), or "chunks" (one token per chunk)

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
    model id for requests; :meth:`resolve_model` reads it from ``/v1/models``. ``api`` is
    "completions" or "chat". :attr:`stream_usage` turns False once the server refused
    ``stream_options``.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None,
                 request_timeout_s: float = 600.0, model: str | None = None,
                 api: str = "completions") -> None:
        if api not in API_PATHS:
            raise ValueError(f"api {api!r} is not one of {', '.join(APIS)}")
        self.base_url = base_url.rstrip("/")
        self.base_url = self.base_url.removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers,
            timeout=httpx.Timeout(request_timeout_s, connect=5.0),
        )
        self.request_timeout_s = request_timeout_s
        self.model = model
        self.api = api
        self.stream_usage = True

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
        None when it reports none or serves no /tokenize."""
        try:
            return _token_limit(self._tokenize("limit").get("max_model_len"))
        except NotServed:
            return None

    def _tokenize(self, prompt: str) -> dict[str, Any]:
        """POST /tokenize's answer for ``prompt``."""
        body: dict[str, Any] = {"prompt": prompt}
        if self.model:
            body["model"] = self.model
        response = self._request("POST", "/tokenize", json=body)
        if response.status_code in (404, 405):
            raise NotServed(f"POST /tokenize is not served ({response.status_code})")
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

    def complete(self, prompt: Prompted, *, max_tokens: int,
                 logprobs: bool = True) -> Completion:
        """One greedy streaming completion of ``prompt`` (chat: also a list of messages),
        timed (see the module docstring)."""
        result = Completion()
        start = time.perf_counter()
        for chunk in self._stream(prompt, max_tokens=max_tokens, logprobs=logprobs):
            now = time.perf_counter()
            self._absorb(result, chunk, now - start)
        result.total_s = time.perf_counter() - start
        return result

    def decode_window(self, prompt: str, *, window_s: float, max_tokens: int) -> DecodeWindow:
        """Count output tokens for ``window_s`` seconds after the first generated token.

        The first chunk's tokens (the prefill's) are not counted; the stream is closed when
        the window ends. Tokens are counted from the per-token logprobs of each chunk (so a
        chunk carrying several speculative tokens counts each); without them, a stream that
        ends inside the window shares its usage's count evenly over its chunks, else each
        chunk counts one.
        """
        ttft: float | None = None
        first_at = last_at = 0.0
        tokens = chunks = 0
        per_token = True
        usage_tokens: int | None = None
        ended_early = True
        start = time.perf_counter()
        stream = self._stream(prompt, max_tokens=max_tokens, logprobs=True)
        try:
            for chunk in stream:
                now = time.perf_counter()
                usage_tokens = _usage_field(chunk, "completion_tokens", usage_tokens)
                count, exact = _chunk_token_count(chunk)
                if count == 0:
                    continue
                per_token = per_token and exact
                chunks += 1
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
        counted_by = "logprobs" if per_token else "chunks"
        if not per_token and ended_early and usage_tokens is not None:
            tokens, counted_by = round(usage_tokens * (chunks - 1) / chunks), "usage"
        elapsed = (last_at - first_at) if ended_early else window_s
        return DecodeWindow(window_s=window_s, elapsed_s=elapsed, tokens=tokens, ttft_s=ttft,
                            ended_early=ended_early, counted_by=counted_by)

    def _body(self, prompt: Prompted, max_tokens: int, logprobs: bool) -> dict[str, Any]:
        """The request: standard OpenAI fields only, for :attr:`api`."""
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens,
                                "temperature": 0, "stream": True}
        if self.api == "chat":
            body["messages"] = ([{"role": "user", "content": prompt}]
                                if isinstance(prompt, str) else prompt)
        elif not isinstance(prompt, str):
            raise ValueError("a list of messages needs the chat API")
        else:
            body["prompt"] = prompt
        if logprobs:
            body["logprobs"] = True if self.api == "chat" else 1
        if self.stream_usage:
            body["stream_options"] = {"include_usage": True}
        return body

    def _stream(self, prompt: Prompted, *, max_tokens: int,
                logprobs: bool) -> Iterator[dict]:
        """The stream's JSON chunks; raises as the module docstring says."""
        path = API_PATHS[self.api]
        where = f"POST {self.base_url}{path}"
        start = time.perf_counter()
        began = False
        try:
            with self._open_stream(path, self._body(prompt, max_tokens, logprobs)) as response:
                if response.status_code != 200:
                    response.read()
                    raise ServerError(f"{where} answered {response.status_code}: "
                                      f"{response.text[:200]}")
                began = True
                yield from self._chunks(response.iter_lines(), start, where)
        except httpx.TimeoutException as error:
            raise ServerGone(f"{where}: no answer within the request timeout "
                             f"({self.request_timeout_s:g} s): {type(error).__name__}") \
                from error
        except httpx.TransportError as error:
            what = f"{type(error).__name__}: {error or 'connection lost'}"
            if began:
                raise StreamCut(f"{where}: the connection was lost mid-stream ({what})") \
                    from error
            raise ServerGone(f"{where}: {what}") from error

    @contextlib.contextmanager
    def _open_stream(self, path: str, body: dict[str, Any]) -> Iterator[httpx.Response]:
        """POST ``body`` for a stream; when the server refuses it with ``stream_options``,
        once more without, and (if that is accepted) never send the option again."""
        with self._http.stream("POST", path, json=body) as response:
            if "stream_options" not in body or \
                    response.status_code not in USAGE_REFUSED_STATUSES:
                yield response
                return
            response.read()
        plain = {key: value for key, value in body.items() if key != "stream_options"}
        with self._http.stream("POST", path, json=plain) as response:
            if response.status_code == 200:
                self.stream_usage = False
            yield response

    def _chunks(self, lines: Iterable[str], start: float, where: str) -> Iterator[dict]:
        """JSON chunks of the event stream ``lines``; read to the end of the body, so the
        connection goes back to the pool."""
        events = _sse_data(lines)
        finished = False
        for data in events:
            if time.perf_counter() - start > self.request_timeout_s:
                raise ServerGone(f"{where}: no complete answer within the request timeout "
                                 f"({self.request_timeout_s:g} s)")
            if data.strip() == "[DONE]":
                _drain(events)
                return
            chunk = _json_chunk(data)
            finished = finished or _chunk_finishes(chunk)
            yield chunk
        if not finished:
            raise StreamCut(f"{where}: the stream ended with no finish_reason, usage or "
                            "[DONE]")

    @staticmethod
    def _absorb(result: Completion, chunk: dict[str, Any], at_s: float) -> None:
        extension = chunk.get("kdabench")  # the embedded server's own account of the request
        if isinstance(extension, dict) and isinstance(extension.get("server_timing"), dict):
            result.server_timing = {str(k): float(v) for k, v in
                                    extension["server_timing"].items()
                                    if isinstance(v, (int, float))}
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
            tokens, logprobs = _choice_logprobs(choice)
            result.tokens.extend(tokens)
            result.token_logprobs.extend(logprobs)
            if choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]


def _token_limit(value: Any) -> int | None:
    """A server's token limit as it reported it: a positive integer, else None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def _sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The data of each whole server-sent event in ``lines``; :class:`StreamCut` when the
    body ends inside an event (a lone ``data: [DONE]`` line excepted)."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            data.append(line.removeprefix("data:").removeprefix(" "))
    if data == ["[DONE]"]:
        yield data[0]
    elif data:
        raise StreamCut(f"the body ended inside an event: {' '.join(data)[:120]!r}")


def _drain(events: Iterator[str]) -> None:
    """Read what follows [DONE] to the end of the body, ignoring it."""
    with contextlib.suppress(StreamCut):
        for _ in events:
            pass


def _json_chunk(data: str) -> dict[str, Any]:
    """One event's JSON chunk; :class:`ServerError` for no JSON object or an error."""
    try:
        chunk = json.loads(data)
    except ValueError as error:
        raise ServerError(f"a stream chunk is not JSON: {data[:120]!r}") from error
    if not isinstance(chunk, dict):
        raise ServerError(f"a stream chunk is not a JSON object: {data[:120]!r}")
    if "error" in chunk:
        raise ServerError(f"the server streamed an error: {str(chunk['error'])[:200]}")
    return chunk


def _chunk_finishes(chunk: dict[str, Any]) -> bool:
    """True for a chunk with usage or a finish_reason: the stream may end after it."""
    if isinstance(chunk.get("usage"), dict):
        return True
    return any(isinstance(choice, dict) and choice.get("finish_reason")
               for choice in chunk.get("choices") or [])


def _usage_field(chunk: dict[str, Any], name: str, default: int | None) -> int | None:
    usage = chunk.get("usage")
    value = usage.get(name) if isinstance(usage, dict) else None
    return value if isinstance(value, int) else default


def _choice_text(choice: dict[str, Any]) -> str:
    """Generated text of a streamed choice: completions' ``text``, else the chat delta's
    ``content`` (or the reasoning text some servers stream before it)."""
    text = choice.get("text")
    if text is None:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text = (delta.get("content") or delta.get("reasoning_content")
                    or delta.get("reasoning"))
    return text if isinstance(text, str) else ""


def _choice_logprobs(choice: dict[str, Any]) -> tuple[list[str], list[float | None]]:
    """(token strings, logprobs) of a streamed choice: the completions form
    (``tokens``/``token_logprobs``) or the chat form (``content: [{token, logprob}]``)."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return [], []
    if isinstance(lp.get("content"), list):
        entries = [e for e in lp["content"] if isinstance(e, dict)]
        return [e.get("token") or "" for e in entries], [e.get("logprob") for e in entries]
    return list(lp.get("tokens") or []), list(lp.get("token_logprobs") or [])


def _chunk_token_count(chunk: dict[str, Any]) -> tuple[int, bool]:
    """(tokens in the chunk, whether counted per token): from its logprobs, else one per
    choice with text."""
    count, exact = 0, True
    for choice in chunk.get("choices") or []:
        logprobs = _choice_logprobs(choice)[1]
        if logprobs:
            count += len(logprobs)
        elif _choice_text(choice):
            count += 1
            exact = False
    return count, exact
