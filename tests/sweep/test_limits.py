"""What a sweep refuses before any request is sent: requests past a server's max_model_len,
an endpoint where nothing listens, arms that differ in server settings on one attached
server; and a server that accepts but never answers, waited for once."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kdabench.cli.main import cli
from kdabench.sweep.arms import load_arms, parse_arms
from kdabench.sweep.limits import check_attached_arms, check_context, context_needs
from kdabench.sweep.options import SweepError, SweepOptions
from kdabench.sweep.phases import PROBE_FILL_TOKENS
from kdabench.sweep.runner import Sweep
from kdabench.sweep.servers import EMBEDDED_MAX_MODEL_LEN

OPTIONS = SweepOptions(prompt_tokens=(1024, 4096), probe_tokens=8, shared_prefix_tokens=2048,
                       decode_prompt_tokens=128, decode_max_tokens=512)


def test_every_kind_of_request_is_counted_with_its_answer() -> None:
    assert context_needs(OPTIONS) == [
        ("--prompt-tokens", 4096, 4), ("--prompt-tokens", 1024, 4),
        ("probe prompt tokens", 1040, PROBE_FILL_TOKENS + 1 + 8),
        ("--shared-prefix", 2048, 4),
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


def test_the_gpu_sweep_sizes_fit_the_embedded_server() -> None:
    """Prompts of 65,536 tokens and the long shared-prefix case, with their answers."""
    options = SweepOptions(prompt_tokens=(8192, 32768, 65536))
    assert (65536, 57344) in options.shared_prefix_runs
    check_context(options, EMBEDDED_MAX_MODEL_LEN, "the embedded server")


def test_the_embedded_mode_is_refused_when_it_is_built() -> None:
    arms = load_arms("local")
    largest = EMBEDDED_MAX_MODEL_LEN - 4  # four answer tokens per sample
    Sweep(arms, SweepOptions(prompt_tokens=(1024, largest)), mode="embedded", out_dir="unused")
    with pytest.raises(SweepError, match=f"^--prompt-tokens {largest + 1}: .* the embedded "
                       f"server takes at most {EMBEDDED_MAX_MODEL_LEN} "):
        Sweep(arms, SweepOptions(prompt_tokens=(1024, largest + 1)), mode="embedded",
              out_dir="unused")
    with listener() as silent:  # an attached server's limit is read from it once it is up
        Sweep(parse_arms(ONE_ARM), SweepOptions(prompt_tokens=(100_000,)), mode="attach",
              endpoint=silent.url, out_dir="unused")


# ---------------------------------------------------------------------------- attached servers

ONE_ARM = 'schema = "kdabench.arms.v1"\n[[arms]]\nname = "only"\n'

SAME_SERVER = """
schema = "kdabench.arms.v1"
[sweep]
prompt_tokens = [64]
health_timeout_s = 1.0
[common]
env = { SHARED = "1" }
args = ["--common"]
[[arms]]
name = "expects-cache"
activation = ['prefix_cache=on']
[[arms]]
name = "expects-no-cache"
prefix_cache = false
log = "server.log"
"""


class Listener:
    """A loopback TCP listener that accepts, records what arrives and never answers."""

    def __init__(self) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen()
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self.received = b""
        self.connections = 0
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return
            self.connections += 1
            self._open.append(connection)
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: socket.socket) -> None:
        while True:
            try:
                data = connection.recv(65536)
            except OSError:
                return
            if not data:
                return
            self.received += data

    def close(self) -> None:
        self._socket.close()
        for connection in self._open:
            connection.close()


@contextlib.contextmanager
def listener() -> Iterator[Listener]:
    server = Listener()
    try:
        yield server
    finally:
        server.close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def serve_sweep(tmp_path: Path, *args: str) -> tuple[object, float]:
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["serve-sweep", "--out", str(tmp_path / "out"), *args],
                                prog_name="kdabench")
    return result, time.monotonic() - started


def test_an_endpoint_where_nothing_listens_exits_2_at_once(tmp_path: Path) -> None:
    url = closed_port_url()
    result, seconds = serve_sweep(tmp_path, "--endpoint", url)  # the packaged local arms
    assert result.exit_code == 2, result.output
    assert seconds < 5.0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert url in lines[0] and "connection refused" in lines[0] and "--launch" in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_default_arms_against_an_attached_server_exit_2_with_nothing_sent(
        tmp_path: Path) -> None:
    with listener() as server:
        result, seconds = serve_sweep(tmp_path, "--endpoint", server.url)
        time.sleep(0.2)  # anything sent would have arrived
        assert server.received == b""
    assert result.exit_code == 2, result.output
    assert seconds < 5.0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "arms no-cache, final-only, checkpoints differ in server settings" in lines[0]
    assert server.url in lines[0]
    for advice in ("--launch CMD", "endpoint = ...", "--schedule blocks --launch CMD"):
        assert advice in lines[0]
    assert not (tmp_path / "out").exists()


def test_arms_that_differ_only_client_side_may_share_an_endpoint() -> None:
    arms = parse_arms(SAME_SERVER)
    check_attached_arms(arms, "http://host:8000")
    differing = parse_arms(SAME_SERVER.replace('log = "server.log"', 'args = ["--other"]'))
    with pytest.raises(SweepError, match="arms expects-cache, expects-no-cache differ"):
        check_attached_arms(differing, "http://host:8000")
    own = SAME_SERVER.replace('log = "server.log"', 'args = ["--other"]\n'
                              'endpoint = "http://other:8000"')
    check_attached_arms(parse_arms(own), "http://host:8000")  # each arm on its own server


def test_a_server_that_accepts_but_never_answers_is_waited_for_once(tmp_path: Path) -> None:
    arms = tmp_path / "arms.toml"
    arms.write_text(SAME_SERVER)
    with listener() as server:
        result, _ = serve_sweep(tmp_path, "--arms", str(arms), "--endpoint", server.url)
        health_requests = server.received.count(b"GET /health")
    assert result.exit_code == 1, result.output
    assert health_requests == 1  # the two arms share one wait
    assert result.stderr.count("FAILED to start") == 1, result.stderr
    assert "expects-cache, expects-no-cache: FAILED to start" in result.stderr
    assert len(list((tmp_path / "out").glob("serve-sweep-*.json"))) == 1
