"""A tiny OpenAI-compatible server for the serve-sweep tests (stdlib only, real HTTP).

Run as a script (``python sweep_fake_server.py --port P``, what --launch starts) or in a
thread (:func:`start`). Behaviour comes from environment-style flags:

    FAKE_PREFIX_CACHE=0|1     block prefix cache (usage cached_tokens, /metrics hits)
    FAKE_BLOCK=16             cache block size in tokens (= characters: byte-level)
    FAKE_US_PER_TOKEN=2       prefill time per computed (uncached) prompt token
    FAKE_DECODE_S=0.002       time per decoded token
    FAKE_ROLE_DELAY_S=0       send a role-only chunk, wait this long, then the content
    FAKE_LIE_AT=K             the K-th completion reports cached tokens in its usage
    FAKE_METRICS_LIE_AT=K     the K-th completion bumps the /metrics hits counter only
    FAKE_DIE_AT=K             the process exits (code 3) when the K-th completion arrives
    FAKE_DRIFT=0              added to the logprobs of a request that hit the cache
    FAKE_SPEC=0|1             speculative decoding counters (2 accepted per 3 drafts)
    FAKE_TAG=text             printed in the start line (for activation patterns)
    FAKE_MAX_MODEL_LEN=N      refuse (400) a completion whose prompt and max_tokens exceed N
    FAKE_LIMIT_IN=models      where N is reported: /v1/models (as vLLM), or tokenize
    FAKE_TOKENIZE=1|0         serve POST /tokenize (0: answer 404, as servers without one do)

Switches that make it behave like a plain third-party server (`transformers serve`):

    FAKE_DONE=1|0             end the stream with data: [DONE], or just end the body
    FAKE_USAGE_IN=own|last    usage (asked for with stream_options.include_usage) in a final
                              chunk of its own ("choices": []), or in the last content chunk
    FAKE_CACHED_DETAILS=1|0   usage.prompt_tokens_details.cached_tokens, or no details
    FAKE_METRICS=1|0          serve /metrics, or answer it 404
    FAKE_STRICT=0|1           answer 422 to any request field the OpenAI API does not name
    FAKE_NO_STREAM_OPTIONS=0|1  answer 422 to stream_options
    FAKE_CHUNK_TOKENS=1       tokens (characters) per content chunk
    FAKE_LOGPROBS=1|0         answer logprobs when asked, or ignore the request for them
    FAKE_CUT_AT=K             the K-th completion's stream is cut short after one token, as
    FAKE_CUT=drop               drop: the connection closes inside the chunked body
                                mid-event: the body ends inside an event
                                no-finish: the body ends with no finish_reason, usage or [DONE]
    FAKE_STALL_AT=K           the K-th completion sends one token, then nothing for 30 s

/v1/chat/completions takes its messages' contents, joined, as the prompt (no template): a
role-only chunk first, then ``delta.content`` chunks.

The model is autoregressive and deterministic: the next character depends on the last
eight characters of the context, so extending a prompt by the start of its own answer
yields the rest of that answer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ALPHABET = "abcdefghijklmnopqrstuvwxyz "
STANDARD_FIELDS = {  # request fields the OpenAI API names, per endpoint
    "/v1/completions": {"model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream",
                        "stream_options", "logprobs", "echo", "stop", "presence_penalty",
                        "frequency_penalty", "best_of", "logit_bias", "seed", "suffix",
                        "user"},
    "/v1/chat/completions": {"model", "messages", "max_tokens", "max_completion_tokens",
                             "temperature", "top_p", "n", "stream", "stream_options",
                             "logprobs", "top_logprobs", "stop", "presence_penalty",
                             "frequency_penalty", "logit_bias", "seed", "user"},
}
STALL_S = 30.0


class FakeState:
    def __init__(self, flags: dict[str, str], log) -> None:
        self.flags = flags
        self.log = log
        self.lock = threading.Lock()
        self.requests = 0
        self.cache: set[str] = set()
        self.counters = {"vllm:prefix_cache_queries_total": 0.0,
                         "vllm:prefix_cache_hits_total": 0.0,
                         "vllm:spec_decode_num_drafts_total": 0.0,
                         "vllm:spec_decode_num_accepted_tokens_total": 0.0}

    def flag(self, name: str, default: str) -> str:
        return self.flags.get(name, default)

    def number(self, name: str, default: float) -> float:
        return float(self.flag(name, str(default)))


def next_char(context: str) -> tuple[str, float]:
    digest = hashlib.sha256(context[-8:].encode()).digest()
    return ALPHABET[digest[0] % len(ALPHABET)], -0.1 - digest[1] / 255.0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: FakeState

    def setup(self) -> None:
        super().setup()  # no Nagle: headers and body go out at once, as real servers do
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args) -> None:  # quiet
        pass

    def _json(self, doc, status: int = 200) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _text(self, text: str) -> None:
        body = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length", "0"))
        return json.loads(self.rfile.read(length) or b"{}")

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json({})
        elif self.path == "/version":
            self._json({"version": "fake-1.0"})
        elif self.path == "/v1/models":
            model = {"id": "fake-model", "root": "fake/root", "revision": "abc123"}
            self._json({"data": [{**model, **self._limit("models")}]})
        elif self.path == "/metrics" and self.state.flag("FAKE_METRICS", "1") == "1":
            with self.state.lock:
                lines = [f'{name}{{model_name="fake-model"}} {value}'
                         for name, value in self.state.counters.items()]
            self._text("# fake metrics\n" + "\n".join(lines) + "\n")
        else:
            self._json({"error": "not found"}, 404)

    def do_POST(self) -> None:
        body = self._body()
        if self.path == "/tokenize" and self.state.flag("FAKE_TOKENIZE", "1") == "1":
            prompt = body.get("prompt", "")
            self._json({"tokens": list(prompt.encode()), "count": len(prompt.encode()),
                        **self._limit("tokenize")})
        elif self.path in STANDARD_FIELDS:
            self._complete(body)
        else:
            self._json({"error": "not found"}, 404)

    def _limit(self, where: str) -> dict:
        """{"max_model_len": N} where FAKE_LIMIT_IN says it is reported, else {}."""
        limit = self.state.flag("FAKE_MAX_MODEL_LEN", "")
        if not limit or self.state.flag("FAKE_LIMIT_IN", "models") != where:
            return {}
        return {"max_model_len": int(limit)}

    def _chunk(self, payload: str) -> None:
        data = f"data: {payload}\n\n".encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _refusal(self, body: dict) -> str | None:
        """Why a strict server refuses ``body`` (as `transformers serve` does), or None."""
        if "stream_options" in body and self.state.flag("FAKE_NO_STREAM_OPTIONS", "0") == "1":
            return "Unexpected fields in the request: {'stream_options'}"
        unknown = set(body) - STANDARD_FIELDS[self.path]
        if unknown and self.state.flag("FAKE_STRICT", "0") == "1":
            return f"Unexpected fields in the request: {unknown}"
        return None

    def _usage(self, prompt: str, cached: int, completion_tokens: int) -> dict:
        usage = {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens,
                 "total_tokens": len(prompt) + completion_tokens}
        if self.state.flag("FAKE_CACHED_DETAILS", "1") == "1":
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    def _choice(self, text: str, finish: str | None, logprobs: list[float] | None) -> dict:
        """One streamed choice, in the completions or the chat form."""
        choice: dict = {"index": 0, "finish_reason": finish}
        if self.path == "/v1/chat/completions":
            choice["delta"] = {"content": text}
            if logprobs is not None:
                choice["logprobs"] = {"content": [{"token": c, "logprob": lp}
                                                  for c, lp in zip(text, logprobs)]}
        else:
            choice["text"] = text
            if logprobs is not None:
                choice["logprobs"] = {"tokens": list(text), "token_logprobs": logprobs}
        return choice

    def _cut(self, how: str) -> None:
        """End the stream short: drop the connection, or end the body inside an event or
        with no finish_reason, usage or [DONE]."""
        if how == "drop":
            self.wfile.write(b"40\r\ndata: {\"choi")
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if how == "mid-event":
            data = b'data: {"choices": [{"index": 0, "te'
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _complete(self, body: dict) -> None:
        state = self.state
        refusal = self._refusal(body)
        if refusal:
            state.log(f"fake: refused (422) {refusal}")
            self._json({"detail": refusal}, 422)
            return
        chat = self.path == "/v1/chat/completions"
        prompt = "".join(m["content"] for m in body["messages"]) if chat else body["prompt"]
        limit = int(state.number("FAKE_MAX_MODEL_LEN", 0))
        if limit and len(prompt) + int(body.get("max_tokens", 16)) > limit:
            state.log(f"fake: refused prompt_tokens={len(prompt)}")
            self._json({"error": {"message": f"maximum context length is {limit} tokens"}},
                       400)
            return
        with state.lock:
            state.requests += 1
            number = state.requests
        if int(state.number("FAKE_DIE_AT", 0)) == number:
            state.log(f"fake: dying at request {number}")
            os._exit(3)
        block = int(state.number("FAKE_BLOCK", 16))
        cached = 0
        if state.flag("FAKE_PREFIX_CACHE", "1") == "1":
            with state.lock:
                for end in range(block, len(prompt), block):
                    if prompt[:end] in state.cache:
                        cached = end
                for end in range(block, len(prompt) + 1, block):
                    state.cache.add(prompt[:end])
        reported = cached
        if int(state.number("FAKE_LIE_AT", 0)) == number:
            reported = max(cached, block)
        with state.lock:
            state.counters["vllm:prefix_cache_queries_total"] += len(prompt)
            state.counters["vllm:prefix_cache_hits_total"] += cached
            if int(state.number("FAKE_METRICS_LIE_AT", 0)) == number:
                state.counters["vllm:prefix_cache_hits_total"] += block
        state.log(f"fake: request id={number} prompt_tokens={len(prompt)} "
                  f"cached_tokens={cached}")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            role_delay = state.number("FAKE_ROLE_DELAY_S", 0)
            if role_delay or chat:
                self._chunk(json.dumps({"choices": [{"index": 0, "text": "",
                                                     "delta": {"role": "assistant"}}]}))
                time.sleep(role_delay)
            time.sleep((len(prompt) - cached) * state.number("FAKE_US_PER_TOKEN", 2) / 1e6)
            drift = state.number("FAKE_DRIFT", 0) if cached else 0.0
            context = prompt
            max_tokens = int(body.get("max_tokens", 16))
            per_chunk = int(state.number("FAKE_CHUNK_TOKENS", 1))
            usage = None
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = self._usage(prompt, reported, max_tokens)
            usage_in_last = state.flag("FAKE_USAGE_IN", "own") == "last"
            for start in range(0, max_tokens, per_chunk):
                if start:
                    time.sleep(state.number("FAKE_DECODE_S", 0.002))
                text, logprobs = "", []
                for _ in range(min(per_chunk, max_tokens - start)):
                    char, logprob = next_char(context)
                    context += char
                    text += char
                    logprobs.append(logprob + drift)
                last = start + per_chunk >= max_tokens
                chunk: dict = {"choices": [self._choice(
                    text, "length" if last else None,
                    logprobs if body.get("logprobs") and state.flag("FAKE_LOGPROBS", "1") == "1"
                    else None)]}
                if last and usage and usage_in_last:
                    chunk["usage"] = usage
                self._chunk(json.dumps(chunk))
                if start and state.flag("FAKE_SPEC", "0") == "1":
                    with state.lock:
                        state.counters["vllm:spec_decode_num_drafts_total"] += 3
                        state.counters["vllm:spec_decode_num_accepted_tokens_total"] += 2
                if int(state.number("FAKE_CUT_AT", 0)) == number:
                    state.log(f"fake: cutting request {number} short")
                    self._cut(state.flag("FAKE_CUT", "drop"))
                    return
                if int(state.number("FAKE_STALL_AT", 0)) == number:
                    state.log(f"fake: stalling request {number}")
                    time.sleep(STALL_S)
            if usage and not usage_in_last:
                self._chunk(json.dumps({"choices": [], "usage": usage}))
            if state.flag("FAKE_DONE", "1") == "1":
                self._chunk("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def make_server(flags: dict[str, str], port: int = 0, log=None):
    """A ThreadingHTTPServer on 127.0.0.1 (not yet serving)."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    state = FakeState(flags, log)
    handler = type("FakeHandler", (Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    cache = "on" if flags.get("FAKE_PREFIX_CACHE", "1") == "1" else "off"
    log(f"fake: listening on http://127.0.0.1:{server.server_address[1]} prefix_cache={cache} "
        f"tag={flags.get('FAKE_TAG', '')}")
    return server


def start(flags: dict[str, str] | None = None):
    """Serve in a daemon thread; returns (server, url, log_lines)."""
    lines: list[str] = []
    server = make_server(dict(flags or {}), log=lines.append)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}", lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tag", default=None)
    args = parser.parse_args()
    flags = {k: v for k, v in os.environ.items() if k.startswith("FAKE_")}
    if args.tag:
        flags["FAKE_TAG"] = args.tag
    make_server(flags, args.port).serve_forever()


if __name__ == "__main__":
    main()
