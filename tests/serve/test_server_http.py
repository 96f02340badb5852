"""The embedded reference server over real loopback HTTP (httpx), CPU tier."""

from __future__ import annotations

import io
import json
import os
import random
import re
import signal
import subprocess
import sys
from importlib import metadata

import httpx
import pytest

import kdabench
from kdabench.serve import start_local_server

MODEL = "kdabench-local-kda"
LISTENING = re.compile(
    r"^kdabench-local: listening on (http://127\.0\.0\.1:\d+) checkpoint_export=(on|off) "
    r"prefix_cache=(on|off) block_tokens=(\d+) device=cpu max_batched_tokens=(\d+) "
    r"cache_gib=4 model=tiny backend=chunk cuda_graphs=off$"
)
REQUEST = re.compile(
    r"kdabench-local: request id=(\S+) prompt_tokens=(\d+) cached_tokens=(\d+) "
    r"computed_tokens=(\d+) checkpoints_exported=(\d+) ttft_ms=[\d.]+ wait_ms=[\d.]+ "
    r"lookup_ms=[\d.]+ compute_ms=[\d.]+ commit_ms=[\d.]+ first_token_ms=[\d.]+ "
    r"compute_enqueue_ms=[\d.]+ gc_ms=[\d.]+ gc_collections=\d+\.0$"
)
TIMING = ("ttft_ms", "wait_ms", "lookup_ms", "compute_ms", "commit_ms", "first_token_ms")
DETAIL = ("compute_enqueue_ms", "gc_ms", "gc_collections")  # on the CPU: no compute_device_ms


class Served:
    """A running server, an httpx client on it, and its captured log lines."""

    def __init__(self, env: dict[str, str], **kwargs):
        self.log = io.StringIO()
        self.server = start_local_server(port=0, env=env, log=self.log, **kwargs)
        self.client = httpx.Client(base_url=self.server.url, timeout=60)

    def close(self) -> None:
        self.client.close()
        self.server.stop()

    def lines(self) -> list[str]:
        return self.log.getvalue().splitlines()

    def last_request(self) -> dict[str, int]:
        match = REQUEST.fullmatch(self.lines()[-1])
        assert match, self.lines()[-1]
        keys = ("prompt_tokens", "cached_tokens", "computed_tokens", "checkpoints_exported")
        return dict(zip(keys, map(int, match.groups()[1:])))

    def stream(self, path: str, body: dict) -> list:
        """POST a streaming request; the decoded `data:` payloads ([DONE] as the string)."""
        events = []
        with self.client.stream("POST", path, json={**body, "stream": True}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            text = "".join(response.iter_text())
        for block in text.split("\n\n"):
            if block.strip():
                assert block.startswith("data: ")
                payload = block[len("data: ") :]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
        return events

    def metrics(self) -> dict[str, float]:
        text = self.client.get("/metrics").text
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name.split("{")[0]] = float(value)
        return values


@pytest.fixture(scope="module")
def served():
    s = Served({"KDABENCH_LOCAL_BLOCK_TOKENS": "256"}, max_tokens_per_prompt=16384)
    yield s
    s.close()


def text_prompt(n: int, seed: int) -> str:
    """n printable ASCII characters (n tokens), unique per seed."""
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ,.") for _ in range(n))


def complete(served: Served, prompt, max_tokens: int = 8, **extra) -> dict:
    response = served.client.post("/v1/completions", json={
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "logprobs": 1, **extra})  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()


def test_listening_line(served):
    match = LISTENING.fullmatch(served.lines()[0])
    assert match and match.groups()[1:] == ("on", "on", "256", "8192")
    assert match.group(1) == served.server.url


def test_health_version_models_tokenize(served):
    c = served.client
    assert c.get("/health").json() == {"status": "ok"}
    version = c.get("/version").json()
    assert (version["version"], version["server"]) == (kdabench.__version__, "kdabench-local")
    assert version["device"]["kind"] == "cpu" and version["device"]["name"]
    assert version["backend"] == "chunk"
    assert (version["torch"], version["triton"]) == (metadata.version("torch"),
                                                     metadata.version("triton"))
    model = version["model"]
    assert (model["preset"], model["num_layers"], model["num_heads"], model["head_dim"]) == (
        "tiny", 2, 2, 64)
    assert model["state_bytes"] == 2 * 2 * 64 * 64 * 4
    retention = version["retention"]
    assert (retention["block_tokens"], retention["max_batched_tokens"],
            retention["checkpoint_export"], retention["checkpoint_capacity"]) == (256, 8192, True, 4)
    assert retention["cache_slots"] == 4 * 2**30 // model["state_bytes"]
    assert c.get("/v1/models").json() == {"object": "list", "data": [{
        "id": MODEL, "object": "model", "owned_by": "kdabench", "root": MODEL,
        "revision": "tiny-seed-0"}]}  # fmt: skip
    tokenized = c.post("/tokenize", json={"model": MODEL, "prompt": "héllo"}).json()
    assert tokenized == {"tokens": list("héllo".encode()), "count": 6, "max_model_len": 16384}


def test_streaming_completion(served):
    events = served.stream("/v1/completions", {
        "model": MODEL, "prompt": text_prompt(300, seed=1), "max_tokens": 5, "logprobs": 1,
        "stream_options": {"include_usage": True}})  # fmt: skip
    assert events[-1] == "[DONE]"
    tokens, usage = events[:-2], events[-2]
    assert len(tokens) == 5
    for i, chunk in enumerate(tokens):
        choice = chunk["choices"][0]
        assert chunk["object"] == "text_completion" and len(choice["text"]) == 1
        assert len(choice["logprobs"]["token_logprobs"]) == 1
        assert choice["finish_reason"] == ("length" if i == 4 else None)
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": 300,
        "completion_tokens": 5,
        "total_tokens": 305,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    timing = usage["kdabench"]["server_timing"]  # the phases of the TTFT, in ms, then detail
    assert tuple(timing) == TIMING + DETAIL and all(value >= 0 for value in timing.values())
    parts = sum(timing[name] for name in TIMING[1:])
    assert parts <= timing["ttft_ms"] + 0.01 and timing["compute_ms"] > 0
    assert timing["compute_enqueue_ms"] <= timing["compute_ms"]
    assert timing["gc_ms"] <= timing["ttft_ms"]
    assert served.last_request() == {
        "prompt_tokens": 300,
        "cached_tokens": 0,
        "computed_tokens": 300,
        "checkpoints_exported": 1,
    }


def test_chat_stream_opens_with_a_role_only_chunk(served):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text_prompt(50, seed=2)}],
        "max_tokens": 3,
        "stream_options": {"include_usage": True},
    }
    events = served.stream("/v1/chat/completions", body)
    first = events[0]["choices"][0]
    assert first["delta"] == {"role": "assistant"} and "content" not in first["delta"]
    contents = [e["choices"][0]["delta"]["content"] for e in events[1:4]]
    assert all(len(c) == 1 for c in contents)
    assert events[4]["choices"] == [] and events[4]["usage"]["completion_tokens"] == 3
    assert events[5] == "[DONE]"
    plain = served.client.post("/v1/chat/completions", json={**body, "stream": False}).json()
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": "".join(contents)}
    assert plain["object"] == "chat.completion"


def test_greedy_answers_match_cold_cached_and_extended(served):
    prompt = text_prompt(600, seed=3)  # blocks of 256: boundaries 256 and 512
    cold = complete(served, prompt)
    cached = complete(served, prompt)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert cached["usage"]["prompt_tokens_details"]["cached_tokens"] == 512
    answer = cold["choices"][0]["logprobs"]["tokens"]
    assert cached["choices"][0]["logprobs"]["tokens"] == answer
    drift = max(
        abs(a - b)
        for a, b in zip(
            cold["choices"][0]["logprobs"]["token_logprobs"],
            cached["choices"][0]["logprobs"]["token_logprobs"],
        )
    )
    assert drift < 1e-4
    extended = complete(served, prompt + "".join(answer[:3]), max_tokens=5)
    assert extended["usage"]["prompt_tokens_details"]["cached_tokens"] == 600  # the end state
    assert extended["choices"][0]["logprobs"]["tokens"] == answer[3:]
    again = complete(served, prompt)
    assert again["choices"][0]["text"] == cold["choices"][0]["text"]


def test_metrics_counters_move(served):
    before = served.metrics()
    prompt = text_prompt(400, seed=4)
    complete(served, prompt, max_tokens=2)
    result = complete(served, prompt, max_tokens=3)
    after = served.metrics()
    cached = result["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == 256

    def delta(name: str) -> float:
        return after[name] - before[name]

    assert delta("vllm:prefix_cache_queries_total") == 800
    assert delta("vllm:prefix_cache_hits_total") == cached
    assert delta("vllm:prompt_tokens_total") == 800
    assert delta("vllm:generation_tokens_total") == 5
    assert after["vllm:spec_decode_num_drafts_total"] == 0
    state_bytes = 2 * 2 * 64 * 64 * 4
    assert delta("kdabench_local:state_cache_entries") == 2  # the 256 boundary, the end
    assert delta("kdabench_local:state_cache_used_bytes") == 2 * state_bytes
    assert after["kdabench_local:state_cache_capacity_bytes"] == 4 * 2**30 // state_bytes * \
        state_bytes
    entries = after["kdabench_local:state_cache_entries"]
    assert after["vllm:kv_cache_usage_perc"] == pytest.approx(entries / (4 * 2**30 // state_bytes))
    assert after["kdabench_local:state_cache_evictions_total"] == 0
    assert after["vllm:spec_decode_num_accepted_tokens_total"] == 0
    text = served.client.get("/metrics").text
    assert "# TYPE vllm:prefix_cache_hits_total counter" in text
    assert f'vllm:prefix_cache_queries_total{{model_name="{MODEL}"}}' in text


@pytest.mark.parametrize(
    ("export", "cached", "computed"),
    [("1", 4096, 4096), ("0", 0, 8192)],
    ids=["export_on", "export_off"],
)
def test_shared_4096_prefix_of_an_8192_prompt(export, cached, computed):
    """Acceptance 3: with export on, P2 resumes from the 4096 checkpoint; off, it recomputes."""
    served = Served({"KDABENCH_LOCAL_CHECKPOINT_EXPORT": export})
    try:
        first = text_prompt(8192, seed=5)
        second = first[:4096] + text_prompt(4096, seed=6)
        complete(served, first, max_tokens=1)
        # kept: 2048, 4096, 6144 (every 2048th of the 8192-token call) and 7168 (the last)
        assert served.last_request()["checkpoints_exported"] == (4 if export == "1" else 0)
        result = complete(served, second, max_tokens=1)
        assert result["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
        assert served.last_request() == {
            "prompt_tokens": 8192,
            "cached_tokens": cached,
            "computed_tokens": computed,
            "checkpoints_exported": 2 if export == "1" else 0,  # 6144 and 7168
        }
        assert served.lines()[0].endswith(
            f"checkpoint_export={'on' if export == '1' else 'off'} "
            "prefix_cache=on block_tokens=1024 device=cpu max_batched_tokens=8192 cache_gib=4 "
            "model=tiny backend=chunk cuda_graphs=off"
        )
    finally:
        served.close()


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/v1/completions", b"{not json", 400),
        ("POST", "/v1/completions", json.dumps({"prompt": "x" * 16385}).encode(), 400),
        ("POST", "/v1/completions", json.dumps({"prompt": ""}).encode(), 400),
        ("POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 0}).encode(), 400),
        ("POST", "/v1/completions", json.dumps({"prompt": [300]}).encode(), 400),
        ("POST", "/v1/chat/completions", json.dumps({"messages": []}).encode(), 400),
        ("POST", "/v1/nothing", b"{}", 404),
        ("GET", "/nothing", None, 404),
        ("GET", "/v1/completions", None, 405),
    ],
    ids=[
        "bad-json",
        "over-limit",
        "empty-prompt",
        "max-tokens-0",
        "token-id-300",
        "no-messages",
        "post-unknown",
        "get-unknown",
        "get-on-post-route",
    ],
)
def test_bad_requests(served, method, path, body, status):
    response = served.client.request(method, path, content=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["message"] and error["code"] == status
    assert served.client.get("/health").status_code == 200  # still serving


def test_stop_closes_the_port():
    served = Served({})
    url = served.server.url
    served.close()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=2)


def test_cli_serves_and_stops_on_sigterm():
    env = {**os.environ, "KDABENCH_LOCAL_CHECKPOINT_EXPORT": "0"}
    # the command module alone: the whole CLI's imports would only slow the test down
    script = (
        "from kdabench.cli.serve_local_cmd import serve_local; "
        "serve_local(['--port', '0'], prog_name='kdabench serve-local')"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        match = LISTENING.fullmatch(process.stderr.readline().rstrip("\n"))
        assert match and match.group(2) == "off"
        assert httpx.get(f"{match.group(1)}/health", timeout=10).json() == {"status": "ok"}
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_an_internal_failure_answers_500_and_keeps_serving(monkeypatch):
    served = Served({})
    try:

        def broken(*args, **kwargs):
            raise RuntimeError("prefill exploded")

        monkeypatch.setattr(served.server.engine, "prefill_prompt", broken)
        response = served.client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
        assert response.status_code == 500 and "exploded" in response.json()["error"]["message"]
        assert response.headers["connection"] == "close"  # the client must not reuse the socket
        assert served.lines()[-1] == "kdabench-local: error: RuntimeError: prefill exploded"
        monkeypatch.undo()
        assert complete(served, "hi", max_tokens=1)["usage"]["completion_tokens"] == 1
    finally:
        served.close()


def test_evictions_counted_when_the_cache_is_full():
    served = Served({"KDABENCH_LOCAL_BLOCK_TOKENS": "64", "KDABENCH_LOCAL_CACHE_GIB": str(
        3 * 2 * 2 * 64 * 64 * 4 / 2**30)})  # three states
    try:
        complete(served, text_prompt(300, seed=8), max_tokens=1)  # 256 and the end
        complete(served, text_prompt(300, seed=9), max_tokens=1)  # evicts one
        metrics = served.metrics()
        assert metrics["kdabench_local:state_cache_entries"] == 3
        assert metrics["kdabench_local:state_cache_evictions_total"] == 1
        assert metrics["vllm:kv_cache_usage_perc"] == 1.0
    finally:
        served.close()


def test_a_preset_that_does_not_fit_is_refused_before_loading(monkeypatch):
    from click.testing import CliRunner

    from kdabench.cli.serve_local_cmd import serve_local
    from kdabench.serve import runtime

    monkeypatch.setattr(runtime, "free_memory", lambda device: 2**30)
    monkeypatch.setattr(runtime, "KdaModel", None)  # loading would fail the test
    result = CliRunner().invoke(serve_local, ["--port", "0", "--model", "kimi-linear-tp1"])
    assert result.exit_code == 2
    message = result.output.strip()
    assert "\n" not in message and "'kimi-linear-tp1' does not fit cpu" in message
    assert "1.0 GiB is free" in message and "KDABENCH_LOCAL_CACHE_GIB" in message
