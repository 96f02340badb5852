"""`kdabench qualify` through click's CliRunner, on tiny matrices given with --matrix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_line_error, invoke

from kdabench.receipts import load_receipt, verify_file

TINY = """
schema = "kdabench.matrix.v1"
name = "tiny"
[layouts.R3]
lengths = [5, 16, 17]

[[group]]
scenario = "accuracy"
tiers = ["cpu"]
capacity = [1, 4]
heads = 1
layout = "R3"

[[group]]
scenario = "fault"
tiers = ["cpu"]
variant = ["slot-negative"]
heads = 1
layout = "R3"
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def test_list_prints_the_expanded_cases(tiny):
    result = invoke("qualify", "--tier", "cpu", "--matrix", tiny, "--list")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "   0  accuracy-C1-H1-K64-R3-unaligned-precomputed-lb5",
        "   1  accuracy-C4-H1-K64-R3-unaligned-precomputed-lb5",
        "   2  fault-slot-negative-C1-H1-K64-R3-unaligned-precomputed-lb5",
    ]
    assert "3 cases" in result.stderr


def test_list_json_with_shard_and_filter(tiny):
    result = invoke("qualify", "--tier", "cpu", "--matrix", tiny, "--list", "--json",
                    "--shard", "2/2", "--filter", "accuracy")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [
        {"index": 1, "id": "accuracy-C4-H1-K64-R3-unaligned-precomputed-lb5",
         "scenario": "accuracy"}]


def test_list_of_the_default_gpu_tier_needs_no_gpu():
    result = invoke("qualify", "--tier", "gpu", "--list", "--json")
    assert result.exit_code == 0, result.output
    cases = json.loads(result.stdout)
    assert len(cases) >= 150
    assert any(case["scenario"] == "graph" for case in cases)


@pytest.mark.parametrize(("text", "fragments"), [
    ("schema = 'kdabench.matrix.v1'\n[[group]\n", ["TOML syntax error", "line 2"]),
    (TINY.replace("heads = 1\nlayout", "head = 1\nlayout", 1), ["unknown axis 'head'"]),
    (TINY.replace('"fault"', '"faults"'), ["unknown scenario 'faults'"]),
    (TINY.replace("capacity = [1, 4]", "capacity = [1, 3]"), ["capacity = 3 is not one of"]),
])
def test_bad_matrix_files_exit_2_with_one_line(tmp_path, text, fragments):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = invoke("qualify", "--tier", "cpu", "--matrix", path, "--out", tmp_path)
    assert_one_line_error(result, 2, "error:", str(path), *fragments)
    assert not list(tmp_path.glob("qualify-*.json"))


@pytest.mark.parametrize(("args", "fragments"), [
    (["--shard", "3/2"], ["shard 3/2", "I must lie in 1..N"]),
    (["--shard", "x"], ["is not I/N"]),
    (["--filter", "no-such-case"], ["matches the filter 'no-such-case'"]),
    (["--backend", "cute"], ["backend 'cute' is not in the matrix's backends"]),
    (["--tier", "tpu"], ["Invalid value for '--tier'"]),
])
def test_bad_options_exit_2(tiny, tmp_path, args, fragments):
    result = invoke("qualify", "--tier", "cpu", "--matrix", tiny, "--out", tmp_path, *args)
    assert_one_line_error(result, 2, *fragments)


def test_cute_backend_on_the_cpu_tier_exits_2(tmp_path):
    result = invoke("qualify", "--tier", "cpu", "--backend", "cute", "--out", tmp_path)
    assert_one_line_error(result, 2, "cute backend runs on CUDA GPUs only", "--tier gpu")


def test_missing_matrix_file_exits_2(tmp_path):
    result = invoke("qualify", "--matrix", tmp_path / "nope.toml", "--list")
    assert_one_line_error(result, 2, "no such matrix file")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_gpu_tier_without_a_gpu_exits_2(tmp_path):
    result = invoke("qualify", "--tier", "gpu", "--out", tmp_path)
    assert_one_line_error(result, 2, "--tier gpu needs a CUDA GPU", "--tier cpu")


@pytest.mark.interpreter
def test_a_passing_run_prints_the_table_and_writes_the_receipt(tiny, tmp_path):
    out = tmp_path / "receipts"
    result = invoke("qualify", "--tier", "cpu", "--matrix", tiny, "--out", out)
    assert result.exit_code == 0, result.output
    (receipt,) = out.glob("qualify-*.json")
    assert verify_file(receipt).ok
    assert "accuracy" in result.stdout and "fault" in result.stdout
    assert "out err" in result.stdout and "state err" in result.stdout
    assert "all 3 cases pass" in result.stdout
    assert str(receipt) in result.stderr  # announced before the run starts
    doc = load_receipt(receipt)
    assert doc["command_line"][0].endswith("kdabench") or doc["command_line"]
    assert doc["summary"]["pass"] == 3


@pytest.mark.interpreter
def test_json_output(tiny, tmp_path):
    result = invoke("qualify", "--tier", "cpu", "--matrix", tiny, "--out", tmp_path, "--json",
                    "--filter", "fault")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["ok"] is True and summary["tier"] == "cpu" and summary["backend"] == "triton"
    assert summary["summary"]["total"] == 1 and summary["failures"] == []
    assert set(summary["scenarios"]) == {"fault"}
    assert Path(summary["receipt"]).is_file()


@pytest.mark.interpreter
def test_a_failing_case_exits_1(tmp_path):
    path = tmp_path / "strict.toml"
    path.write_text(TINY.replace('name = "tiny"', 'name = "tiny"\ntolerances = { output = 1e-6 }'))
    result = invoke("qualify", "--tier", "cpu", "--matrix", path, "--out", tmp_path)
    assert result.exit_code == 1, result.output
    assert "output error" in result.stdout and "exceeds tolerance 1.0e-06" in result.stdout
    assert result.stderr.strip().splitlines()[-1].startswith("finding: 2 of 3 cases did not pass")
    (receipt,) = tmp_path.glob("qualify-*.json")
    assert load_receipt(receipt)["summary"]["fail"] == 2


@pytest.mark.interpreter
def test_shards_through_the_cli_merge_into_the_whole(tiny, tmp_path):
    whole = invoke("qualify", "--tier", "cpu", "--matrix", tiny, "--out", tmp_path / "whole")
    assert whole.exit_code == 0, whole.output
    for shard in ("1/2", "2/2"):
        result = invoke("qualify", "--tier", "cpu", "--matrix", tiny, "--out",
                        tmp_path / "shards", "--shard", shard)
        assert result.exit_code == 0, result.output
    shards = sorted((tmp_path / "shards").glob("qualify-*.json"))
    assert [p.name.split("-shard")[1] for p in shards] == ["1of2.json", "2of2.json"]
    merged = tmp_path / "merged.json"
    result = invoke("merge", merged, *shards)
    assert result.exit_code == 0, result.output
    (single,) = (tmp_path / "whole").glob("qualify-*.json")

    def ids_and_verdicts(path):
        return [(c["id"], c["verdict"]) for c in load_receipt(path)["cases"]]

    assert ids_and_verdicts(merged) == ids_and_verdicts(single)


def test_help_documents_exit_codes():
    result = invoke("qualify", "--help")
    assert result.exit_code == 0
    for fragment in ("--tier", "--shard", "--matrix", "--filter", "--list", "Exit codes"):
        assert fragment in result.stdout
    assert "$KDABENCH_OUT" in result.stdout and ".kdabench/" in result.stdout
    assert "KDABENCH_RESULTS" not in result.stdout


def test_command_modules_load_without_the_heavy_libraries():
    """`kdabench --help` must stay fast: torch and friends load only when a command runs."""
    modules = ", ".join(f"kdabench.cli.{name}" for name in (
        "qualify_cmd", "bench_cmd", "serve_sweep_cmd", "serve_local_cmd", "merge_cmd", "tune_cmd"))
    heavy = "{'torch', 'triton', 'cutlass', 'numpy', 'scipy', 'pandas', 'matplotlib'}"
    code = (f"import sys, {modules}; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy}))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True)
    assert found.stdout.strip() == "[]", found.stdout
