"""`kdabench fuzz`: bad input exits 2 with one line; a run leaves a receipt that verifies and
that `kdabench report` reads; --replay of the corpus exits 0."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kdabench.cli.main import cli

CASES = Path(__file__).parent / "cases"


@pytest.mark.parametrize("args", [
    ["--backend", "nope"],
    ["--backend", "triton", "--backends", "triton,cute"],
    ["--count", "0"],
    ["--replay", "--corpus"],
])
def test_bad_input_exits_2(args, tmp_path):
    if args == ["--replay", "--corpus"]:
        args = ["--replay", str(CASES), "--corpus", str(tmp_path)]
    result = CliRunner().invoke(cli, ["fuzz", *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_replay_of_something_that_is_not_a_case_exits_2(tmp_path):
    bogus = tmp_path / "x.json"
    bogus.write_text('{"schema": "other"}')
    result = CliRunner().invoke(cli, ["fuzz", "--replay", str(bogus)])
    assert result.exit_code == 2 and "not a kdabench.fuzz.case.v1" in result.output


@pytest.mark.interpreter
def test_a_run_writes_a_receipt_that_verifies_and_reports(tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["fuzz", "--backends", "triton,cute", "--count", "12",
                                 "--seed", "5", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    triton, cute = doc["backends"]
    assert triton["sets"] == 12 and triton["verdict"] == "pass"
    assert cute["verdict"] == "skip"
    receipt = doc["receipt"]
    assert runner.invoke(cli, ["verify", receipt]).exit_code == 0
    report = runner.invoke(cli, ["report", receipt, "--out", str(tmp_path / "report")])
    assert report.exit_code == 0, report.output


@pytest.mark.interpreter
def test_replay_of_the_corpus_exits_0():
    result = CliRunner().invoke(cli, ["fuzz", "--replay", str(CASES / "valid.json")])
    assert result.exit_code == 0, result.output
    assert "passes" in result.output


@pytest.mark.interpreter
def test_a_worker_that_dies_is_shown_with_its_log_tail(tmp_path, monkeypatch):
    from kdabench.fuzz import parallel

    monkeypatch.setattr(parallel, "_command", lambda *args: [
        sys.executable, "-c", "import sys; print('out of memory', file=sys.stderr); sys.exit(3)"])
    result = CliRunner().invoke(cli, ["fuzz", "--count", "4", "--workers", "2",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "finding (no case file): worker: worker 0 exited with status 3" in result.output
    assert "    out of memory" in result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
