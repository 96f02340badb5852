"""`kdabench compare` through click's CliRunner: output formats and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, invoke

from kdabench.receipts import new_receipt

RESULTS = Path(__file__).resolve().parents[2] / "results"
DEVICE = {
    "kind": "cuda", "device": "cuda:0", "name": "NVIDIA H200", "compute_capability": "9.0",
    "sm_count": 132, "total_memory_bytes": 150_000_000_000, "uuid": "GPU-0",
    "driver_version": "580.159.04", "cuda_runtime_version": "13.0",
    "cpu_model": "Intel Xeon", "cpu_count": 16,
}
SOURCES = {"kernels/api.py": "a" * 64}
CASE_IDS = ["accuracy-C1-H4-K64", "accuracy-C2-H8-K128", "contract-refuses-capacity-3"]


def write(path: Path, *, slowdown: float = 1.0, flip: bool = False, kind: str = "qualify",
          device: dict | None = None, backend: str | None = None,
          created_at: str = "2026-12-02T16:24:05Z") -> Path:
    """Two timed cases (30 samples, 1% noise, the first scaled by `slowdown`) and one
    untimed contract case (failing when `flip`); a bench receipt holds the samples as
    `kdabench bench` does, per mode and kernel. A qualify receipt records `backend` when
    given (none: Triton's)."""
    builder = new_receipt(kind, config={"backend": backend} if backend else {},
                          command_line=["kdabench", kind], device=device or DEVICE,
                          sources=SOURCES, created_at=created_at)
    rng = np.random.default_rng(0)
    for case_id, scale in zip(CASE_IDS[:2], (slowdown, 1.0), strict=True):
        values = scale * (1 + 0.01 * rng.standard_normal(30))
        timing = {"samples_ms": values.tolist(), "median_ms": float(np.median(values))}
        if kind == "bench":
            timing = {"modes": {"graph": {"kdabench": timing}}, "primary_mode": "graph"}
        builder.add_case({"id": case_id, "verdict": "pass", **timing})
    builder.add_case({"id": CASE_IDS[2], "verdict": "fail" if flip else "pass",
                      "samples_ms": [], "median_ms": None})
    return builder.write(path)


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return write(tmp_path / "base.json")


def test_a_receipt_against_itself_exits_0(base: Path):
    result = invoke("compare", base, base)
    assert result.exit_code == 0, result.output
    assert "no regression: 3 cases" in result.stdout
    assert "3 unchanged" in result.stdout
    assert "identical samples" in result.stdout
    assert result.stderr == ""


def test_the_committed_results_against_themselves_exit_0():
    if not list(RESULTS.glob("*.json")):
        pytest.skip("no committed receipt in results/")
    result = invoke("compare", RESULTS, RESULTS)
    assert result.exit_code == 0, result.output
    assert "no regression" in result.stdout
    assert "0 failed, 0 regressed, 0 improved, 0 new, 0 missing" in result.stdout


def test_a_slowdown_exits_1(base: Path, tmp_path: Path):
    head = write(tmp_path / "head.json", slowdown=1.2)
    result = invoke("compare", base, head)
    assert result.exit_code == 1
    assert "regressed" in result.stdout
    assert result.stderr.startswith("finding: 1 case(s) regressed or failed: accuracy-C1-H4-K64")


def test_a_correctness_flip_exits_1(base: Path, tmp_path: Path):
    head = write(tmp_path / "head.json", flip=True)
    result = invoke("compare", base, head)
    assert result.exit_code == 1
    assert CASE_IDS[2] in result.stderr


def test_a_threshold_above_the_slowdown_exits_0(base: Path, tmp_path: Path):
    head = write(tmp_path / "head.json", slowdown=1.2)
    assert invoke("compare", base, head, "--threshold", "25%").exit_code == 0
    assert invoke("compare", base, head, "--threshold", "0.25").exit_code == 0
    assert invoke("compare", base, head, "--alpha", "1e-30").exit_code == 0


def test_markdown_names_every_case(base: Path, tmp_path: Path):
    head = write(tmp_path / "head.json", slowdown=1.2, device={**DEVICE, "name": "NVIDIA H100"})
    result = invoke("compare", base, head, "--format", "markdown", "--across", "device")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("**kdabench compare** ❌ 1 regression(s): 3 cases")
    assert lines[2].startswith("> ⚠️ device differs")
    for case_id in CASE_IDS:
        assert f"| `{case_id}` |" in result.stdout
    assert lines.index(next(line for line in lines if CASE_IDS[0] in line)) < lines.index(
        next(line for line in lines if CASE_IDS[1] in line))  # regressions first


def test_json_holds_every_field(base: Path, tmp_path: Path):
    head = write(tmp_path / "head.json", slowdown=1.2)
    result = invoke("compare", base, head, "--format", "json")
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert document["has_regression"] is True
    assert document["options"]["threshold"] == 0.05 and document["options"]["alpha"] == 0.01
    assert document["base"] == [str(base)] and document["head"] == [str(head)]
    cases = {case["id"]: case for case in document["cases"]}
    assert set(cases) == set(CASE_IDS)
    regressed = cases[CASE_IDS[0]]
    assert regressed["verdict"] == "regressed" and regressed["is_regression"] is True
    assert set(regressed) >= {"kind", "device", "base_median_ms", "head_median_ms", "ratio",
                              "ci_low", "ci_high", "p_value", "base_samples", "head_samples",
                              "base_verdict", "head_verdict", "note"}
    assert cases[CASE_IDS[2]]["ratio"] is None


@pytest.mark.parametrize("output_format", ["table", "markdown", "json"])
def test_out_writes_the_chosen_format(base: Path, tmp_path: Path, output_format: str):
    out = tmp_path / "report" / f"compare.{output_format}"
    result = invoke("compare", base, base, "--format", output_format, "--out", out)
    assert result.exit_code == 0, result.output
    text = out.read_text()
    if output_format == "table":
        assert "\x1b[" not in text and "no regression" in text
    else:
        assert text == result.stdout
    for case_id in CASE_IDS:
        assert case_id in text


def test_a_tampered_receipt_exits_2_unless_no_verify(base: Path, tmp_path: Path):
    head = write(tmp_path / "head.json")
    raw = head.read_bytes()
    position = raw.index(b".", raw.index(b'"samples_ms": [')) + 3
    head.write_bytes(raw[:position] + (b"7" if raw[position:position + 1] != b"7" else b"3")
                     + raw[position + 1:])
    refused = invoke("compare", base, head)
    assert refused.exit_code == 2
    assert "does not verify" in refused.stderr and "--no-verify" in refused.stderr
    accepted = invoke("compare", base, head, "--no-verify")
    assert accepted.exit_code == 0, accepted.output
    assert "warning:" in accepted.stdout and "does not verify" in accepted.stdout


def test_mismatched_kinds_exit_2(base: Path, tmp_path: Path):
    head = write(tmp_path / "head.json", kind="bench")
    result = invoke("compare", base, head)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: nothing to compare")


@pytest.mark.parametrize("options, message", [
    (["--threshold", "5"], "ambiguous"),
    (["--alpha", "2"], "--alpha"),
    (["--format", "html"], "--format"),
], ids=["ambiguous-threshold", "alpha-out-of-range", "unknown-format"])
def test_bad_options_exit_2(base: Path, options: list[str], message: str):
    result = invoke("compare", base, base, *options)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error:") and message in result.stderr


def test_an_absent_receipt_exits_2(base: Path):
    result = invoke("compare", base, base.parent / "missing.json")
    assert result.exit_code == 2
    assert result.stderr.startswith("error:") and "no such file" in result.stderr


def test_folders_are_compared(tmp_path: Path):
    write(tmp_path / "base" / "qualify.json")
    write(tmp_path / "base" / "bench.json", kind="bench")
    write(tmp_path / "head" / "qualify.json")
    write(tmp_path / "head" / "bench.json", kind="bench", slowdown=1.2)
    result = invoke("compare", tmp_path / "base", tmp_path / "head", "--format", "json")
    assert result.exit_code == 1
    cases = json.loads(result.stdout)["cases"]
    assert len(cases) == 6
    assert [(c["kind"], c["id"]) for c in cases if c["is_regression"]] == [
        ("bench", CASE_IDS[0])]


def test_help_documents_the_pairing_and_exit_codes():
    result = invoke("compare", "--help")
    assert result.exit_code == 0
    assert "Exit codes:" in result.stdout and "--no-verify" in result.stdout
    text = " ".join(result.stdout.split())
    assert "same receipt kind, kernel backend, device name and case id" in text
    assert "--across [backend|device]" in text and "never paired across backends" in text
    for line in ("0 ok: no case regressed or failed", "1 a case regressed",
                 "2 bad input:", "3 internal error (a bug)"):
        assert line in text


# --------------------------------------------------------------------------- pairing


def pairing_section(stdout: str) -> list[str]:
    """The lines of the text output's pairing section, stripped."""
    lines = stdout.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("pairing by ")))
    section = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        section.append(line.strip())
    return section


def test_a_folder_of_two_backends_against_a_triton_receipt_pairs_triton_only(tmp_path: Path):
    """CuTe's receipt is the folder's newest and shares Triton's case ids (and is slower and
    fails a case): it is listed as unmatched, not judged against Triton's."""
    base = tmp_path / "base"
    write(base / "triton.json", backend="triton", created_at="2026-12-01T00:00:00Z")
    write(base / "cute.json", backend="cute", slowdown=1.5, flip=True,
          created_at="2026-12-02T00:00:00Z")
    head = write(tmp_path / "head.json", backend="triton")
    result = invoke("compare", base, head)
    assert result.exit_code == 0, result.output
    assert pairing_section(result.stdout) == [
        f"qualify, triton, NVIDIA H200: BASE {base / 'triton.json'} against HEAD {head}",
        (f"unmatched in BASE: {base / 'cute.json'} (qualify, cute, NVIDIA H200): no receipt "
         "of that kind/backend/device on the other side"),
    ]
    assert "3 unchanged" in result.stdout


def test_backends_are_compared_across_only_with_across_backend(tmp_path: Path):
    triton = write(tmp_path / "triton.json", backend="triton")
    cute = write(tmp_path / "cute.json", backend="cute", slowdown=1.5)
    refused = invoke("compare", triton, cute)
    assert_one_line_error(refused, 2, "error: nothing to compare",
                          "--across backend would pair them", empty_stdout=True)
    result = invoke("compare", triton, cute, "--across", "backend", "--format", "json")
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert document["pairing"]["across"] == ["backend"]
    assert [(pair["base"]["backend"], pair["head"]["backend"], pair["base"]["receipts"],
             pair["head"]["receipts"]) for pair in document["pairing"]["pairs"]] == [
        ("triton", "cute", [str(triton)], [str(cute)])]
    assert [(case["id"], case["backend"]) for case in document["cases"]
            if case["is_regression"]] == [(CASE_IDS[0], "triton -> cute")]


def test_markdown_and_json_say_which_receipts_were_paired(tmp_path: Path):
    write(tmp_path / "base" / "qualify.json")
    write(tmp_path / "base" / "h100.json", device={**DEVICE, "name": "NVIDIA H100"})
    head = write(tmp_path / "head.json")
    markdown = invoke("compare", tmp_path / "base", head, "--format", "markdown")
    assert markdown.exit_code == 0, markdown.output
    assert "Pairing by kind/backend/device:" in markdown.stdout
    assert (f"- qualify, triton, NVIDIA H200: BASE `{tmp_path / 'base' / 'qualify.json'}` "
            f"against HEAD `{head}`") in markdown.stdout
    assert (f"- unmatched in BASE: `{tmp_path / 'base' / 'h100.json'}` (qualify, triton, "
            "NVIDIA H100): no receipt of that kind/backend/device on the other side"
            ) in markdown.stdout
    unmatched = json.loads(invoke("compare", tmp_path / "base", head, "--format", "json")
                           .stdout)["pairing"]["unmatched"]
    assert [(u["side"], u["path"], u["device"]) for u in unmatched] == [
        ("BASE", str(tmp_path / "base" / "h100.json"), "NVIDIA H100")]


@pytest.mark.parametrize("options, fragment", [
    (["--across", "kind"], "'kind' is not one of 'backend', 'device'"),
    (["--across", "backend"], "would pair with the same receipts of the other side"),
], ids=["unknown-field", "two-backends-on-one-side"])
def test_bad_pairing_exits_2_with_one_line(tmp_path: Path, options: list[str], fragment: str):
    write(tmp_path / "base" / "triton.json", backend="triton")
    write(tmp_path / "base" / "cute.json", backend="cute")
    head = write(tmp_path / "head.json", backend="cute")
    assert_one_line_error(invoke("compare", tmp_path / "base", head, *options), 2, fragment)


def _newest_gpu_triton_qualify_receipt() -> Path | None:
    """The committed GPU qualification receipt of the Triton backend made last, if any."""
    found = []
    for path in RESULTS.glob("qualify-*.json"):
        doc = json.loads(path.read_text())
        if (doc["config"].get("backend", "triton") == "triton"
                and doc["config"].get("tier") == "gpu"):
            found.append((doc["created_at"], path))
    return max(found)[1] if found else None


def test_the_committed_folder_against_its_newest_triton_receipt_exits_0():
    head = _newest_gpu_triton_qualify_receipt()
    if head is None:
        pytest.skip("no committed GPU Triton qualification receipt in results/")
    result = invoke("compare", RESULTS, head)
    assert result.exit_code == 0, result.output
    paired = [line for line in pairing_section(result.stdout)
              if not line.startswith("unmatched")]
    device = json.loads(head.read_text())["device"]["name"]
    assert len(paired) == 1 and paired[0].startswith(f"qualify, triton, {device}: BASE ")
    assert paired[0].endswith(f"against HEAD {head}")
    assert "0 failed, 0 regressed, 0 improved, 0 new, 0 missing" in result.stdout
