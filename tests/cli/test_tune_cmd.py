"""`kdabench tune` through click's CliRunner, with the fake runner of tests/tune standing in
for the CUDA one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from kdabench.kernels import load_profile, resolve_config
from kdabench.tune import parse_queries
from kdabench.tune import runner as tune_runner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tune"))
from cli_helpers import assert_one_line_error, invoke
from fake_runner import H200, TINY_QUERIES, FakeRunner


@pytest.fixture
def queries_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_QUERIES)
    return path


def use_runner(monkeypatch, **options) -> None:
    monkeypatch.setattr(tune_runner, "KernelRunner", lambda: FakeRunner(**options))


def test_exit_2_without_a_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = invoke("tune", "--out", tmp_path / "nvidia-h200.json")
    assert_one_line_error(result, 2, "error: kdabench tune needs a CUDA GPU")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("text, fragment", [
    ('schema = "kdabench.tune-queries.v1"\n', "no [[query]] entries"),
    (('schema = "kdabench.tune-queries.v1"\n[grid]\nwarps = [4]\n[[query]]\ntokens = 64\n'
      'heads = 1\n'), "[grid]: unknown key(s) warps"),
    ("[[query]\n", "TOML syntax error"),
], ids=["no-queries", "grid-field", "syntax"])
def test_bad_queries_file_exits_2(monkeypatch, tmp_path, text, fragment):
    use_runner(monkeypatch)
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert_one_line_error(invoke("tune", "--queries", path, "--out", tmp_path / "p.json"), 2,
                          str(path), fragment)
    assert not (tmp_path / "p.json").exists()


def test_missing_queries_file_and_bad_reps_exit_2(monkeypatch, tmp_path, queries_file):
    use_runner(monkeypatch)
    assert_one_line_error(invoke("tune", "--queries", tmp_path / "absent.toml"), 2,
                          "no such queries file")
    assert_one_line_error(invoke("tune", "--queries", queries_file, "--reps", "0", "--out",
                                 tmp_path / "p.json"), 2, "--reps must be >= 1")


def test_only_tunes_the_matching_queries_and_keeps_the_other_entries(monkeypatch, tmp_path,
                                                                     queries_file):
    use_runner(monkeypatch)
    out = tmp_path / "nvidia-h200.json"
    first = invoke("tune", "--queries", queries_file, "--out", out, "--only", "128x2x1-*",
                   "--json")
    assert first.exit_code == 0, first.output
    assert [q["id"] for q in json.loads(first.stdout)["queries"]] == [
        "128x2x1-C4-precomputed", "128x2x1-C1-precomputed"]
    second = invoke("tune", "--queries", queries_file, "--out", out, "--only", "*-C4-*",
                    "--only", "64x1x(2x32)-C1-*", "--json")
    assert second.exit_code == 0, second.output
    assert [q["id"] for q in json.loads(second.stdout)["queries"]] == [
        "64x1x(2x32)-C4-precomputed", "64x1x(2x32)-C1-precomputed", "128x2x1-C4-precomputed"]
    assert len(load_profile(out).document["entries"]) == 4


def test_an_only_pattern_matching_nothing_exits_2(monkeypatch, tmp_path, queries_file):
    use_runner(monkeypatch)
    assert_one_line_error(invoke("tune", "--queries", queries_file, "--out", tmp_path / "p.json",
                                 "--only", "4096x*"), 2,
                          "--only '4096x*' matches no query", "128x2x1-C4-precomputed")


def test_json_output_and_the_profile_it_writes(monkeypatch, tmp_path, queries_file):
    use_runner(monkeypatch)
    out = tmp_path / "profiles" / "nvidia-h200.json"
    monkeypatch.setattr(sys, "argv", ["/opt/venv/bin/kdabench", "tune", "--out", str(out)])
    result = invoke("tune", "--queries", queries_file, "--out", out, "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert found["ok"] and found["profile"] == str(out) and found["entries"] == 4
    assert found["status"] == "complete" and found["device"] == H200
    assert [q["id"] for q in found["queries"]] == [
        "64x1x(2x32)-C4-precomputed", "64x1x(2x32)-C1-precomputed",
        "128x2x1-C4-precomputed", "128x2x1-C1-precomputed"]
    profile = load_profile(out)
    # the command as a receipt records it: no machine's folders
    assert profile.document["tune"]["command_line"] == ["kdabench", "tune", "--out",
                                                        "nvidia-h200.json"]
    query = parse_queries(TINY_QUERIES).queries[2]
    resolved = resolve_config(query.caps("cpu"), device_name=H200, directory=out.parent)
    assert resolved.config.block_v == 64 and resolved.source.startswith("profile nvidia-h200")


def test_backends_option_times_cute_and_the_table_names_the_backend(monkeypatch, tmp_path,
                                                                    queries_file):
    use_runner(monkeypatch, cute_factor=0.5)
    out = tmp_path / "nvidia-h200.json"
    result = invoke("tune", "--queries", queries_file, "--out", out)
    assert result.exit_code == 0, result.output
    assert " cute " in result.stdout and load_profile(out).document["entries"][0]["backend"] \
        == "cute"
    result = invoke("tune", "--queries", queries_file, "--out", out, "--backends", "triton",
                    "--json")
    assert result.exit_code == 0, result.output
    assert {q["backend"] for q in json.loads(result.stdout)["queries"]} == {"triton"}
    assert_one_line_error(invoke("tune", "--queries", queries_file, "--out", out,
                                 "--backends", "cute"), 2, "--backends cute: give some of")


def test_default_out_is_the_profile_folder(monkeypatch, tmp_path, queries_file):
    use_runner(monkeypatch)
    monkeypatch.setenv("KDABENCH_PROFILE_DIR", str(tmp_path / "from-env"))
    result = invoke("tune", "--queries", queries_file)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "from-env" / "nvidia-h200.json").is_file()
    assert "64x1x(2x32)-C4-precomputed" in result.stdout and "block_v=64" in result.stdout
    assert "profile " in result.stdout and "4 entries · complete" in result.stdout


def test_a_query_without_an_entry_exits_1(monkeypatch, tmp_path, queries_file):
    use_runner(monkeypatch, broken={16, 32, 64})
    result = invoke("tune", "--queries", queries_file, "--out", tmp_path / "nvidia-h200.json")
    assert result.exit_code == 1, result.output
    assert "finding: 4 of 4 queries got no profile entry" in result.stderr
    assert (tmp_path / "nvidia-h200.json").is_file()


def test_a_note_for_a_misnamed_profile(monkeypatch, tmp_path, queries_file):
    use_runner(monkeypatch)
    result = invoke("tune", "--queries", queries_file, "--out", tmp_path / "mine.json")
    assert result.exit_code == 0, result.output
    assert "note: the catalog looks for nvidia-h200.json" in result.stderr


def test_help_documents_exit_codes():
    result = invoke("tune", "--help")
    assert result.exit_code == 0 and "Exit codes" in result.output
    for option in ("--queries", "--out", "--reps", "--json"):
        assert option in result.output
