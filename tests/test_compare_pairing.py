"""kdabench.compare's pairing: cases paired by receipt kind, backend, device and id, never across
backends or devices unless asked; which receipts were paired, and which matched nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from devices import H200

from kdabench.compare import CompareError, compare_paths, pairing_lines, render_markdown
from kdabench.receipts import new_receipt

RESULTS = Path(__file__).resolve().parent.parent / "results"
DEVICE = H200
H100 = {**DEVICE, "name": "NVIDIA H100"}
SOURCES = {"kernels/api.py": "a" * 64}
TIMED_IDS = ("accuracy-C1-H8-K128", "accuracy-C2-H8-K128")
CONTRACT_ID = "contract-refuses-capacity-3"
NOT_PAIRED = "no receipt of that kind/backend/device on the other side"


def samples(median: float, seed: int) -> list[float]:
    """30 timings around `median` with 1% gaussian noise (seeded)."""
    rng = np.random.default_rng(seed)
    return [float(x) for x in median * (1 + 0.01 * rng.standard_normal(30))]


def write(path: Path, kind: str, config: dict, cases: list[dict], *, device: dict | None = None,
          created_at: str = "2026-12-02T16:24:05Z") -> Path:
    builder = new_receipt(kind, config=config, command_line=["kdabench", kind],
                          device=device or DEVICE, sources=SOURCES, created_at=created_at)
    for case in cases:
        builder.add_case(case)
    return builder.write(path)


def qualify(path: Path, backend: str | None, ms: float = 1.0, *, device: dict | None = None,
            created_at: str = "2026-12-02T16:24:05Z", contract: str = "pass") -> Path:
    """A qualify receipt of `backend` (None: one that records no backend): two timed cases
    around `ms` and an untimed contract case whose verdict is `contract`."""
    cases = [{"id": case_id, "verdict": "pass", "samples_ms": values,
              "median_ms": float(np.median(values))}
             for seed, case_id in enumerate(TIMED_IDS) for values in [samples(ms, seed)]]
    cases.append({"id": CONTRACT_ID, "verdict": contract, "samples_ms": [], "median_ms": None})
    config = {"matrix_name": "default"} | ({"backend": backend} if backend else {})
    return write(path, "qualify", config, cases, device=device, created_at=created_at)


def bench(path: Path, timings: dict[str, float], *,
          created_at: str = "2026-12-02T16:24:05Z") -> Path:
    """A bench receipt that timed kdabench on each backend of `timings` ({backend: ms}, the
    first backend's kernel `kdabench`, a further one's `kdabench-<backend>`), fla at 1 ms."""
    kernels = {backend: "kdabench" if i == 0 else f"kdabench-{backend}"
               for i, backend in enumerate(timings)}
    cases = []
    for seed, shape in enumerate(("8192x8x1", "32768x8x1")):
        graph = {"fla": samples(1.0, 100 + seed)} | {
            kernels[backend]: samples(ms, seed) for backend, ms in timings.items()}
        modes = {"graph": {kernel: {"samples_ms": values, "median_ms": float(np.median(values))}
                           for kernel, values in graph.items()}}
        cases.append({"id": shape, "verdict": "pass", "modes": modes, "primary_mode": "graph",
                      "kernels": modes["graph"]})
    config = {"backends": list(timings), "backend_kernels": kernels}
    return write(path, "bench", config, cases, created_at=created_at)


def pairs(comparison) -> list[tuple[str, list[str], list[str]]]:
    """(pair, BASE receipts' names, HEAD receipts' names) of each pair."""
    return [(pair.describe(), [Path(p.receipt.path).name for p in pair.base.used],
             [Path(p.receipt.path).name for p in pair.head.used]) for pair in comparison.pairs]


def unmatched(comparison) -> list[tuple[str, str, str]]:
    return [(u.side, Path(u.path).name, u.key.describe()) for u in comparison.unmatched]


def verdicts(comparison) -> dict[tuple[str, str | None, str], str]:
    return {(c.kind, c.backend, c.id): c.verdict for c in comparison.cases}


# --------------------------------------------------------------------------- backends


def test_two_backends_sharing_case_ids_are_never_paired_by_default(tmp_path: Path):
    triton = qualify(tmp_path / "triton.json", "triton", 1.0)
    cute = qualify(tmp_path / "cute.json", "cute", 2.0)
    with pytest.raises(CompareError, match="no receipt of BASE has one of the same kind/backend/"
                       "device in HEAD.*--across backend would pair them"):
        compare_paths(triton, cute)


def test_across_backend_pairs_cute_against_triton(tmp_path: Path):
    triton = qualify(tmp_path / "triton.json", "triton", 1.0)
    cute = qualify(tmp_path / "cute.json", "cute", 2.0)
    comparison = compare_paths(triton, cute, across=["backend"])
    assert pairs(comparison) == [
        ("qualify, triton -> cute, NVIDIA H200", ["triton.json"], ["cute.json"])]
    assert comparison.across == ("backend",) and comparison.unmatched == []
    assert verdicts(comparison) == {
        ("qualify", "triton -> cute", TIMED_IDS[0]): "regressed",
        ("qualify", "triton -> cute", TIMED_IDS[1]): "regressed",
        ("qualify", "triton -> cute", CONTRACT_ID): "unchanged",
    }
    assert comparison.cases[0].ratio == pytest.approx(2.0, rel=0.02)
    assert comparison.pairing_heading() == "pairing by kind/device, across backend"


def test_a_folder_of_both_backends_against_one_backends_file(tmp_path: Path):
    """The folder's newest receipt is CuTe's; Triton's file is still judged by Triton's."""
    triton = qualify(tmp_path / "base" / "triton.json", "triton", 1.0,
                     created_at="2026-12-01T00:00:00Z")
    qualify(tmp_path / "base" / "cute.json", "cute", 2.0, contract="fail",
            created_at="2026-12-02T00:00:00Z")
    comparison = compare_paths(tmp_path / "base", triton)
    assert pairs(comparison) == [
        ("qualify, triton, NVIDIA H200", ["triton.json"], ["triton.json"])]
    assert unmatched(comparison) == [("BASE", "cute.json", "qualify, cute, NVIDIA H200")]
    assert set(verdicts(comparison).values()) == {"unchanged"}
    assert {case.backend for case in comparison.cases} == {"triton"}
    # Judged against the folder's newest Triton receipt, never a CuTe one: however the timings
    # of two runs compare, every case judged is a Triton case on both sides.
    assert all(json.loads(Path(p.receipt.path).read_text())["config"]["backend"] == "triton"
               for p in comparison.pairs[0].base.used)


def test_folder_against_folder_pairs_each_backend_with_its_own(tmp_path: Path):
    for side, cute_ms in (("base", 2.0), ("head", 1.0)):
        qualify(tmp_path / side / "triton.json", "triton", 1.0)
        qualify(tmp_path / side / "cute.json", "cute", cute_ms)
        bench(tmp_path / side / "bench.json", {"triton": 1.0, "cute": cute_ms})
    comparison = compare_paths(tmp_path / "base", tmp_path / "head")
    assert pairs(comparison) == [
        ("bench, cute, NVIDIA H200", ["bench.json"], ["bench.json"]),
        ("bench, triton, NVIDIA H200", ["bench.json"], ["bench.json"]),
        ("qualify, cute, NVIDIA H200", ["cute.json"], ["cute.json"]),
        ("qualify, triton, NVIDIA H200", ["triton.json"], ["triton.json"]),
    ]
    assert comparison.unmatched == []
    assert verdicts(comparison) == {
        ("bench", "cute", "8192x8x1"): "improved", ("bench", "cute", "32768x8x1"): "improved",
        ("bench", "triton", "8192x8x1"): "unchanged",
        ("bench", "triton", "32768x8x1"): "unchanged",
        ("qualify", "cute", TIMED_IDS[0]): "improved",
        ("qualify", "cute", TIMED_IDS[1]): "improved",
        ("qualify", "cute", CONTRACT_ID): "unchanged",
        ("qualify", "triton", TIMED_IDS[0]): "unchanged",
        ("qualify", "triton", TIMED_IDS[1]): "unchanged",
        ("qualify", "triton", CONTRACT_ID): "unchanged",
    }
    notes = {(c.backend, c.id): c.note for c in comparison.cases if c.kind == "bench"}
    assert notes[("cute", "8192x8x1")].startswith(
        "graph: kdabench-cute; fla/kdabench-cute 0.50x -> 1.00x; ")
    assert notes[("triton", "8192x8x1")].startswith("graph: kdabench; fla/kdabench 1.00x -> ")


def test_bench_backends_are_paired_across_only_on_request(tmp_path: Path):
    triton = bench(tmp_path / "triton.json", {"triton": 1.0})
    cute = bench(tmp_path / "cute.json", {"cute": 3.0})
    with pytest.raises(CompareError, match="--across backend would pair them"):
        compare_paths(triton, cute)
    comparison = compare_paths(triton, cute, across=["backend"])
    assert pairs(comparison) == [
        ("bench, triton -> cute, NVIDIA H200", ["triton.json"], ["cute.json"])]
    assert set(verdicts(comparison).values()) == {"regressed"}


def test_bench_kernels_of_two_backends_compared_across(tmp_path: Path):
    triton = bench(tmp_path / "triton.json", {"triton": 1.0})
    both = bench(tmp_path / "both.json", {"triton": 1.0, "cute": 3.0})
    comparison = compare_paths(triton, both)
    assert pairs(comparison) == [
        ("bench, triton, NVIDIA H200", ["triton.json"], ["both.json"])]
    assert unmatched(comparison) == [("HEAD", "both.json", "bench, cute, NVIDIA H200")]
    with pytest.raises(CompareError, match="HEAD receipts of \\(bench, cute, NVIDIA H200\\) and "
                       "\\(bench, triton, NVIDIA H200\\) would pair with the same receipts"):
        compare_paths(triton, both, across=["backend"])


def test_a_side_with_two_backends_is_refused_across_backend(tmp_path: Path):
    qualify(tmp_path / "base" / "triton.json", "triton")
    qualify(tmp_path / "base" / "cute.json", "cute")
    cute = qualify(tmp_path / "head.json", "cute")
    with pytest.raises(CompareError, match="across backend, BASE receipts of .*cute.* and "
                       ".*triton.* would pair with the same receipts of the other side"):
        compare_paths(tmp_path / "base", cute, across=["backend"])


def test_a_receipt_without_a_backend_ran_triton(tmp_path: Path):
    old = qualify(tmp_path / "old.json", None)
    comparison = compare_paths(old, qualify(tmp_path / "triton.json", "triton"))
    assert pairs(comparison) == [("qualify, triton, NVIDIA H200", ["old.json"], ["triton.json"])]
    with pytest.raises(CompareError, match="nothing to compare"):
        compare_paths(old, qualify(tmp_path / "cute.json", "cute"))


# --------------------------------------------------------------------------- devices


def test_devices_are_paired_across_only_on_request(tmp_path: Path):
    h200 = qualify(tmp_path / "h200.json", "triton")
    h100 = qualify(tmp_path / "h100.json", "triton", device=H100)
    h100_cute = qualify(tmp_path / "h100-cute.json", "cute", device=H100)
    with pytest.raises(CompareError, match="--across device would pair them"):
        compare_paths(h200, h100)
    assert pairs(compare_paths(h200, h100, across=["device"])) == [
        ("qualify, triton, NVIDIA H200 -> NVIDIA H100", ["h200.json"], ["h100.json"])]
    with pytest.raises(CompareError, match="nothing to compare"):
        compare_paths(h200, h100_cute, across=["device"])
    both = compare_paths(h200, h100_cute, across=["device", "backend"])
    assert pairs(both) == [("qualify, triton -> cute, NVIDIA H200 -> NVIDIA H100",
                            ["h200.json"], ["h100-cute.json"])]
    assert both.pairing_heading() == "pairing by kind, across backend/device"


def test_an_unknown_across_field_is_refused(tmp_path: Path):
    receipt = qualify(tmp_path / "r.json", "triton")
    with pytest.raises(CompareError, match="cannot compare across kind"):
        compare_paths(receipt, receipt, across=["kind"])


# --------------------------------------------------------------------------- listing


def test_every_receipt_that_matches_nothing_is_listed(tmp_path: Path):
    base = tmp_path / "base"
    qualify(base / "triton.json", "triton")
    qualify(base / "cute.json", "cute")
    qualify(base / "h100.json", "triton", device=H100)
    bench(base / "bench.json", {"triton": 1.0, "cute": 2.0})
    head = qualify(tmp_path / "head.json", "triton")
    comparison = compare_paths(base, head)
    assert pairs(comparison) == [("qualify, triton, NVIDIA H200", ["triton.json"], ["head.json"])]
    assert unmatched(comparison) == [
        ("BASE", "bench.json", "bench, cute, NVIDIA H200"),
        ("BASE", "bench.json", "bench, triton, NVIDIA H200"),
        ("BASE", "cute.json", "qualify, cute, NVIDIA H200"),
        ("BASE", "h100.json", "qualify, triton, NVIDIA H100"),
    ]
    assert {u.reason for u in comparison.unmatched} == {NOT_PAIRED}
    lines = pairing_lines(comparison)
    assert lines[0] == f"qualify, triton, NVIDIA H200: BASE {base / 'triton.json'} against HEAD {head}"
    assert f"unmatched in BASE: {base / 'cute.json'} (qualify, cute, NVIDIA H200): {NOT_PAIRED}" \
        in lines
    assert len(lines) == 5
    markdown = render_markdown(comparison)
    assert "Pairing by kind/backend/device:" in markdown
    assert f"- unmatched in BASE: `{base / 'h100.json'}` (qualify, triton, NVIDIA H100): " \
           f"{NOT_PAIRED}" in markdown
    document = comparison.to_dict()["pairing"]
    assert document["by"] == ["kind", "backend", "device"] and document["across"] == []
    assert document["pairs"] == [{
        "kind": "qualify",
        "base": {"backend": "triton", "device": "NVIDIA H200",
                 "receipts": [str(base / "triton.json")], "superseded": []},
        "head": {"backend": "triton", "device": "NVIDIA H200", "receipts": [str(head)],
                 "superseded": []},
    }]
    assert document["unmatched"][2] == {
        "side": "BASE", "path": str(base / "cute.json"), "kind": "qualify", "backend": "cute",
        "device": "NVIDIA H200", "reason": NOT_PAIRED}


def test_the_newest_receipt_wins_a_case_within_its_backend_only(tmp_path: Path):
    """Triton's older receipts hold the cases; CuTe's newer one, with the same ids, is not
    Triton's newest."""
    base = tmp_path / "base"
    qualify(base / "triton-old.json", "triton", 2.0, contract="fail",
            created_at="2026-12-01T00:00:00Z")
    qualify(base / "triton-new.json", "triton", 1.0, created_at="2026-12-02T00:00:00Z")
    qualify(base / "triton-oldest.json", "triton", 5.0, created_at="2026-11-30T00:00:00Z")
    qualify(base / "cute-newest.json", "cute", 9.0, contract="fail",
            created_at="2026-12-03T00:00:00Z")
    head = qualify(tmp_path / "head.json", "triton", 1.0)
    comparison = compare_paths(base, head)
    assert pairs(comparison) == [
        ("qualify, triton, NVIDIA H200", ["triton-new.json"], ["head.json"])]
    assert [Path(p.receipt.path).name for p in comparison.pairs[0].base.superseded] == [
        "triton-oldest.json", "triton-old.json"]
    assert set(verdicts(comparison).values()) == {"unchanged"}
    assert any(w.startswith("BASE: 6 case(s) (qualify, triton, NVIDIA H200) appear in more "
                            "than one receipt") for w in comparison.warnings)
    assert pairing_lines(comparison)[0].endswith("(+2 superseded) against HEAD " + str(head))


def test_the_committed_folder_against_its_triton_receipt_pairs_triton_only():
    head = RESULTS / "qualify-nvidia-h200-20261203T150205.json"
    if not head.exists():
        pytest.skip("the committed Triton receipt is not in results/")
    comparison = compare_paths(RESULTS, head)
    assert [(pair.describe(), [Path(p.receipt.path).name for p in pair.head.used])
            for pair in comparison.pairs] == [("qualify, triton, NVIDIA H200", [head.name])]
    assert {case.backend for case in comparison.cases} == {"triton"}
    # Judged against the folder's newest Triton receipt, never a CuTe one: however the timings
    # of two runs compare, every case judged is a Triton case on both sides.
    assert all(json.loads(Path(p.receipt.path).read_text())["config"]["backend"] == "triton"
               for p in comparison.pairs[0].base.used)
    assert {"qualify, cute, NVIDIA H200", "bench, triton, NVIDIA H200"} <= {
        u.key.describe() for u in comparison.unmatched}


# --------------------------------------------------------------------------- imports


def test_the_compare_command_imports_no_gpu_stack_nor_scipy():
    code = ("import kdabench.cli.compare_cmd, sys; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in {'torch','triton','cutlass','scipy'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"
