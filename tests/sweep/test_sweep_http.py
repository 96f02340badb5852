"""`kdabench serve-sweep` over real loopback HTTP against a small fake OpenAI server
(sweep_fake_server.py): launched per arm as a subprocess, or attached to in a thread."""

from __future__ import annotations

import json
import re
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest
import sweep_fake_server as fake
from click.testing import CliRunner
from fake_arms import SWEEP, TWO_ARMS, run_sweep

from kdabench.cli.main import cli
from kdabench.receipts import verify_file
from kdabench.sweep.client import ServerClient, StreamCut, parse_prometheus
from kdabench.sweep.prompts import PromptFactory

FAKE_SCRIPT = Path(fake.__file__).resolve()
LAUNCH = f"{sys.executable} {FAKE_SCRIPT}"
SECRET = "sk-test-never-written-0123456789"

def one_arm(env: str = "", extra: str = "", prefix_cache: bool = True, **sweep: object) -> str:
    overrides = "".join(f"{key} = {value}\n" for key, value in sweep.items())
    text = SWEEP + overrides if not sweep else SWEEP.replace("[sweep]\n", "[sweep]\n" + overrides)
    if sweep:  # later keys would repeat: keep the first occurrence of each
        seen, lines = set(), []
        for line in text.splitlines():
            key = line.split("=")[0].strip()
            if "=" in line and key in seen:
                continue
            seen.add(key)
            lines.append(line)
        text = "\n".join(lines) + "\n"
    return text + f"""
[[arms]]
name = "only"
env = {{ {env} }}
prefix_cache = {str(prefix_cache).lower()}
{extra}
"""


def sweep(tmp_path: Path, arms_text: str, *args: str):
    result, receipts = run_sweep(tmp_path, arms_text, *args, env={"OPENAI_API_KEY": SECRET})
    assert len(receipts) == 1, result.output
    text = receipts[0].read_text()
    assert SECRET not in text
    return result, json.loads(text), receipts[0]


def cases_by_id(receipt: dict) -> dict[str, dict]:
    return {case["id"]: case for case in receipt["cases"]}


@pytest.fixture
def attached():
    servers = []

    def start(**flags: str):
        server, url, log = fake.start(flags)
        servers.append(server)
        return url, log

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def port_closed(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((host, int(port))) != 0


# ---------------------------------------------------------------------------- launch


def test_launch_two_arms_interleaved(tmp_path: Path) -> None:
    result, receipt, path = sweep(tmp_path, TWO_ARMS, "--launch", LAUNCH)
    assert result.exit_code == 0, result.output
    assert receipt["status"] == "complete" and receipt["kind"] == "serve-sweep"
    assert verify_file(path).ok
    cases = cases_by_id(receipt)
    assert set(cases) == {
        "server/cache-on", "probe/cache-on", "cold/cache-on/64", "cold/cache-on/128",
        "shared-prefix/cache-on/64", "decode/cache-on",
        "server/cache-off", "probe/cache-off", "cold/cache-off/64", "cold/cache-off/128",
        "shared-prefix/cache-off/64", "decode/cache-off"}
    assert all(case["verdict"] == "pass" for case in receipt["cases"]), result.output

    # what was served, and the launched processes are gone
    servers = receipt["config"]["servers"]
    assert servers["cache-on"]["version"] == {"version": "fake-1.0"}
    assert servers["cache-on"]["models"]["revision"] == "abc123"
    assert servers["cache-on"]["server"]["argv"][-2:] != ["--tag", "cache-arm"]  # port after
    for arm in ("cache-on", "cache-off"):
        assert port_closed(servers[arm]["server"]["url"])
        assert Path(servers[arm]["server"]["log"]).read_text().startswith("fake: listening")
    assert receipt["config"]["api_key"] == {"env": "OPENAI_API_KEY", "sent": True}

    # interleaved rounds: A B, then B A; warmups recorded, never counted
    cold = cases["cold/cache-on/64"]
    assert [s["round"] for s in cold["samples"]] == [0, 1]
    assert [s["position"] for s in cold["samples"]] == [0, 1]
    assert [s["position"] for s in cases["cold/cache-off/64"]["samples"]] == [1, 0]
    at = {arm: [s["at"] for s in cases[f"cold/{arm}/64"]["samples"]]
          for arm in ("cache-on", "cache-off")}
    assert at["cache-on"][0] < at["cache-off"][0] and at["cache-off"][1] < at["cache-on"][1]
    assert len(cold["warmups_ms"]) == 1 and cold["n"] == 2 and len(cold["samples_ms"]) == 2
    assert cold["median_ms"] == pytest.approx(sum(cold["samples_ms"]) / 2)
    assert cold["ci95_ms"][0] <= cold["median_ms"] <= cold["ci95_ms"][1]
    assert cold["prompt_tokens"] == 64
    assert cold["rate_tok_s"] == pytest.approx(64 / (cold["median_ms"] / 1000))
    assert all(s["cached_tokens"] == 0 and s["metrics_hits_delta"] == 0 for s in cold["samples"])

    # probes, activation, shared prefix, decode
    probe = cases["probe/cache-on"]
    assert probe["checks"]["cache_reused"] and probe["repeat_cached_tokens"] == 64 and probe["checks"]["extension_same_answer"]
    assert probe["drift"] == 0.0 and probe["extension_answer_tokens"] == 4
    assert cases["server/cache-on"]["activation"] == "passed"
    assert cases["shared-prefix/cache-on/64"]["p2_cached_tokens"] == [32]
    assert cases["shared-prefix/cache-off/64"]["p2_cached_tokens"] == [0]
    # the shared-prefix warmup pair (warmups = 1) is kept apart and never counted
    shared = cases["shared-prefix/cache-on/64"]
    assert len(shared["warmups"]) == 1 and len(shared["warmup_p2_ttft_ms"]) == 1
    assert shared["warmups"][0]["p2_cached_tokens"] == 32
    assert shared["warmups"][0]["p1_prompt_tokens"] == 64
    assert len(shared["samples"]) == 1 and len(shared["p2_ttft_ms"]) == 1
    assert shared["warmups"][0]["p2_ttft_ms"] not in shared["p2_ttft_ms"]
    assert cases["decode/cache-on"]["acceptance_length"] == pytest.approx(5 / 3)
    assert cases["decode/cache-off"]["acceptance_length"] == 1.0
    decode = cases["decode/cache-on"]
    assert decode["steps_per_s"] == pytest.approx(decode["tokens_per_s"] / (5 / 3))


def test_server_dies_mid_sweep(tmp_path: Path) -> None:
    # requests: 1-2 warmups (64, 128), 3-5 probes, 6-7 round one, 8 dies (round two, 64)
    text = one_arm('FAKE_DIE_AT = "8"')
    result, receipt, _ = sweep(tmp_path, text, "--launch", LAUNCH)
    assert result.exit_code == 1, result.output
    assert receipt["status"] == "partial"
    cases = cases_by_id(receipt)
    failure = cases["failure/only"]
    assert failure["verdict"] == "error" and "round 2" in failure["phase"]
    assert "exited with code 3" in failure["message"]
    assert cases["cold/only/64"]["n"] == 1 and cases["cold/only/128"]["n"] == 1
    assert cases["cold/only/64"]["verdict"] == "error"
    assert "probe/only" in cases and "decode/only" not in cases
    assert "a server failed" in result.stderr


# ---------------------------------------------------------------------------- attach


def test_attach_mode_activation_not_checked(tmp_path: Path, attached) -> None:
    url, _ = attached()
    text = one_arm(extra="activation = ['never printed']")
    result, receipt, _ = sweep(tmp_path, text, "--endpoint", url, "--prompt-tokens", "64")
    assert result.exit_code == 0, result.output
    cases = cases_by_id(receipt)
    assert cases["server/only"]["activation"] == "not checked"
    assert cases["cold/only/64"]["valid"] is True and cases["cold/only/64"]["n"] == 2
    assert receipt["config"]["mode"] == "attach"
    assert receipt["config"]["api_key"]["sent"] is True


def test_cached_samples_are_discarded_and_reported(tmp_path: Path, attached) -> None:
    # one size: 1 warmup, 3 probes, samples are requests 5, 6, 7
    url, _ = attached(FAKE_LIE_AT="5", FAKE_METRICS_LIE_AT="7")
    text = one_arm(samples=3)
    result, receipt, _ = sweep(tmp_path, text, "--endpoint", url, "--prompt-tokens", "64")
    assert result.exit_code == 1, result.output
    cold = cases_by_id(receipt)["cold/only/64"]
    assert cold["verdict"] == "fail" and cold["n"] == 1 and len(cold["samples_ms"]) == 1
    reasons = [r for d in cold["discarded"] for r in d["cached_reasons"]]
    assert any("usage reports 16 cached tokens" in r for r in reasons)
    assert any("/metrics prefix-cache hits rose by 16" in r for r in reasons)
    assert "discarded" in result.stderr


def test_failing_activation_marks_numbers_invalid(tmp_path: Path, attached) -> None:
    url, lines = attached()
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")  # the start line: prefix_cache=on, no export
    extra = f"activation = ['checkpoint_export=on']\nlog = '{log}'"
    result, receipt, _ = sweep(tmp_path, one_arm(extra=extra), "--endpoint", url,
                               "--prompt-tokens", "64")
    assert result.exit_code == 1, result.output
    cases = cases_by_id(receipt)
    server = cases["server/only"]
    assert server["verdict"] == "fail" and server["activation"] == "failed"
    assert server["activation_before"]["missing"] == ["checkpoint_export=on"]
    cold = cases["cold/only/64"]
    assert cold["valid"] is False and cold["verdict"] == "fail" and cold["n"] == 2
    assert "not activated" in cold["message"]
    assert cases["shared-prefix/only/64"]["valid"] is False
    assert cases["decode/only"]["verdict"] == "fail"


def test_logprob_drift_over_the_bound_fails_the_probe(tmp_path: Path, attached) -> None:
    url, _ = attached(FAKE_DRIFT="0.2")
    result, receipt, _ = sweep(tmp_path, one_arm(), "--endpoint", url, "--prompt-tokens", "64")
    assert result.exit_code == 1
    probe = cases_by_id(receipt)["probe/only"]
    assert probe["verdict"] == "fail" and probe["drift"] == pytest.approx(0.2)
    assert probe["checks"]["drift_within_bound"] is False
    assert probe["checks"]["repeat_same_answer"] is True


# ---------------------------------------------------------------------------- client


def test_ttft_waits_for_generated_text_not_the_role_chunk(attached) -> None:
    url, _ = attached(FAKE_ROLE_DELAY_S="0.3", FAKE_US_PER_TOKEN="0")
    with ServerClient(url) as client:
        client.resolve_model()
        completion = client.complete("x" * 32, max_tokens=2)
    assert completion.ttft_s >= 0.3
    assert completion.text and completion.prompt_tokens == 32 and completion.cached_tokens == 0


def test_prompts_have_exact_token_counts_and_unique_starts(attached) -> None:
    url, _ = attached()
    with ServerClient(url) as client:
        factory = PromptFactory(client.tokenize, seed=1)
        first, second = factory.unique(100), factory.unique(100)
    assert first.tokens == second.tokens == 100 and len(first.text) == 100
    assert first.text[:16] != second.text[:16]
    words = PromptFactory(lambda text: len(text.split()), seed=1)  # a word tokenizer
    assert words.unique(50).tokens == 50
    head = words.unique(10)
    extended = words.extend(head.text, 30)
    assert extended.text.startswith(head.text) and extended.tokens == 30


def test_parse_prometheus_sums_label_sets() -> None:
    text = ('# HELP x\nvllm:prefix_cache_hits_total{model_name="a"} 3.0\n'
            'vllm:prefix_cache_hits_total{model_name="b",engine="1"} 4\nplain 2 1700000000\n')
    assert parse_prometheus(text) == {"vllm:prefix_cache_hits_total": 7.0, "plain": 2.0}


def test_fake_server_speaks_sse(attached) -> None:
    url, _ = attached()
    body = {"model": "fake-model", "prompt": "abc", "max_tokens": 2, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"


# ---------------------------------------------------------------------------- embedded

EMBEDDED = """
schema = "kdabench.arms.v1"
name = "embedded-small"
[sweep]
prompt_tokens = [256, 2048]
samples = 1
warmups = 0
probe_tokens = 4
decode_window_s = 0.2
decode_prompt_tokens = 32
shared_prefix = [[1024, 512], [2048, 1536], [4096, 2048]]
baseline = "final-only"
[common]
env = { KDABENCH_LOCAL_PREFIX_CACHE = "1", KDABENCH_LOCAL_BLOCK_TOKENS = "256", \
        KDABENCH_LOCAL_MAX_BATCHED_TOKENS = "1024" }
[[arms]]
name = "final-only"
env = { KDABENCH_LOCAL_CHECKPOINT_EXPORT = "0" }
activation = ['checkpoint_export=off']
[[arms]]
name = "checkpoints"
env = { KDABENCH_LOCAL_CHECKPOINT_EXPORT = "1" }
activation = ['checkpoint_export=on']
activation_after = ['checkpoints_exported=[1-9]']
"""


def test_embedded_server_shared_prefix_reuses_checkpoints(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("kdabench.serve")
    # the sweep's own environment reaches the embedded server under the arms' settings
    monkeypatch.setenv("KDABENCH_LOCAL_CACHE_GIB", "0.5")
    monkeypatch.setenv("KDABENCH_LOCAL_MAX_BATCHED_TOKENS", "2048")
    result, receipt, _ = sweep(tmp_path, EMBEDDED)
    assert result.exit_code == 0, result.output
    assert receipt["config"]["mode"] == "embedded"
    cases = cases_by_id(receipt)
    assert cases["server/checkpoints"]["activation"] == "passed"
    # calls of 1024 tokens keep every block boundary: P2 resumes where its prefix ends
    assert cases["shared-prefix/checkpoints/1024"]["p2_cached_tokens"] == [512]
    assert cases["shared-prefix/checkpoints/2048"]["p2_cached_tokens"] == [1536]
    assert cases["shared-prefix/final-only/2048"]["p2_cached_tokens"] == [0]
    assert cases["shared-prefix/final-only/2048"]["shared_tokens"] == 1536
    assert "shared-prefix/checkpoints/4096" not in cases
    # the server's account of each TTFT is kept with the sample: a resumed P2 computes less
    pair = cases["shared-prefix/checkpoints/2048"]["samples"][0]
    assert set(pair["p2_server_timing"]) == {"ttft_ms", "wait_ms", "lookup_ms", "compute_ms",
                                             "commit_ms", "first_token_ms",
                                             "compute_enqueue_ms", "gc_ms", "gc_collections"}
    assert pair["p2_server_timing"]["compute_ms"] < pair["p1_server_timing"]["compute_ms"]
    cold = cases["cold/checkpoints/2048"]["samples"][0]
    assert cold["server_timing"]["ttft_ms"] <= cold["ttft_ms"]
    assert receipt["config"]["shared_prefix_skipped"] == [{
        "total_tokens": 4096, "shared_tokens": 2048,
        "reason": "4096 tokens is longer than the largest prompt size, 2048"}]
    assert "shared prefix 4096:2048 skipped" in result.output
    runs_on = receipt["config"]["servers"]["checkpoints"]["runs_on"]
    assert runs_on["status"] == "reported" and runs_on["backend"] == "chunk"
    assert runs_on["model"] == "tiny" and runs_on["retention"]["max_batched_tokens"] == 1024
    assert runs_on["retention"]["cache_gib"] == 0.5
    assert runs_on["torch"] and runs_on["device"] == receipt["device"]["name"]
    # one line for both arms: their servers run on the same device, backend and model
    assert f"runs on: {runs_on['device']} · backend chunk · model tiny · torch " in result.output
    assert "(final-only, checkpoints)" in result.output
    # what checkpoints buy, read against final-only
    assert receipt["config"]["options"]["baseline"] == "final-only"
    assert "against final-only (arm median / baseline median" in result.output
    assert "P2 of 2048 sharing 1536" in result.output


# ---------------------------------------------------------------------------- context limit


def test_prompts_past_the_embedded_servers_limit_exit_2_before_any_server(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["serve-sweep", "--prompt-tokens", "200000", "--out",
                                      str(out)], prog_name="kdabench")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "--prompt-tokens 200000" in lines[0] and "at most 131072" in lines[0]
    assert "max_model_len" in lines[0] and "give at most 131068" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("where", ["models", "tokenize"])
def test_prompts_past_a_servers_max_model_len_exit_2_unsent(tmp_path: Path, attached,
                                                             where: str) -> None:
    url, lines = attached(FAKE_MAX_MODEL_LEN="100", FAKE_LIMIT_IN=where)
    arms = tmp_path / "arms.toml"
    arms.write_text(one_arm())
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["serve-sweep", "--arms", str(arms), "--endpoint", url,
                                      "--prompt-tokens", "64,128", "--out", str(out)],
                                prog_name="kdabench")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    header, error = result.stderr.strip().splitlines()  # no table: nothing was measured
    assert header.startswith("serve-sweep · 1 arms") and error.startswith(
        "error: --prompt-tokens 128: a request would need 132 tokens"), result.stderr
    assert "at most 100 (its max_model_len)" in error and "give at most 96" in error
    assert not list(out.glob("serve-sweep-*.json"))
    assert not [line for line in lines if "prompt_tokens=" in line]  # no completion sent


def test_prompts_within_max_model_len_run_and_record_it(tmp_path: Path, attached) -> None:
    url, _ = attached(FAKE_MAX_MODEL_LEN="1056", FAKE_LIMIT_IN="tokenize")  # decode: 32 + 1024
    result, receipt, _ = sweep(tmp_path, one_arm(), "--endpoint", url, "--prompt-tokens", "64")
    assert result.exit_code == 0, result.output
    assert receipt["config"]["servers"]["only"]["max_model_len"] == 1056


def test_without_out_the_receipt_goes_to_the_working_folder(tmp_path: Path, attached,
                                                            monkeypatch) -> None:
    url, _ = attached()
    arms = tmp_path / "arms.toml"
    arms.write_text(one_arm())
    monkeypatch.delenv("KDABENCH_OUT", raising=False)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["serve-sweep", "--arms", str(arms), "--endpoint", url,
                                      "--prompt-tokens", "64"], prog_name="kdabench")
    assert result.exit_code == 0, result.output
    receipts = list((tmp_path / ".kdabench").glob("serve-sweep-*.json"))
    assert len(receipts) == 1 and verify_file(receipts[0]).ok


# ---------------------------------------------------------------------------- streams and cache evidence

PLAIN = {"FAKE_DONE": "0", "FAKE_CACHED_DETAILS": "0", "FAKE_METRICS": "0", "FAKE_STRICT": "1"}
"""A plain third-party server: no [DONE], usage in a chunk of its own and without
prompt_tokens_details, no /metrics, 422 for any non-standard request field."""


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("done", ["1", "0"])
@pytest.mark.parametrize("usage_in", ["own", "last"])
def test_streams_end_with_or_without_done_and_usage_anywhere(attached, api: str, done: str,
                                                             usage_in: str) -> None:
    url, log = attached(FAKE_DONE=done, FAKE_USAGE_IN=usage_in, FAKE_STRICT="1")
    with ServerClient(url, api=api) as client:
        client.resolve_model()
        first = client.complete("x" * 32, max_tokens=4, logprobs=False)
        second = client.complete("y" * 32, max_tokens=4, logprobs=False)  # connection reusable
    for completion in (first, second):
        assert len(completion.text) == 4 and completion.finish_reason == "length"
        assert completion.prompt_tokens == 32 and completion.completion_tokens == 4
        assert completion.cached_tokens == 0 and completion.token_logprobs == []
    assert not [line for line in log if "refused" in line]  # only standard fields were sent


def test_chat_ttft_waits_for_content_and_reads_chat_logprobs(attached) -> None:
    url, _ = attached(FAKE_ROLE_DELAY_S="0.3", FAKE_US_PER_TOKEN="0")
    with ServerClient(url, api="chat") as client:
        client.resolve_model()
        completion = client.complete("x" * 32, max_tokens=3, logprobs=True)
    assert completion.ttft_s >= 0.3 and completion.content_chunks == 3
    assert completion.tokens == list(completion.text) and len(completion.token_logprobs) == 3


def test_a_refused_stream_options_is_retried_once_without(attached) -> None:
    url, log = attached(FAKE_NO_STREAM_OPTIONS="1")
    with ServerClient(url) as client:
        client.resolve_model()
        first = client.complete("x" * 32, max_tokens=2)
        second = client.complete("y" * 32, max_tokens=2)
    assert first.text and second.text and not client.stream_usage
    assert first.prompt_tokens is None and first.cached_tokens is None  # no usage: unknown
    assert len([line for line in log if "refused (422)" in line]) == 1


def test_chunks_of_several_tokens_are_counted_from_usage(attached) -> None:
    url, _ = attached(FAKE_CHUNK_TOKENS="3", FAKE_LOGPROBS="0")
    with ServerClient(url) as client:
        client.resolve_model()
        completion = client.complete("x" * 32, max_tokens=9)
        window = client.decode_window("y" * 32, window_s=5.0, max_tokens=9)
    assert completion.content_chunks == 3 and completion.completion_tokens == 9
    assert window.ended_early and window.counted_by == "usage" and window.tokens == 6


CUTS = [("drop", "connection was lost mid-stream"),
        ("mid-event", "the body ended inside an event"),
        ("no-finish", "ended with no finish_reason, usage or [DONE]")]


@pytest.mark.parametrize(("how", "reason"), CUTS)
def test_a_stream_cut_short_raises_stream_cut(attached, how: str, reason: str) -> None:
    url, _ = attached(FAKE_CUT_AT="1", FAKE_CUT=how)
    with ServerClient(url) as client:
        client.resolve_model()
        with pytest.raises(StreamCut, match=re.escape(reason)):
            client.complete("x" * 32, max_tokens=4)
        assert client.complete("x" * 32, max_tokens=4).text  # the server still answers


@pytest.mark.parametrize(("how", "reason"), CUTS)
def test_a_cut_stream_is_a_failed_sample_with_its_reason(tmp_path: Path, attached, how: str,
                                                         reason: str) -> None:
    url, _ = attached(FAKE_CUT_AT="5", FAKE_CUT=how)  # 1 warmup, 3 probes, samples 5 and 6
    result, receipt, _ = sweep(tmp_path, one_arm(), "--endpoint", url, "--prompt-tokens", "64")
    assert result.exit_code == 1, result.output
    cases = cases_by_id(receipt)
    cold = cases["cold/only/64"]
    assert cold["verdict"] == "fail" and cold["n"] == 1
    (failed,) = cold["failed_samples"]
    assert failed["round"] == 0 and reason in failed["failure"]
    assert "streams cut short" in cold["message"] and failed["failure"] in cold["message"]
    assert "failure/only" not in cases and cases["decode/only"]["verdict"] == "pass"


def test_a_stalled_server_hits_the_request_timeout_once(tmp_path: Path, attached) -> None:
    url, _ = attached(FAKE_STALL_AT="5")
    start = time.monotonic()
    result, receipt, _ = sweep(tmp_path, one_arm(request_timeout_s=1.0), "--endpoint", url,
                               "--prompt-tokens", "64")
    assert time.monotonic() - start < 15  # one timeout, not one per request
    assert result.exit_code == 1, result.output
    failure = cases_by_id(receipt)["failure/only"]
    assert "request timeout (1 s)" in failure["message"] and "round 1" in failure["phase"]


def test_a_plain_server_leaves_its_arm_unverified_and_exits_0(tmp_path: Path,
                                                              attached) -> None:
    url, log = attached(**PLAIN)
    result, receipt, path = sweep(tmp_path, one_arm(), "--endpoint", url,
                                  "--prompt-tokens", "64")
    assert result.exit_code == 0, result.output
    assert verify_file(path).ok and receipt["status"] == "complete"
    assert not [line for line in log if "refused" in line]
    # its /version names no device: recorded as unknown, not a failure
    assert receipt["config"]["servers"]["only"]["runs_on"] == {"status": "unknown"}
    cases = cases_by_id(receipt)
    cold = cases["cold/only/64"]
    assert cold["verdict"] == "skip" and cold["status"] == "unverified" and cold["n"] == 2
    assert "cold by construction (unique from the first token), not verified by the server" \
        in cold["message"]
    assert {s["cache_evidence"] for s in cold["samples"]} == {"unknown"}
    assert cold["cache_evidence"] == {"verified-cold": 0, "verified-cached": 0, "unknown": 2}
    probe = cases["probe/only"]
    assert probe["verdict"] == "skip" and probe["status"] == "unverified"
    assert probe["checks"]["cold_uncached"] == "unverifiable"
    assert probe["checks"]["cache_reused"] == "unverifiable"
    assert probe["checks"]["repeat_same_answer"] is True
    assert cases["shared-prefix/only/64"]["message"] == "P2 cached tokens not reported by the server"
    assert {c["verdict"] for c in receipt["cases"]} == {"pass", "skip"}
    # the summary table and the last line say it in words
    assert "unverified" in result.stdout and "cold/only/64" in result.stdout
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("nothing failed; 1 arm(s) unverified (only)"), last


def test_unverified_arms_are_named_when_another_case_fails(tmp_path: Path, attached) -> None:
    url, _ = attached(**PLAIN, FAKE_CUT_AT="5")
    result, _, _ = sweep(tmp_path, one_arm(), "--endpoint", url, "--prompt-tokens", "64")
    assert result.exit_code == 1, result.output
    assert "1 case(s) did not pass: cold/only/64; 1 arm(s) unverified" in result.stderr


def test_metrics_alone_verify_cold_samples_and_catch_a_hit(tmp_path: Path, attached) -> None:
    # no cached-token count in usage; /metrics: samples are requests 5, 6, 7; 7 shows a hit
    url, _ = attached(FAKE_CACHED_DETAILS="0", FAKE_METRICS_LIE_AT="7")
    result, receipt, _ = sweep(tmp_path, one_arm(samples=3), "--endpoint", url,
                               "--prompt-tokens", "64")
    assert result.exit_code == 1, result.output
    cold = cases_by_id(receipt)["cold/only/64"]
    assert cold["verdict"] == "fail" and cold["n"] == 2
    assert {s["cache_evidence"] for s in cold["samples"]} == {"verified-cold"}
    assert all(s["cached_tokens"] is None and s["metrics_hits_delta"] == 0
               for s in cold["samples"])
    (discarded,) = cold["discarded"]
    assert discarded["cache_evidence"] == "verified-cached"
    assert discarded["cached_reasons"] == ["/metrics prefix-cache hits rose by 16 tokens"]


def test_no_cache_probe_with_unknown_evidence_is_unverifiable(tmp_path: Path,
                                                              attached) -> None:
    url, _ = attached(**PLAIN, FAKE_PREFIX_CACHE="0")
    result, receipt, _ = sweep(tmp_path, one_arm(prefix_cache=False), "--endpoint", url,
                               "--prompt-tokens", "64")
    assert result.exit_code == 0, result.output
    probe = cases_by_id(receipt)["probe/only"]
    assert probe["checks"]["cache_unused"] == "unverifiable"
    assert probe["verdict"] == "skip" and probe["status"] == "unverified"
    assert "unverifiable: cold_uncached, cache_unused" in probe["message"]


def test_no_cache_arm_with_a_verified_hit_fails_its_probe(tmp_path: Path, attached) -> None:
    url, _ = attached(FAKE_PREFIX_CACHE="1", FAKE_CACHED_DETAILS="0")  # /metrics shows hits
    result, receipt, _ = sweep(tmp_path, one_arm(prefix_cache=False), "--endpoint", url,
                               "--prompt-tokens", "64")
    assert result.exit_code == 1, result.output
    probe = cases_by_id(receipt)["probe/only"]
    assert probe["checks"]["cache_unused"] is False and probe["checks"]["cold_uncached"] is True
    assert probe["verdict"] == "fail" and probe["message"] == "failed: cache_unused"
    assert cases_by_id(receipt)["cold/only/64"]["verdict"] == "pass"


def test_a_chat_sweep_passes_against_a_verifying_server(tmp_path: Path, attached) -> None:
    url, _ = attached(FAKE_STRICT="1")
    result, receipt, _ = sweep(tmp_path, one_arm(), "--endpoint", url, "--prompt-tokens", "64",
                               "--api", "chat")
    assert result.exit_code == 0, result.output
    assert receipt["config"]["options"]["api"] == "chat"
    assert all(case["verdict"] == "pass" for case in receipt["cases"]), result.output
    probe = cases_by_id(receipt)["probe/only"]
    assert probe["checks"]["extension_same_answer"] is None  # a chat goes on as a next turn
    assert probe["checks"]["cache_reused"] is True and probe["extension_cached_tokens"] >= 80
    assert result.stdout.strip().splitlines()[-1] == "all probes and checks pass"


def test_an_unknown_api_is_bad_input(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["serve-sweep", "--api", "responses", "--out",
                                      str(tmp_path)], prog_name="kdabench")
    assert result.exit_code == 2 and "'responses' is not one of" in result.output
