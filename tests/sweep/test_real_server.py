"""`kdabench serve-sweep` against a real third-party OpenAI-compatible server: `transformers
serve` over a tiny random model (real_server.py), attached to and launched per arm.

That server streams without ``data: [DONE]``, reports usage only as a last chunk with no
``prompt_tokens_details`` (so no cached-token count), serves no ``/tokenize`` and no
``/metrics``, and ignores ``logprobs``. A sweep of it can count prompt tokens only with
``--tokenizer`` or by calibrating against the usage, and cannot verify that a sample was
cold: its cold cases are ``unverified``, never passed.

The sweep runs as a subprocess of the environment's `kdabench` script, so exit codes, stderr
and wall times are the ones a user sees. Skipped where the ``transformers[serving]`` extra
is not installed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import real_server

from kdabench.receipts import verify_file

real_server.require_serving()

KDABENCH = Path(sys.executable).parent / "kdabench"
PROMPT_SIZES = (512, 1024)
SAMPLES = 2
TOLERANCE = 0.01  # a sample's prompt, as the server's usage counts it, within 1% of the ask
FAIL_FAST_S = 5.0
SWEEP_TIMEOUT_S = 120  # a bound on any one sweep subprocess; each takes seconds

SWEEP = f"""\
schema = "kdabench.arms.v1"
name = "transformers-serve"
description = "transformers serve over a tiny random Llama"

[sweep]
samples = {SAMPLES}
warmups = 1
probe_tokens = 8
decode_window_s = 0.2
decode_prompt_tokens = 32
decode_max_tokens = 32
shared_prefix_tokens = 64
shared_prefix_repeats = 1
health_timeout_s = 60.0
request_timeout_s = 60.0
"""

# Attach mode: one arm and nothing for the server to apply (no env, no args).
ATTACH_ARMS = SWEEP + """
[[arms]]
name = "as-served"
description = "transformers serve as it was started"
prefix_cache = false
"""


def launch_arms(home: Path, names: tuple[str, ...]) -> str:
    """Arms that launch `transformers serve`, differing only in a variable it ignores."""
    env = ", ".join(f"{key} = {json.dumps(value)}"
                    for key, value in real_server.server_env(home).items())
    text = SWEEP + f"\n[common]\nenv = {{ {env} }}\n"
    for name in names:
        text += f"""
[[arms]]
name = "{name}"
env = {{ KDABENCH_TEST_ARM = "{name}" }}
prefix_cache = false
activation = ['Uvicorn running on http://127\\.0\\.0\\.1:']
activation_after = ['"POST /v1/completions HTTP/1\\.1" 200']
"""
    return text


@dataclass
class Run:
    """One `kdabench serve-sweep` subprocess: its exit code, output, time and receipt."""

    code: int
    stdout: str
    stderr: str
    seconds: float
    receipt: dict[str, Any] | None
    receipt_path: Path | None

    def cases(self) -> dict[str, dict[str, Any]]:
        assert self.receipt is not None, self.stderr
        return {case["id"]: case for case in self.receipt["cases"]}


def serve_sweep(tmp_path: Path, arms_text: str | None, *args: str,
                timeout_s: float = SWEEP_TIMEOUT_S) -> Run:
    """Run `kdabench serve-sweep` with ``--arms`` (a file of ``arms_text``, else the
    default arms) and ``--out`` under ``tmp_path``; returns what it left."""
    out = tmp_path / "out"
    command = [str(KDABENCH), "serve-sweep", "--out", str(out)]
    if arms_text is not None:
        arms = tmp_path / "arms.toml"
        arms.write_text(arms_text, encoding="utf-8")
        command += ["--arms", str(arms)]
    env = {**os.environ, **real_server.server_env(tmp_path / "hf-home")}
    env.pop("OPENAI_API_KEY", None)
    start = time.monotonic()
    try:
        done = subprocess.run([*command, *args], capture_output=True, text=True, env=env,
                              stdin=subprocess.DEVNULL, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as error:
        printed = error.stderr.decode(errors="replace") if error.stderr else ""
        pytest.fail(f"serve-sweep ran past {timeout_s:g} s and was killed: {printed[-2000:]}")
    seconds = time.monotonic() - start
    receipts = sorted(out.glob("serve-sweep-*.json"))
    assert len(receipts) <= 1, receipts
    path = receipts[0] if receipts else None
    receipt = json.loads(path.read_text(encoding="utf-8")) if path else None
    return Run(done.returncode, done.stdout, done.stderr, seconds, receipt, path)


def sweep_log(run: Run) -> str:
    """What a sweep printed, for assertion messages."""
    return f"exit {run.code} after {run.seconds:.1f} s\n{run.stderr[-4000:]}"


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random model and its tokenizer, built once, offline."""
    return real_server.build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@dataclass
class Served:
    """A `transformers serve` the tests attach to: its URL, model folder and log."""

    url: str
    model: Path
    log: Path

    def log_size(self) -> int:
        return len(self.log.read_bytes())

    def log_since(self, offset: int) -> str:
        return self.log.read_bytes()[offset:].decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One `transformers serve` of the tiny model for the module's attach tests."""
    log = tmp_path_factory.mktemp("transformers-serve") / "server.log"
    with real_server.running_server(tiny_model, log) as url:
        yield Served(url=url, model=tiny_model, log=log)


# ---------------------------------------------------------------------------- checks


def assert_prompts_sized(run: Run, arm: str, samples_per_size: int = SAMPLES) -> None:
    """Every cold sample's prompt, as the server's usage counts it, is within 1% of the
    size asked for; each size has its samples."""
    cases = run.cases()
    for size in PROMPT_SIZES:
        cold = cases[f"cold/{arm}/{size}"]
        samples = cold["samples"] + cold["discarded"]
        assert len(samples) == samples_per_size, sweep_log(run)
        counts = [sample["prompt_tokens"] for sample in samples]
        assert all(isinstance(n, int) and abs(n - size) <= TOLERANCE * size for n in counts), \
            f"{size}-token prompts counted {counts} by the server"


def assert_cold_unverified(run: Run, arms: tuple[str, ...],
                           samples_per_size: int = SAMPLES) -> None:
    """No cached-token evidence: every cold case is unverified (verdict "skip", status
    "unverified"), never passed, and nothing failed."""
    cases = run.cases()
    for arm in arms:
        for size in PROMPT_SIZES:
            cold = cases[f"cold/{arm}/{size}"]
            assert (cold["verdict"], cold.get("status")) == ("skip", "unverified"), \
                (cold["verdict"], cold["message"])
            assert [sample["cache_evidence"] for sample in cold["samples"]] == \
                ["unknown"] * samples_per_size
            assert cold["cache_evidence"] == {"verified-cold": 0, "verified-cached": 0,
                                              "unknown": samples_per_size}
    assert run.receipt is not None
    assert run.receipt["summary"]["skip"] >= len(arms) * len(PROMPT_SIZES)
    bad = [(case["id"], case["verdict"], case.get("message")) for case in run.receipt["cases"]
           if case["verdict"] in ("fail", "error")]
    assert not bad, bad


def assert_sealed(run: Run) -> None:
    """The sweep exited 0 with a complete receipt that verifies."""
    assert run.code == 0, sweep_log(run)
    assert run.receipt is not None and run.receipt_path is not None
    assert run.receipt["status"] == "complete"
    assert verify_file(run.receipt_path).ok


def closed(url: str) -> bool:
    """Nothing listens at ``url`` any more."""
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((host, int(port))) != 0


# ---------------------------------------------------------------------------- attach


@pytest.mark.parametrize("counting", ["tokenizer", "calibration"])
def test_attach_counts_prompts_and_marks_cold_samples_unverified(
        tmp_path: Path, served: Served, counting: str) -> None:
    tokenizer = ["--tokenizer", str(served.model)] if counting == "tokenizer" else []
    sizes = ",".join(map(str, PROMPT_SIZES))
    run = serve_sweep(tmp_path, ATTACH_ARMS, "--endpoint", served.url, "--prompt-tokens", sizes,
                      "--json", *tokenizer)
    assert_sealed(run)
    assert run.receipt is not None
    assert run.receipt["config"]["mode"] == "attach"
    server = run.receipt["config"]["servers"]["as-served"]
    assert server["models"]["id"] == str(served.model)
    source = server["token_counts"]["source"]  # where the prompts' token counts came from
    assert source.startswith("tokenizer ") if tokenizer else source == "server usage (calibrated)"
    assert_prompts_sized(run, "as-served")
    assert_cold_unverified(run, ("as-served",))
    printed = json.loads(run.stdout)
    assert printed["ok"] is True and printed["summary"] == run.receipt["summary"]


def test_default_arms_refused_against_an_attached_server(tmp_path: Path,
                                                         served: Served) -> None:
    before = served.log_size()
    run = serve_sweep(tmp_path, None, "--endpoint", served.url, timeout_s=20)
    assert run.code == 2, sweep_log(run)
    assert run.seconds < FAIL_FAST_S, sweep_log(run)
    assert run.receipt is None
    time.sleep(0.2)  # a request would be in the server's access log by now
    # refused from the arguments alone: not even /health was asked
    assert '"GET ' not in served.log_since(before) and '"POST ' not in served.log_since(before)


def test_nothing_listening_fails_fast_naming_the_url(tmp_path: Path) -> None:
    port = real_server.free_port()
    url = f"http://127.0.0.1:{port}"
    run = serve_sweep(tmp_path, ATTACH_ARMS, "--endpoint", url, "--prompt-tokens", "512",
                      timeout_s=20)
    assert run.code == 2, sweep_log(run)
    assert run.seconds < FAIL_FAST_S, sweep_log(run)
    naming = [line for line in run.stderr.splitlines() if url in line]
    assert len(naming) == 1 and naming[0].startswith("error"), run.stderr


# ---------------------------------------------------------------------------- launch


def test_launch_two_arms(tmp_path: Path, tiny_model: Path) -> None:
    arms = ("a", "b")
    run = serve_sweep(tmp_path, launch_arms(tmp_path / "hf-home", arms), "--launch",
                      real_server.launch_command(tiny_model), "--prompt-tokens",
                      ",".join(map(str, PROMPT_SIZES)))
    assert_sealed(run)
    assert run.receipt is not None
    servers = run.receipt["config"]["servers"]
    for arm in arms:
        server = servers[arm]["server"]
        assert server["mode"] == "launch" and closed(server["url"])
        assert "Uvicorn running on" in Path(server["log"]).read_text(encoding="utf-8")
        assert run.cases()[f"server/{arm}"]["activation"] == "passed"
        assert_prompts_sized(run, arm)
    assert_cold_unverified(run, arms)
    unverified = sum(case.get("status") == "unverified" for case in run.receipt["cases"])
    summary = [line for line in run.stdout.splitlines() if line.startswith("receipt ")]
    assert summary and f"{unverified} unverified" in summary[-1], run.stdout
    cold = run.cases()["cold/b/512"]  # interleaved rounds: A B, then B A
    assert [sample["position"] for sample in cold["samples"] + cold["discarded"]] == [1, 0]


def test_blocks_schedule_starts_a_server_per_block(tmp_path: Path, tiny_model: Path) -> None:
    arms = ("a", "b")
    run = serve_sweep(tmp_path, launch_arms(tmp_path / "hf-home", arms), "--launch",
                      real_server.launch_command(tiny_model), "--prompt-tokens",
                      ",".join(map(str, PROMPT_SIZES)), "--schedule", "blocks",
                      "--tokenizer", str(tiny_model))
    assert_sealed(run)
    assert run.receipt is not None
    config = run.receipt["config"]
    assert config["schedule"] == "blocks"
    blocks = config["blocks"]  # one record per block, in the order run
    assert [block["arm"] for block in blocks] == ["a", "b", "b", "a"]
    assert [block["block"] for block in blocks] == [0, 1, 2, 3]
    for block, after in pairwise(blocks):  # one server at a time
        assert block["started_at"] < block["healthy_at"] < block["stopped_at"] \
            <= after["started_at"]
    logs = [Path(block["server"]["log"]) for block in blocks]
    assert len(set(logs)) == 4 and len({block["server"]["pid"] for block in blocks}) == 4
    for log in logs:  # each block's own server: started, served, stopped
        text = log.read_text(encoding="utf-8")
        assert text.count("Uvicorn running on") == 1 and "Finished server process" in text
        assert '"POST /v1/completions HTTP/1.1" 200' in text
    assert all(closed(block["server"]["url"]) for block in blocks)
    cases = run.cases()
    for arm, own in (("a", [0, 3]), ("b", [1, 2])):
        assert_prompts_sized(run, arm, samples_per_size=2 * SAMPLES)
        assert sorted({sample["block"] for sample in cases[f"cold/{arm}/512"]["samples"]}) == own
    assert_cold_unverified(run, arms, samples_per_size=2 * SAMPLES)
