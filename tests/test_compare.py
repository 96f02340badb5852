"""kdabench.compare: receipts built through the library with known sample distributions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from devices import H200

from kdabench.compare import (
    CompareError,
    CompareOptions,
    compare_case,
    compare_paths,
    parse_threshold,
    render_markdown,
)
from kdabench.receipts import ReceiptBuilder, new_receipt

RESULTS = Path(__file__).resolve().parent.parent / "results"
DEVICE = H200
SOURCES = {"kernels/api.py": "a" * 64, "oracles/recurrent.py": "b" * 64}
TOOLCHAIN = {"python": "3.12.3", "torch": "2.11.0", "triton": "3.6.0", "kdabench": "0.1.0"}


def samples(median: float, noise: float, count: int, seed: int) -> list[float]:
    """`count` timings around `median` with relative gaussian noise `noise` (seeded)."""
    rng = np.random.default_rng(seed)
    return [float(x) for x in median * (1 + noise * rng.standard_normal(count))]


def timed(case_id: str, values: list[float], verdict: str = "pass") -> dict:
    return {"id": case_id, "verdict": verdict, "samples_ms": values,
            "median_ms": float(np.median(values))}


def untimed(case_id: str, verdict: str = "pass") -> dict:
    return {"id": case_id, "verdict": verdict, "samples_ms": [], "median_ms": None}


def bench_case(case_id: str, kdabench: dict[str, list[float]], fla: dict[str, list[float]],
               primary: str = "graph") -> dict:
    """A bench case as `kdabench bench` records it: raw samples per mode and kernel."""
    modes = {mode: {"fla": {"samples_ms": fla[mode], "median_ms": float(np.median(fla[mode]))},
                    "kdabench": {"samples_ms": values, "median_ms": float(np.median(values))}}
             for mode, values in kdabench.items()}
    ratios = {mode: float(np.median(fla[mode]) / np.median(values))
              for mode, values in kdabench.items()}
    return {"id": case_id, "verdict": "pass", "modes": modes, "primary_mode": primary,
            "kernels": modes[primary], "ratio_fla_over_kdabench": ratios}


def write(path: Path, cases: list[dict], *, kind: str = "qualify", device: dict | None = None,
          sources: dict | None = None, created_at: str = "2026-12-02T16:24:05Z",
          status: str = "complete") -> Path:
    builder = new_receipt(kind, config={"matrix": "default"}, command_line=["kdabench", kind],
                          device=device or DEVICE, sources=sources or SOURCES,
                          created_at=created_at)
    for case in cases:
        builder.add_case(case)
    return builder.write(path, status=status)


def write_with_toolchain(path: Path, cases: list[dict], toolchain: dict) -> Path:
    builder = ReceiptBuilder(
        "qualify", config={"matrix": "default"}, command_line=["kdabench", "qualify"],
        device=DEVICE, toolchain=toolchain, git={"commit": None, "dirty": None},
        sources=SOURCES, tool_version="0.1.0", created_at="2026-12-02T16:24:05Z",
    )
    for case in cases:
        builder.add_case(case)
    return builder.write(path)


def by_id(comparison) -> dict:
    return {case.id: case for case in comparison.cases}


# --------------------------------------------------------------------------- verdicts


def test_a_receipt_against_itself_changes_nothing(tmp_path: Path):
    receipt = write(tmp_path / "r.json", [
        timed("fast", samples(0.3, 0.05, 15, seed=1)), untimed("contract"),
    ])
    comparison = compare_paths(receipt, receipt)
    assert comparison.warnings == []
    assert not comparison.has_regression
    cases = by_id(comparison)
    assert cases["fast"].verdict == "unchanged"
    assert cases["fast"].note == "identical samples"
    assert cases["fast"].ratio == 1.0 and cases["fast"].p_value == pytest.approx(1.0)
    assert cases["fast"].ci_low <= 1.0 <= cases["fast"].ci_high
    assert cases["contract"].verdict == "unchanged"
    assert cases["contract"].note == "correctness only (no timing)"


def test_the_committed_receipt_against_itself_changes_nothing():
    receipts = sorted(RESULTS.glob("*.json"))
    if not receipts:
        pytest.skip("no committed receipt in results/")
    comparison = compare_paths(receipts[0], receipts[0])
    assert not comparison.has_regression and comparison.warnings == []
    assert {case.verdict for case in comparison.cases} == {"unchanged"}
    # bench cases' notes begin with the mode and the fla ratios ("graph: kdabench; ...; ")
    assert {case.note.split("; ")[-1] for case in comparison.cases} <= {
        "identical samples", "correctness only (no timing)"}


def test_a_tight_20_percent_slowdown_is_a_regression(tmp_path: Path):
    base = write(tmp_path / "base.json", [timed("k", samples(1.0, 0.01, 30, seed=2))])
    head = write(tmp_path / "head.json", [timed("k", samples(1.2, 0.01, 30, seed=3))])
    comparison = compare_paths(base, head)
    case = by_id(comparison)["k"]
    assert case.verdict == "regressed" and case.is_regression
    assert case.ratio == pytest.approx(1.2, rel=0.02)
    assert case.p_value < 1e-6
    assert 1.05 < case.ci_low < case.ratio < case.ci_high < 1.3
    assert comparison.has_regression


def test_a_noisy_20_percent_slowdown_is_not_significant(tmp_path: Path):
    base = write(tmp_path / "base.json", [timed("k", samples(1.0, 0.4, 5, seed=4))])
    head = write(tmp_path / "head.json", [timed("k", samples(1.2, 0.4, 5, seed=5))])
    case = by_id(compare_paths(base, head))["k"]
    assert case.ratio > 1.05  # past the threshold...
    assert case.p_value >= 0.01  # ...but the samples overlap
    assert case.verdict == "unchanged"
    assert "not significant" in case.note
    assert case.ci_low < 1.0 < case.ci_high


def test_a_tight_20_percent_speedup_is_an_improvement(tmp_path: Path):
    base = write(tmp_path / "base.json", [timed("k", samples(1.0, 0.01, 30, seed=6))])
    head = write(tmp_path / "head.json", [timed("k", samples(0.8, 0.01, 30, seed=7))])
    case = by_id(compare_paths(base, head))["k"]
    assert case.verdict == "improved" and not case.is_regression


def test_a_significant_change_within_the_threshold_is_unchanged(tmp_path: Path):
    base = write(tmp_path / "base.json", [timed("k", samples(1.0, 0.001, 30, seed=8))])
    head = write(tmp_path / "head.json", [timed("k", samples(1.02, 0.001, 30, seed=9))])
    case = by_id(compare_paths(base, head))["k"]
    assert case.p_value < 0.01
    assert case.verdict == "unchanged" and case.note == "within threshold"
    assert by_id(compare_paths(base, head, threshold="1%"))["k"].verdict == "regressed"


def test_a_correctness_flip_is_a_regression_whatever_the_timing(tmp_path: Path):
    values = samples(1.0, 0.01, 30, seed=10)
    faster = samples(0.5, 0.01, 30, seed=11)
    base = write(tmp_path / "base.json", [timed("k", values), untimed("c")])
    head = write(tmp_path / "head.json", [timed("k", faster, "fail"), untimed("c", "error")])
    comparison = compare_paths(base, head)
    cases = by_id(comparison)
    assert cases["k"].verdict == "failed" and cases["k"].note == "correctness: pass -> fail"
    assert cases["c"].verdict == "failed"
    assert [case.id for case in comparison.regressions] == ["k", "c"]


def test_a_case_that_now_passes_is_an_improvement(tmp_path: Path):
    base = write(tmp_path / "base.json", [untimed("c", "fail"), untimed("d", "fail")])
    head = write(tmp_path / "head.json", [untimed("c", "pass"), untimed("d", "error")])
    cases = by_id(compare_paths(base, head))
    assert cases["c"].verdict == "improved"
    assert cases["d"].verdict == "unchanged" and "fail -> error" in cases["d"].note


def test_medians_without_samples_give_a_ratio_but_no_test():
    base = {"id": "k", "verdict": "pass", "median_ms": 1.0}
    head = {"id": "k", "verdict": "pass", "median_ms": 2.0, "samples_ms": []}
    case = compare_case(base, head)
    assert case.ratio == 2.0 and case.p_value is None and case.ci_low is None
    assert case.verdict == "unchanged" and "not tested" in case.note


def test_timing_on_one_side_only_compares_correctness():
    case = compare_case(timed("k", [1.0, 1.1]), untimed("k"))
    assert case.verdict == "unchanged" and case.note == "timing only in BASE"


def test_nan_samples_are_ignored():
    base = {"id": "k", "verdict": "pass", "samples_ms": [1.0, "nan", 1.0]}
    case = compare_case(base, timed("k", [1.0, 1.0]))
    assert case.base_samples == 2 and case.ratio == 1.0


def test_new_and_missing_cases(tmp_path: Path):
    base = write(tmp_path / "base.json", [untimed("kept"), untimed("dropped")])
    head = write(tmp_path / "head.json", [untimed("kept"), untimed("added", "fail")])
    comparison = compare_paths(base, head)
    cases = by_id(comparison)
    assert cases["dropped"].verdict == "missing" and cases["dropped"].head_verdict is None
    assert cases["added"].verdict == "new" and cases["added"].base_verdict is None
    assert not comparison.has_regression
    assert comparison.counts == {"failed": 0, "regressed": 0, "improved": 0, "new": 1,
                                 "missing": 1, "unchanged": 1}


# --------------------------------------------------------------------------- warnings


def test_mismatched_devices_are_compared_only_across_device_and_warn(tmp_path: Path):
    h100 = {**DEVICE, "name": "NVIDIA H100", "sm_count": 132}
    base = write(tmp_path / "base.json", [untimed("c")])
    head = write(tmp_path / "head.json", [untimed("c")], device=h100)
    with pytest.raises(CompareError, match="nothing to compare.*--across device would pair"):
        compare_paths(base, head)
    comparison = compare_paths(base, head, across=["device"])
    assert by_id(comparison)["c"].device == "NVIDIA H200 -> NVIDIA H100"
    assert any("device differs" in w and "NVIDIA H100" in w for w in comparison.warnings)


def test_a_different_driver_warns(tmp_path: Path):
    base = write(tmp_path / "base.json", [untimed("c")])
    head = write(tmp_path / "head.json", [untimed("c")],
                 device={**DEVICE, "driver_version": "575.0", "uuid": "GPU-1"})
    warnings = compare_paths(base, head).warnings
    assert len(warnings) == 1
    assert "driver_version 580.159.04 -> 575.0" in warnings[0]  # uuid (one unit) is not


def test_a_different_toolchain_warns(tmp_path: Path):
    base = write_with_toolchain(tmp_path / "base.json", [untimed("c")], TOOLCHAIN)
    head = write_with_toolchain(tmp_path / "head.json", [untimed("c")],
                                {**TOOLCHAIN, "triton": "3.7.0", "kdabench": "0.2.0"})
    warnings = compare_paths(base, head).warnings
    assert len(warnings) == 1
    assert "toolchain differs" in warnings[0] and "triton 3.6.0 -> 3.7.0" in warnings[0]
    assert "kdabench" not in warnings[0]


def test_different_sources_warn(tmp_path: Path):
    base = write(tmp_path / "base.json", [untimed("c")])
    head = write(tmp_path / "head.json", [untimed("c")],
                 sources={**SOURCES, "kernels/api.py": "c" * 64})
    warnings = compare_paths(base, head).warnings
    assert any("sources differ" in w and "changed: kernels/api.py" in w for w in warnings)


def test_a_partial_receipt_warns(tmp_path: Path):
    base = write(tmp_path / "base.json", [untimed("c")])
    head = write(tmp_path / "head.json", [untimed("c")], status="partial")
    assert any("partial receipt" in w for w in compare_paths(base, head).warnings)


# --------------------------------------------------------------------------- input


def tamper(path: Path) -> None:
    raw = path.read_bytes()
    position = raw.index(b".", raw.index(b'"samples_ms": [')) + 3  # a digit of a sample
    digit = raw[position:position + 1]
    assert digit.isdigit()
    replacement = b"1" if digit != b"1" else b"2"
    path.write_bytes(raw[:position] + replacement + raw[position + 1:])


def test_a_tampered_receipt_is_refused_unless_no_verify(tmp_path: Path):
    base = write(tmp_path / "base.json", [timed("k", samples(1.0, 0.01, 10, seed=12))])
    head = write(tmp_path / "head.json", [timed("k", samples(1.0, 0.01, 10, seed=12))])
    tamper(head)
    with pytest.raises(CompareError, match="does not verify.*--no-verify"):
        compare_paths(base, head)
    comparison = compare_paths(base, head, verify=False)
    assert any("does not verify" in w and "compared anyway" in w for w in comparison.warnings)
    assert by_id(comparison)["k"].verdict == "unchanged"


def test_folders_of_receipts_are_matched_by_kind_device_and_case(tmp_path: Path):
    h100 = {**DEVICE, "name": "NVIDIA H100"}
    for side, slow in (("base", 1.0), ("head", 1.2)):
        folder = tmp_path / side
        write(folder / "qualify-h200.json", [untimed("shared"), untimed("only-h200")])
        write(folder / "qualify-h100.json", [untimed("shared", "pass" if side == "base"
                                                     else "fail")], device=h100)
        fla = {"graph": samples(1.0, 0.01, 30, seed=12)}
        write(folder / "bench-h200.json",
              [bench_case("shared", {"graph": samples(slow, 0.01, 30, seed=13)}, fla)],
              kind="bench")
    (tmp_path / "base" / "README.md").write_text("not a receipt, not a *.json")
    comparison = compare_paths(tmp_path / "base", tmp_path / "head")
    assert len(comparison.base) == 3 and len(comparison.head) == 3
    keyed = {(c.kind, c.device, c.id): c.verdict for c in comparison.cases}
    assert keyed == {
        ("qualify", "NVIDIA H200", "shared"): "unchanged",
        ("qualify", "NVIDIA H200", "only-h200"): "unchanged",
        ("qualify", "NVIDIA H100", "shared"): "failed",
        ("bench", "NVIDIA H200", "shared"): "regressed",
    }
    assert comparison.warnings == []


def test_a_device_on_one_side_only_is_listed_unmatched_not_compared(tmp_path: Path):
    h100, b200 = {**DEVICE, "name": "NVIDIA H100"}, {**DEVICE, "name": "NVIDIA B200"}
    write(tmp_path / "base" / "a.json", [untimed("c")])
    write(tmp_path / "head" / "a.json", [untimed("c")])
    write(tmp_path / "base" / "b.json", [untimed("c")], device=h100)
    write(tmp_path / "head" / "b.json", [untimed("c")], device=b200)
    write(tmp_path / "head" / "c.json", [untimed("c")], device={**DEVICE, "name": "X"})
    comparison = compare_paths(tmp_path / "base", tmp_path / "head")
    assert {(c.device, c.verdict) for c in comparison.cases} == {("NVIDIA H200", "unchanged")}
    assert {(u.side, Path(u.path).name, u.key.device) for u in comparison.unmatched} == {
        ("BASE", "b.json", "NVIDIA H100"), ("HEAD", "b.json", "NVIDIA B200"),
        ("HEAD", "c.json", "X")}


def test_the_newest_receipt_wins_a_duplicate_case(tmp_path: Path):
    write(tmp_path / "base" / "old.json", [untimed("c", "fail")],
          created_at="2026-12-01T00:00:00Z")
    write(tmp_path / "base" / "new.json", [untimed("c", "pass")],
          created_at="2026-12-02T00:00:00Z")
    head = write(tmp_path / "head.json", [untimed("c", "fail")])
    comparison = compare_paths(tmp_path / "base", head)
    assert by_id(comparison)["c"].verdict == "failed"
    assert any("more than one receipt" in w for w in comparison.warnings)


def test_mismatched_kinds_are_refused(tmp_path: Path):
    base = write(tmp_path / "base.json", [untimed("c")])
    head = write(tmp_path / "head.json", [untimed("c")], kind="bench")
    with pytest.raises(CompareError, match="nothing to compare.*qualify.*bench"):
        compare_paths(base, head)


def test_no_case_in_common_is_refused(tmp_path: Path):
    base = write(tmp_path / "base.json", [untimed("a")])
    head = write(tmp_path / "head.json", [untimed("b")])
    with pytest.raises(CompareError, match="no case appears in both"):
        compare_paths(base, head)


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    (b"{not json", "not valid JSON"),
    (b'{"schema": "other"}', "expected a kdabench.receipt.v1 receipt"),
], ids=["absent", "not-json", "not-a-receipt"])
def test_unreadable_input_is_refused(tmp_path: Path, content, message):
    good = write(tmp_path / "good.json", [untimed("c")])
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_bytes(content)
    with pytest.raises(CompareError, match=message):
        compare_paths(good, bad, verify=False)


def test_an_empty_folder_is_refused(tmp_path: Path):
    good = write(tmp_path / "good.json", [untimed("c")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(CompareError, match="no \\*.json receipt"):
        compare_paths(tmp_path / "empty", good)


# --------------------------------------------------------------------------- pieces


@pytest.mark.parametrize("text, value", [
    ("5%", 0.05), ("0.05", 0.05), (" 12.5% ", 0.125), ("0", 0.0), (0.1, 0.1),
], ids=["percent", "fraction", "spaces", "zero", "float"])
def test_parse_threshold(text, value):
    assert parse_threshold(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["5", "abc", "-1%", "100%"])
def test_parse_threshold_refuses(text):
    with pytest.raises(CompareError):
        parse_threshold(text)


def test_options_are_validated():
    with pytest.raises(CompareError, match="alpha"):
        CompareOptions(alpha=0)


def test_markdown_has_summary_warnings_and_every_case(tmp_path: Path):
    base = write(tmp_path / "base.json", [untimed("a|b"), untimed("gone")])
    head = write(tmp_path / "head.json", [untimed("a|b", "fail")],
                 device={**DEVICE, "name": "NVIDIA H100"})
    text = render_markdown(compare_paths(base, head, across=["device"]))
    lines = text.splitlines()
    assert lines[0].startswith("**kdabench compare** ❌ 1 regression(s)")
    assert any(line.startswith("> ⚠️ device differs") for line in lines)
    assert "`a\\|b`" in text and "`gone`" in text
    assert sum(line.startswith("| `") for line in lines) == 2


# --------------------------------------------------------------------------- bench receipts


def test_bench_cases_compare_kdabench_samples_in_the_primary_mode(tmp_path: Path):
    """kdabench's graph samples decide (20% slower: regressed, though its eager samples and
    fla's are unchanged); the note names the mode and each side's fla ratio."""
    fla = {mode: samples(0.40, 0.01, 20, seed=30) for mode in ("eager", "graph")}
    eager = samples(0.30, 0.01, 20, seed=31)
    base = write(tmp_path / "base.json", [bench_case(
        "8192x8x1", {"eager": eager, "graph": samples(0.40, 0.01, 20, seed=32)}, fla)],
        kind="bench")
    head = write(tmp_path / "head.json", [bench_case(
        "8192x8x1", {"eager": eager, "graph": samples(0.48, 0.01, 20, seed=33)}, fla)],
        kind="bench")
    case = by_id(compare_paths(base, head))["8192x8x1"]
    assert case.verdict == "regressed" and case.base_samples == case.head_samples == 20
    assert case.ratio == pytest.approx(1.2, rel=0.02)
    assert case.note.startswith("graph: kdabench; fla/kdabench 1.00x -> 0.83x; ")
    assert case.note.endswith("slower")


def test_bench_cases_fall_back_to_a_mode_both_ran(tmp_path: Path):
    fla = {mode: samples(1.0, 0.01, 12, seed=34) for mode in ("eager", "graph")}
    base = write(tmp_path / "base.json", [bench_case(
        "s", {"eager": samples(1.0, 0.01, 12, seed=35), "graph": samples(0.5, 0.01, 12, seed=36)},
        fla)], kind="bench")
    head = write(tmp_path / "head.json", [bench_case(
        "s", {"eager": samples(0.7, 0.01, 12, seed=37)}, fla, primary="eager")], kind="bench")
    case = by_id(compare_paths(base, head))["s"]
    assert case.verdict == "improved" and case.note.startswith("eager: kdabench")
    assert case.ratio == pytest.approx(0.7, rel=0.03)


def test_bench_cases_without_a_shared_mode_compare_correctness_only(tmp_path: Path):
    fla = {mode: samples(1.0, 0.01, 12, seed=38) for mode in ("eager", "graph")}
    base = write(tmp_path / "base.json", [bench_case(
        "s", {"graph": samples(0.5, 0.01, 12, seed=39)}, fla)], kind="bench")
    head = write(tmp_path / "head.json", [bench_case(
        "s", {"eager": samples(9.0, 0.01, 12, seed=40)}, fla, primary="eager")], kind="bench")
    case = by_id(compare_paths(base, head))["s"]
    assert case.verdict == "unchanged" and case.ratio is None
    assert case.note == "no timing mode in common; correctness only (no timing)"
