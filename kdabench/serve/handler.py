"""The reference server's HTTP face: routes, JSON bodies and server-sent-event streams.

`handler_for(server)` is the request handler class bound to one server (a
:class:`~kdabench.serve.service.RequestServer`, such as
:class:`~kdabench.serve.server.LocalServer`): GET routes answer from it, POST routes parse
the request (:mod:`kdabench.serve.protocol`) and stream or return what
:meth:`LocalServer.generate <kdabench.serve.server.LocalServer.generate>` yields.
"""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

import kdabench

from .model import MODEL_ID
from .protocol import (
    SERVER_NAME,
    GenerationRequest,
    RequestError,
    chat_logprobs,
    completion_logprobs,
    parse_generation,
    server_side,
    token_text,
    usage_of,
)

if TYPE_CHECKING:
    from .service import RequestServer


def handler_for(server: RequestServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        local = server

    return Handler


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; streams use chunked transfer encoding
    server_version = f"{SERVER_NAME}/{kdabench.__version__}"
    disable_nagle_algorithm = True  # each SSE event leaves at once
    local: RequestServer

    GET_ROUTES = ("/health", "/version", "/v1/models", "/metrics")
    POST_ROUTES = ("/tokenize", "/v1/completions", "/v1/chat/completions")

    def log_message(self, format: str, *args: Any) -> None:  # the request lines say enough
        pass

    # -- plumbing ------------------------------------------------------------------------

    def _send(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        if self.close_connection:  # say so, or a keep-alive client reuses a closed socket
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)

    def _send_json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _content_length(self) -> int:
        try:
            return max(int(self.headers.get("Content-Length") or 0), 0)
        except ValueError:
            self.close_connection = True
            raise RequestError(400, "bad Content-Length header") from None

    def _read_json(self) -> Any:
        length = self._content_length()
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise RequestError(400, f"the request body is not valid JSON: {error}") from None

    def _path(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    def _refuse(self, error: RequestError) -> None:
        self._send_json(error.status, error.body())

    def _unknown(self, path: str) -> RequestError:
        if path in self.GET_ROUTES or path in self.POST_ROUTES:
            return RequestError(
                405, f"method {self.command} is not allowed on {path}", kind="method_not_allowed"
            )
        return RequestError(404, f"no route {path}", kind="not_found_error")

    # -- routes --------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self._path()
        if path == "/health":
            self._send_json(200, {"status": "ok"})
        elif path == "/version":
            self._send_json(200, self.local.version())
        elif path == "/v1/models":
            self._send_json(200, self.local.models())
        elif path == "/metrics":
            self._send(
                200,
                self.local.metrics.render().encode(),
                "text/plain; version=0.0.4; charset=utf-8",
            )
        else:
            self._refuse(self._unknown(path))

    def do_POST(self) -> None:
        started = time.perf_counter()
        self._response_started = False
        path = self._path()
        try:
            if path not in self.POST_ROUTES:
                self._read_json_quietly()
                raise self._unknown(path)
            body = self._read_json()
            if path == "/tokenize":
                self._send_json(200, self.local.tokenize(body))
                return
            request = parse_generation(
                body,
                chat=path == "/v1/chat/completions",
                max_prompt_tokens=self.local.max_prompt_tokens,
            )
        except RequestError as error:
            self._refuse(error)
            return
        try:
            if request.stream:
                self._stream(request, started)
            else:
                self._complete(request, started)
        except Exception as error:  # noqa: BLE001 (a bug: log it, answer 500 if nothing was sent)
            self.local.log(f"error: {type(error).__name__}: {error}")
            self.close_connection = True
            if not self._response_started:
                self._send_json(500, RequestError(500, str(error), kind="server_error").body())

    def send_response(self, code: int, message: str | None = None) -> None:
        self._response_started = True
        super().send_response(code, message)

    def _read_json_quietly(self) -> None:
        length = self._content_length()
        if length > 0:
            self.rfile.read(length)

    def _complete(self, request: GenerationRequest, started: float) -> None:
        tokens, request_id, prefilled = [], "", None
        for request_id, prefilled, token in self.local.generate(request, started):
            tokens.append(token)
        text = "".join(token_text(t.token) for t in tokens)
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if request.chat:
            choice["message"] = {"role": "assistant", "content": text}
            choice["logprobs"] = None if request.logprobs is None else chat_logprobs(tokens)
        else:
            choice["text"] = text
            choice["logprobs"] = (
                None if request.logprobs is None else completion_logprobs(tokens, 0)
            )
        self._send_json(
            200,
            {
                "id": request_id,
                "object": "chat.completion" if request.chat else "text_completion",
                "created": int(time.time()),
                "model": MODEL_ID,
                "choices": [choice],
                "usage": usage_of(prefilled, len(tokens)),
                "kdabench": server_side(prefilled),
            },
        )

    def _stream(self, request: GenerationRequest, started: float) -> None:
        created = int(time.time())
        kind = "chat.completion.chunk" if request.chat else "text_completion"
        headers_sent = False

        def event(request_id: str, choices: list[dict[str, Any]], **extra: Any) -> None:
            nonlocal headers_sent
            if not headers_sent:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                headers_sent = True
            chunk = {
                "id": request_id,
                "object": kind,
                "created": created,
                "model": MODEL_ID,
                "choices": choices,
                **extra,
            }
            self._write_chunk(f"data: {json.dumps(chunk)}\n\n".encode())

        def role_chunk(request_id: str) -> None:
            delta = {"role": "assistant"}
            event(
                request_id, [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]
            )

        count, offset, request_id, prefilled = 0, 0, "", None
        generation = self.local.generate(request, started, role_chunk if request.chat else None)
        try:
            for request_id, prefilled, token in generation:
                count += 1
                text = token_text(token.token)
                last = count == request.max_tokens
                choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
                if request.chat:
                    choice["delta"] = {"content": text}
                    choice["logprobs"] = (
                        None if request.logprobs is None else chat_logprobs([token])
                    )
                else:
                    choice["text"] = text
                    choice["logprobs"] = (
                        None if request.logprobs is None else completion_logprobs([token], offset)
                    )
                offset += len(text)
                event(request_id, [choice])
            if request.include_usage:
                event(
                    request_id,
                    [],
                    usage=usage_of(prefilled, count),
                    kdabench=server_side(prefilled),
                )
            self._write_chunk(b"data: [DONE]\n\n")
            self._write_chunk(b"")  # the last chunk of the chunked body
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            generation.close()

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
