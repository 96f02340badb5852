"""`kdabench report` through click's CliRunner: files written, printed paths, exit codes."""

from __future__ import annotations

import io
import json
import statistics
from pathlib import Path

import pandas
import pytest
from cli_helpers import assert_one_line_error, invoke

from kdabench.receipts import load_receipt, new_receipt
from kdabench.sources import source_hashes

RESULTS = Path(__file__).resolve().parents[2] / "results"
DEVICE = {"kind": "cuda", "device": "cuda:0", "name": "NVIDIA H200", "compute_capability": "9.0"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def serve_receipt(folder: Path) -> Path:
    """A small serve-sweep receipt: two arms, two prompt sizes, seven TTFT samples each."""
    builder = new_receipt("serve-sweep", config={"samples": 7}, command_line=["kdabench"],
                          device=DEVICE, sources=source_hashes(),
                          created_at="2026-12-03T10:00:00Z")
    for arm, rate in (("export-off", 9000.0), ("export-on", 12000.0)):
        for prompt in (1024, 4096):
            median = prompt / rate * 1000.0
            samples = [round(median * factor, 3) for factor in
                       (1.04, 0.98, 1.0, 1.01, 0.97, 1.02, 0.99)]
            builder.add_case({"id": f"ttft-{arm}-{prompt}", "verdict": "pass", "arm": arm,
                              "prompt_tokens": prompt, "ttft_samples_ms": samples,
                              "ttft_median_ms": statistics.median(samples),
                              "decode_steps_per_s": 30.0, "acceptance_length": 1.0})
    return builder.write(folder / builder.filename())


@pytest.fixture
def served(tmp_path: Path) -> Path:
    return serve_receipt(tmp_path / "receipts")


def test_report_on_the_committed_receipts_prints_the_files_it_wrote(tmp_path: Path):
    out = tmp_path / "report"
    result = invoke("report", RESULTS, "--out", out, "--title", "H200 evidence")
    assert result.exit_code == 0, result.output
    printed = [Path(line) for line in result.stdout.splitlines()]
    assert printed[0] == out / "report.md"
    assert len(printed) >= 2 and all(path.is_file() for path in printed)
    assert all(path.read_bytes()[:8] == PNG_SIGNATURE for path in printed[1:])
    text = printed[0].read_text(encoding="utf-8")
    assert text.startswith("# H200 evidence\n")
    for receipt in RESULTS.glob("*.json"):
        assert all(f"`{case['id']}`" in text for case in load_receipt(receipt)["cases"])
    assert result.stderr == ""


def test_json_prints_the_paths_and_each_receipt(served: Path, tmp_path: Path):
    result = invoke("report", served, "--out", tmp_path / "out", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["markdown"] == str(tmp_path / "out" / "report.md")
    assert [Path(p).name for p in payload["plots"]] == [f"{served.stem}-ttft.png"]
    assert payload["receipts"] == [{"path": str(served), "kind": "serve-sweep",
                                    "verified": True, "problems": [], "cases": 4}]
    assert payload["unknown_kinds"] == []


def test_a_tampered_receipt_is_rendered_with_a_warning(served: Path, tmp_path: Path):
    raw = served.read_bytes()
    served.write_bytes(raw.replace(b'"arm": "export-on"', b'"arm": "export-0n"', 1))
    result = invoke("report", served, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "warning:" in result.stderr and "fails verification" in result.stderr
    text = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "NOT VERIFIED" in text


def test_require_verified_refuses_a_tampered_receipt_with_exit_2(served: Path, tmp_path: Path):
    raw = served.read_bytes()
    served.write_bytes(raw.replace(b'"arm": "export-on"', b'"arm": "export-0n"', 1))
    result = invoke("report", served, "--out", tmp_path / "out", "--require-verified")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: refusing 1 receipt(s) that fail verification")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


CSV_COLUMNS = ["receipt", "kind", "backend", "device", "verified", "case", "verdict",
               "scenario", "arm", "kernel", "mode", "gates", "tokens", "seqs", "heads",
               "head_dim", "prompt_tokens", "median_ms", "ci_low_ms", "ci_high_ms", "n_samples"]


def test_csv_writes_a_row_per_case_per_receipt_of_the_committed_receipts(tmp_path: Path):
    out = tmp_path / "cases.csv"
    result = invoke("report", RESULTS, "--csv", out)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{out}\n" and result.stderr == ""
    assert not (tmp_path / "kdabench-report").exists()
    table = pandas.read_csv(out)
    assert list(table.columns) == CSV_COLUMNS
    expected = {path.name: [case["id"] for case in json.loads(path.read_text())["cases"]]
                for path in sorted(RESULTS.glob("*.json"))}
    assert len(table) == sum(len(ids) for ids in expected.values())
    assert {name: list(rows.case) for name, rows in table.groupby("receipt")} == expected
    assert table.verified.all()


def test_csv_to_stdout_reads_back(served: Path):
    result = invoke("report", served, "--csv", "-")
    assert result.exit_code == 0, result.output
    table = pandas.read_csv(io.StringIO(result.stdout))
    assert list(table.case) == [f"ttft-{arm}-{prompt}" for arm in ("export-off", "export-on")
                                for prompt in (1024, 4096)]
    assert (table.n_samples == 7).all() and (table.ci_low_ms < table.median_ms).all()
    assert (table.receipt == served.name).all()


def test_csv_json_says_what_was_written(served: Path, tmp_path: Path):
    out = tmp_path / "cases.csv"
    result = invoke("report", served, "--csv", out, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"csv": str(out), "rows": 4, "receipts": [str(served)]}


@pytest.mark.parametrize("args, message", [
    (("absent", "--csv", "-"), "no such file or folder"),
    ((RESULTS, "--csv", "-", "--json"), "both write to stdout"),
    ((RESULTS, "--csv", "a-file/cases.csv"), "cannot write a-file/cases.csv"),
], ids=["missing", "stdout-twice", "unwritable"])
def test_csv_bad_input_exits_2_with_one_line(tmp_path: Path, monkeypatch, args, message: str):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("not a folder\n", encoding="utf-8")
    result = invoke("report", *args)
    assert_one_line_error(result, 2, message, empty_stdout=True)


@pytest.mark.parametrize("make, message", [
    (lambda folder: folder / "absent.json", "no such file or folder"),
    (lambda folder: _write(folder / "notes.json", "not json\n"), "not valid JSON"),
    (lambda folder: _write(folder / "other.json", '{"schema": "x"}\n'), "schema 'x'"),
], ids=["missing", "not-json", "other-schema"])
def test_unreadable_input_exits_2_with_one_line(tmp_path: Path, make, message: str):
    result = invoke("report", make(tmp_path), "--out", tmp_path / "out")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


def test_no_receipt_argument_is_a_usage_error():
    result = invoke("report")
    assert result.exit_code == 2
    assert "kdabench report --help" in result.stderr


def test_help_documents_the_exit_codes():
    result = invoke("report", "--help")
    assert result.exit_code == 0
    assert "--require-verified" in result.stdout and "Exit codes:" in result.stdout


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path
