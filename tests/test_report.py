"""kdabench.report: Markdown and PNG reports of qualify, bench and serve-sweep receipts.

Receipts are built through kdabench.receipts (never written by hand) with seeded, realistic
samples; the committed qualification receipt in results/ is reported as well.
"""

from __future__ import annotations

import json
import random
import statistics
import struct
from pathlib import Path

import matplotlib.image
import pandas as pd
import pytest

from kdabench.receipts import (
    atomic_write_bytes,
    load_receipt,
    new_receipt,
    render_receipt,
    seal,
)
from kdabench.report import (
    COLUMNS,
    ReportError,
    bench_points,
    build_report,
    md_table,
    read_receipts,
    report_table,
    serve_point,
)
from kdabench.sources import source_hashes
from kdabench.stats import bootstrap_ci

RESULTS = Path(__file__).resolve().parent.parent / "results"
DEVICE = {
    "kind": "cuda", "device": "cuda:0", "name": "NVIDIA H200", "compute_capability": "9.0",
    "sm_count": 132, "total_memory_bytes": 150_000_000_000, "uuid": "GPU-0",
    "driver_version": "580.159.04", "cuda_runtime_version": "13.0",
}
CREATED = "2026-12-03T09:00:00Z"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- helpers


def samples_around(median_ms: float, count: int, spread: float, seed: int) -> list[float]:
    """Timing-like samples: log-normal around a median, a few slow outliers."""
    rng = random.Random(seed)
    values = [median_ms * rng.lognormvariate(0.0, spread) for _ in range(count)]
    values[0] *= 1.3  # the first timed call of a run is often slow
    return [round(v, 5) for v in values]


def builder(kind: str, config: dict | None = None):
    return new_receipt(kind, config=config or {}, command_line=["kdabench", kind],
                       device=DEVICE, sources=source_hashes(), created_at=CREATED)


def qualify_receipt(folder: Path, *, timed: bool = True, name: str | None = None) -> Path:
    """A qualify receipt like kdabench.qualify writes: contract, accuracy (one failing),
    fault cases; untimed (CPU tier) when timed is False."""
    receipt = builder("qualify", {"tier": "gpu" if timed else "cpu", "backend": "triton",
                                  "matrix_name": "default", "timing": {"warmup": 3, "reps": 15}})
    receipt.add_case({"id": "contract-plan-refuses-capacity-3", "index": 0,
                      "scenario": "contract", "verdict": "pass", "errors": {}, "checks": {},
                      "params": {"variant": "plan-refuses-capacity-3"}, "median_ms": None,
                      "samples_ms": [], "tolerances": {"output": 5e-3, "state": 3e-3}})
    index = 1
    layouts = {"R8": [15, 16, 17, 64, 100, 333, 512, 1000], "L8192x1": [8192]}
    for layout, lengths in layouts.items():
        for heads in (4, 8, 32):
            for capacity in (1, 4):
                tokens = sum(lengths)
                median = 0.05 + tokens * heads * (1.0 + 0.1 * capacity) * 2e-6
                samples = samples_around(median, 15, 0.03, index) if timed else []
                failing = layout == "R8" and heads == 32 and capacity == 4
                output_error = 7.1e-3 if failing else 2.2e-3 - 1e-5 * index
                receipt.add_case({
                    "id": f"accuracy-C{capacity}-H{heads}-K128-{layout}-unaligned-precomputed-lb5",
                    "index": index, "scenario": "accuracy",
                    "verdict": "fail" if failing else "pass",
                    "message": "output error 7.100e-03 exceeds tolerance 5.0e-03"
                    if failing else None,
                    "params": {"capacity": capacity, "heads": heads, "head_dim": 128,
                               "layout": layout, "offsets": "unaligned", "seed": 0},
                    "shape": {"tokens": tokens, "num_seqs": len(lengths), "lengths": lengths},
                    "errors": {"output": output_error, "final_state": 1.2e-3,
                               "checkpoint": 1.3e-3},
                    "tolerances": {"output": 5e-3, "state": 3e-3},
                    "samples_ms": samples,
                    "median_ms": round(statistics.median(samples), 5) if samples else None,
                })
                index += 1
    for variant in ("duplicate-final", "slot-negative"):
        receipt.add_case({"id": f"fault-{variant}-C1-H8-K128-R8-unaligned-precomputed-lb5",
                          "index": index, "scenario": "fault", "verdict": "pass",
                          "params": {"capacity": 1, "heads": 8, "head_dim": 128,
                                     "layout": "R8", "variant": variant},
                          "shape": {"tokens": 2057}, "errors": {},
                          "checks": {"pool_unchanged": True},
                          "tolerances": {"output": 5e-3, "state": 3e-3},
                          "samples_ms": samples_around(0.25, 15, 0.02, index) if timed else [],
                          "median_ms": 0.25 if timed else None})
        index += 1
    return receipt.write(folder / (name or receipt.filename()))


BENCH_SHAPES = [  # T, H, sequences, fla ms, kdabench ms, floor ms
    (8192, 8, 1, 1.20, 0.38, 0.11), (8192, 32, 1, 3.10, 1.40, 0.42),
    (16384, 16, 1, 4.60, 1.90, 0.80), (32768, 8, 1, 4.70, 1.45, 0.43),
    (65536, 8, 1, 9.30, 2.80, 0.85),
]


def bench_receipt(folder: Path) -> Path:
    """One case per kernel and shape, plus one case in the per-kernel-mapping layout."""
    receipt = builder("bench", {"against": "fla", "dtype": "bf16"})
    for seed, (tokens, heads, seqs, fla_ms, ours_ms, floor_ms) in enumerate(BENCH_SHAPES):
        label = f"{tokens}x{heads}x{seqs}"
        for kernel, median in (("kdabench", ours_ms), ("fla", fla_ms)):
            samples = samples_around(median, 50, 0.02, 100 * seed + len(kernel))
            receipt.add_case({"id": f"{kernel}-{label}", "verdict": "pass", "kernel": kernel,
                              "shape": label, "T": tokens, "H": heads, "seqs": seqs,
                              "samples_ms": samples, "median_ms": statistics.median(samples),
                              "floor_ms": floor_ms})
    receipt.add_case({"id": "shape-8192x8x4x2048", "verdict": "pass",
                      "shape": {"label": "8192x8x(4x2048)", "T": 8192, "H": 8, "seqs": 4},
                      "kernels": {"kdabench": {"median_ms": 0.41,
                                               "samples_ms": samples_around(0.41, 50, 0.02, 7)},
                                  "fla": {"median_ms": 1.25,
                                          "samples_ms": samples_around(1.25, 50, 0.02, 8)}},
                      "floor_ms": 0.11})
    return receipt.write(folder / receipt.filename())


ARMS = ("baseline", "export", "prefix-cache", "export+prefix-cache")
PROMPTS = (8192, 16384, 32768)


def serve_receipt(folder: Path, baseline: str | None = None) -> Path:
    """Cases as kdabench.sweep writes them: server and probe records, cold-TTFT cells per arm
    and prompt size (intervals recorded for some arms, absent for others), one decode window
    per arm (with its own TTFT, which is not a cold-TTFT cell), and one arm whose activation
    checks failed; `baseline` as the sweep's options record it."""
    receipt = builder("serve-sweep", {"arms": list(ARMS), "samples": 7,
                                      "options": {"baseline": baseline, "seed": 0}})
    for a, arm in enumerate(ARMS):
        valid = arm != "prefix-cache"
        receipt.add_case({"id": f"server/{arm}", "kind": "server", "arm": arm,
                          "verdict": "pass" if valid else "fail",
                          "message": "activated" if valid else "activation patterns failed"})
        receipt.add_case({"id": f"probe/{arm}", "kind": "probe", "arm": arm, "verdict": "pass",
                          "prompt_tokens": 1024, "message": "passed"})
        speedup = 1.0 + 0.25 * a
        for prompt in PROMPTS:
            median = prompt / (9000.0 * speedup) * 1000.0
            samples = samples_around(median, 7, 0.04, a * 10 + prompt)
            case = {"id": f"cold/{arm}/{prompt}", "kind": "cold-ttft", "arm": arm,
                    "verdict": "pass" if valid else "fail", "prompt_tokens_requested": prompt,
                    "prompt_tokens": prompt + 3, "samples_ms": samples,
                    "median_ms": statistics.median(samples), "valid": valid,
                    "message": "7 cold samples"}
            if a % 2 == 0:
                case["ci95_ms"] = list(bootstrap_ci(samples, seed=1))
            receipt.add_case(case)
        tokens_per_s = 106.6 - 2.6 * a
        receipt.add_case({"id": f"decode/{arm}", "kind": "decode", "arm": arm,
                          "verdict": "pass", "prompt_tokens": 256, "ttft_ms": 31.0,
                          "output_tokens": 213, "tokens_per_s": tokens_per_s,
                          "acceptance_length": 2.6, "steps_per_s": tokens_per_s / 2.6,
                          "valid": valid})
    return receipt.write(folder / receipt.filename())


def unknown_kind_receipt(folder: Path) -> Path:
    """A sealed receipt of a kind this kdabench does not know (as a newer one might write)."""
    receipt = builder("qualify")
    receipt.add_case({"id": "soak-24h", "verdict": "pass", "message": "no error in 24 hours"})
    document = receipt.document()
    document["kind"] = "soak"
    path = folder / "soak-nvidia-h200-20261203T090000.json"
    atomic_write_bytes(path, render_receipt(seal(document)))
    return path


def tamper(path: Path) -> None:
    raw = path.read_bytes()
    assert b'"verdict": "fail"' in raw
    path.write_bytes(raw.replace(b'"verdict": "fail"', b'"verdict": "pass"', 1))


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; fails unless the file is a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def assert_real_image(path: Path) -> None:
    width, height = png_size(path)
    assert width >= 600 and height >= 400, (width, height)
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width)
    assert pixels.std() > 0.05, f"{path} is (nearly) one flat colour"
    assert path.stat().st_size > 20_000


def case_ids(path: Path) -> list[str]:
    return [case["id"] for case in load_receipt(path)["cases"]]


# --------------------------------------------------------------------------- committed receipts


def test_the_committed_receipts_are_reported_with_every_case_and_a_plot(tmp_path: Path):
    committed = sorted(RESULTS.glob("*.json"))
    assert committed, "results/ holds no receipt"
    result = build_report([RESULTS], tmp_path / "report")

    text = result.markdown_path.read_text(encoding="utf-8")
    assert result.markdown_path == tmp_path / "report" / "report.md"
    for receipt in committed:
        for case_id in case_ids(receipt):
            assert f"`{case_id}`" in text, case_id
    assert len(result.plots) >= 1
    for plot in result.plots:
        assert plot.parent == tmp_path / "report"
        assert_real_image(plot)
        assert f"]({plot.name})" in text  # linked beside the report
    assert "NOT VERIFIED" not in text
    assert "#### Summary by scenario" in text and "#### Summary by axis" in text


def test_each_committed_qualify_receipt_summary_counts_its_cases(tmp_path: Path):
    receipts = sorted(RESULTS.glob("qualify-nvidia-h200-*.json"))
    assert receipts, "results/ holds no H200 qualify receipt"
    for number, committed in enumerate(receipts):
        cases = json.loads(committed.read_text(encoding="utf-8"))["cases"]
        result = build_report([committed], tmp_path / str(number))
        text = result.markdown_path.read_text(encoding="utf-8")
        for scenario in ("accuracy", "fault"):
            count = sum(case["scenario"] == scenario for case in cases)
            assert count > 0 and f"| {scenario} | {count} | {count} | 0 | 0 | 0 |" in text
        assert f"{len(cases)} cases: {len(cases)} pass, 0 fail, 0 error, 0 skip" in text


# --------------------------------------------------------------------------- qualify


def test_a_qualify_report_marks_the_failing_case_and_its_error_against_the_tolerance(
    tmp_path: Path,
):
    path = qualify_receipt(tmp_path)
    result = build_report([path], tmp_path / "out", title="H200 nightly")
    text = result.markdown_path.read_text(encoding="utf-8")

    assert text.startswith("# H200 nightly\n")
    for case_id in case_ids(path):
        assert f"`{case_id}`" in text
    failing = "`accuracy-C4-H32-K128-R8-unaligned-precomputed-lb5`"
    row = next(line for line in text.splitlines() if failing in line)
    assert "**FAIL**" in row and "7.10e-03 (142%)" in row and "exceeds tolerance" in row
    # by scenario: 12 accuracy cases, one failing, worst output error 142% of tolerance
    assert "| accuracy | 12 | 11 | 1 | 0 | 0 | 7.10e-03 (142%) | 1.30e-03 (43%) |" in text
    assert "| contract | 1 | 1 | 0 | 0 | 0 | - | - | - |" in text
    # by axis: the axes that vary (heads, capacity, layout), not seed or variant
    assert "| heads | 32 |" in text and "| capacity | 4 |" in text
    assert "| layout | R8 |" in text and "| seed |" not in text and "| variant |" not in text
    (plot,) = result.plots
    assert plot.name.endswith("-kernel-time.png")
    assert_real_image(plot)


def test_an_untimed_cpu_tier_receipt_gets_no_plot_and_says_why(tmp_path: Path):
    path = qualify_receipt(tmp_path, timed=False)
    result = build_report([path], tmp_path / "out")
    assert result.plots == []
    text = result.markdown_path.read_text(encoding="utf-8")
    assert "the CPU tier does not time" in text
    assert all(f"`{case_id}`" in text for case_id in case_ids(path))


# --------------------------------------------------------------------------- bench


def test_bench_points_read_one_kernel_per_case_and_per_kernel_mappings():
    (point,) = bench_points({"id": "a", "verdict": "pass", "T": 8192, "H": 8, "seqs": 1,
                             "median_ms": 0.4, "floor_ms": 0.1})
    assert (point.kernel, point.tokens, point.heads, point.median_ms, point.floor_ms) == \
        ("kdabench", 8192, 8, 0.4, 0.1)
    assert point.shape == "8,192x8x1"
    mapped = bench_points({"id": "b", "verdict": "pass", "shape": "16384x16x1",
                           "tokens": 16384, "heads": 16, "median_ms": {"kdabench": 1.9,
                                                                        "fla": 4.6}})
    assert {(p.kernel, p.median_ms, p.shape) for p in mapped} == \
        {("kdabench", 1.9, "16384x16x1"), ("fla", 4.6, "16384x16x1")}
    from_samples = bench_points({"id": "c", "verdict": "pass", "kernel": "fla",
                                 "kernels": {"fla": {"samples_ms": [1.0, 3.0, 2.0]}}})
    assert from_samples[0].median_ms == 2.0 and from_samples[0].tokens is None


def test_a_bench_report_tables_each_shape_with_the_ratio_and_the_floor(tmp_path: Path):
    path = bench_receipt(tmp_path)
    result = build_report([path], tmp_path / "out")
    text = result.markdown_path.read_text(encoding="utf-8")

    for case_id in case_ids(path):
        assert f"`{case_id}`" in text
    assert "| shape | T | H | kdabench (ms) | fla (ms) | fla / kdabench | floor (ms) |" in text
    row = next(line for line in text.splitlines() if line.startswith("| 8192x8x1 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    ratio = float(cells[5].removesuffix("x"))
    assert 2.8 < ratio < 3.5  # fla 1.20 ms against kdabench 0.38 ms, from noisy samples
    assert cells[6] == "0.110"
    assert any(line.startswith("| 8192x8x(4x2048) |") and "3.05x" in line
               for line in text.splitlines())
    (plot,) = result.plots
    assert plot.name.endswith("-bench-time.png")
    assert_real_image(plot)


def test_a_bench_report_names_the_mode_the_export_overhead_and_where_the_time_goes(
        tmp_path: Path):
    """A case in the layout `kdabench bench --breakdown` writes: every mode's samples, the
    primary mode's per kernel, the export overhead per mode, each kernel's GPU breakdown."""
    def timing(median_ms: float, seed: int) -> dict:
        samples = samples_around(median_ms, 30, 0.02, seed)
        return {"median_ms": statistics.median(samples), "samples_ms": samples}

    modes = {"graph": {"kdabench": timing(0.41, 1), "fla": timing(0.42, 2),
                       "kdabench-c1": timing(0.40, 3)},
             "eager": {"kdabench": timing(0.42, 4), "fla": timing(0.68, 5),
                       "kdabench-c1": timing(0.41, 6)}}
    receipt = builder("bench", {"against": "fla"})
    receipt.add_case({
        "id": "8192x8x1", "verdict": "pass", "shape": "8192x8x1", "T": 8192, "H": 8, "seqs": 1,
        "modes": modes, "primary_mode": "graph", "kernels": modes["graph"], "floor_ms": 0.024,
        "export_overhead": {"graph": 0.028, "eager": 0.026},
        "breakdown": {"kdabench": {"calls": 10, "gpu_us": 407.0, "kernels_us": {
                          "kda_chunk_blocks_kernel": 133.0, "kda_state_pass_kernel": 138.0,
                          "kda_validate_kernel": 3.0}},
                      "fla": {"calls": 10, "gpu_us": 379.0, "kernels_us": {
                          "chunk_gated_delta_rule_fwd_kernel_h": 193.0,
                          "chunk_gla_fwd_kernel_o": 38.0}}},
    })
    path = receipt.write(tmp_path / receipt.filename())
    text = build_report([path], tmp_path / "out").markdown_path.read_text(encoding="utf-8")
    assert "Medians of CUDA-graph replay" in text
    row = next(line for line in text.splitlines() if line.startswith("| 8192x8x1 | 8,192"))
    assert row.rstrip(" |").endswith("+2.8%")
    assert "#### Where the GPU time goes" in text and "over 10 eager calls" in text
    assert ("| 8192x8x1 | kdabench | 407 | kda_state_pass_kernel 138, kda_chunk_blocks_kernel "
            "133, kda_validate_kernel 3 |") in text
    assert "| 8192x8x1 | fla | 379 | chunk_gated_delta_rule_fwd_kernel_h 193," in text


def test_a_bench_report_keeps_each_gate_regime_apart(tmp_path: Path):
    """Cases of one shape under two gate regimes: a row and a plot per regime, the export
    overhead of each, and the regime in the cases table."""
    receipt = builder("bench", {"against": "fla"})
    for gates, ours, fla, overhead in (("long-memory", 0.40, 0.42, 0.021),
                                       ("fast-decay", 0.20, 0.41, 0.034)):
        kernels = {name: {"median_ms": ms, "samples_ms": samples_around(ms, 20, 0.02, 3)}
                   for name, ms in (("kdabench", ours), ("fla", fla))}
        receipt.add_case({
            "id": f"8192x8x1/{gates}", "verdict": "pass", "shape": "8192x8x1", "T": 8192,
            "H": 8, "seqs": 1, "gates": {"name": gates}, "modes": {"graph": kernels},
            "primary_mode": "graph", "kernels": kernels, "floor_ms": 0.024,
            "export_overhead": {"graph": overhead}})
    path = receipt.write(tmp_path / receipt.filename())
    result = build_report([path], tmp_path / "out")
    text = result.markdown_path.read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()
            if line.startswith(("| long-memory | 8192x8x1", "| fast-decay | 8192x8x1"))}
    assert set(rows) == {"long-memory", "fast-decay"}
    assert "1.05x" in rows["long-memory"] and rows["long-memory"].rstrip(" |").endswith("+2.1%")
    assert "2.05x" in rows["fast-decay"] and rows["fast-decay"].rstrip(" |").endswith("+3.4%")
    assert sorted(plot.stem.rsplit("-time-", 1)[1] for plot in result.plots) == [
        "fast-decay", "long-memory"]
    for plot in result.plots:
        assert_real_image(plot)
    table = report_table([path]).set_index("case")
    assert table.loc["8192x8x1/fast-decay"].gates == "fast-decay"
    assert table.loc["8192x8x1/long-memory"].gates == "long-memory"


def test_a_bench_report_without_breakdown_or_overhead_leaves_them_out(tmp_path: Path):
    text = build_report([bench_receipt(tmp_path)], tmp_path / "out").markdown_path.read_text(
        encoding="utf-8")
    assert "Where the GPU time goes" not in text and "export overhead" not in text
    assert "Medians of" not in text


# --------------------------------------------------------------------------- serve-sweep


def test_serve_point_reads_nested_and_flat_fields():
    nested = serve_point({"id": "x", "verdict": "pass", "arm": "A", "prompt_tokens": 8192,
                          "ttft_ms": {"samples": [900.0, 1000.0, 1100.0],
                                      "ci": {"low": 880.0, "high": 1120.0}}})
    assert nested.median_ms == 1000.0 and nested.ci_ms == (880.0, 1120.0)
    assert not nested.ci_computed
    assert nested.rate_tok_s == pytest.approx(8192.0)
    flat = serve_point({"id": "y", "verdict": "pass", "arm": "B", "prompt_size": 4096,
                        "samples_ms": [400.0, 420.0, 410.0, 415.0]})
    assert flat.median_ms == pytest.approx(412.5) and flat.ci_computed
    assert flat.ci_ms[0] <= 412.5 <= flat.ci_ms[1]
    assert not flat.has_decode
    decode = serve_point({"id": "decode/A", "kind": "decode", "verdict": "pass", "arm": "A",
                          "ttft_ms": 31.0, "tokens_per_s": 52.0, "acceptance_length": 2.0})
    assert not decode.has_ttft and decode.steps_per_s == 26.0


def test_a_serve_sweep_report_has_ttft_with_intervals_a_plot_and_decode_rates(tmp_path: Path):
    path = serve_receipt(tmp_path)
    result = build_report([path], tmp_path / "out")
    text = result.markdown_path.read_text(encoding="utf-8")
    lines = text.splitlines()

    for case_id in case_ids(path):
        assert f"`{case_id}`" in text
    assert "| arm | prompt tokens | samples | median TTFT (ms) | 95% CI (ms) |" in text
    ttft_rows = [line for line in lines if " – " in line]  # the rows with an interval
    assert len(ttft_rows) == len(ARMS) * len(PROMPTS)  # decode windows are not TTFT cells
    export = [line for line in ttft_rows if line.startswith("| export |")]
    assert len(export) == len(PROMPTS)
    assert all("(bootstrap here)" in row for row in export)  # arm 1 recorded no interval
    assert not any("(bootstrap here)" in row for row in ttft_rows
                   if row.startswith("| baseline |"))
    assert all("**NOT VALID**" in row for row in ttft_rows if row.startswith("| prefix-cache |"))
    # the prompt rate is the recorded one: actual prompt tokens over the median
    baseline_8k = next(row for row in ttft_rows if row.startswith("| baseline | 8,192 |"))
    assert "| yes |" in baseline_8k
    assert "#### Decode rates" in text
    assert "| baseline | 256 | 106.60 | 2.60 | 41.00 | yes |" in text
    (plot,) = result.plots
    assert plot.name.endswith("-ttft.png")
    assert_real_image(plot)


def test_a_serve_sweep_report_reads_each_arm_against_the_baseline(tmp_path: Path):
    text = build_report([serve_receipt(tmp_path, baseline="baseline")],
                        tmp_path / "out").markdown_path.read_text(encoding="utf-8")
    section = text.split("#### Against baseline", 1)[1].split("####", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| export |")]
    assert [row.split(" | ")[1] for row in rows] == [f"{p} tokens" for p in PROMPTS]
    for row in rows:  # export runs 1.25x faster: its median over the baseline's is about 0.8
        ratio, interval = row.rstrip(" |").split(" | ")[-2:]
        low, high = (float(v) for v in interval.split(" – "))
        assert 0.7 < float(ratio) < 0.9 and low <= float(ratio) <= high
    assert "| prefix-cache |" not in section  # its cells are not valid
    plain = build_report([serve_receipt(tmp_path / "plain")], tmp_path / "plain-out")
    assert "#### Against" not in plain.markdown_path.read_text(encoding="utf-8")


def test_a_serve_sweep_report_says_which_cells_are_unverified(tmp_path: Path):
    """Cold cells the server did not show cold are recorded as verdict skip with status
    "unverified"; the report says so in words, never as a pass."""
    receipt = builder("serve-sweep", {"arms": ["plain", "vllm"]})
    for arm, verified in (("plain", False), ("vllm", True)):
        samples = samples_around(400.0, 5, 0.04, 7)
        receipt.add_case({"id": f"cold/{arm}/8192", "kind": "cold-ttft", "arm": arm,
                          "verdict": "pass" if verified else "skip",
                          **({} if verified else {"status": "unverified"}),
                          "prompt_tokens_requested": 8192, "samples_ms": samples,
                          "median_ms": statistics.median(samples), "valid": True,
                          "message": "5 cold samples" if verified else "unverified: 5 cold "
                          "samples, 5 of them cold by construction (unique from the first "
                          "token), not verified by the server"})
    receipt.add_case({"id": "skipped/other", "verdict": "skip", "message": "not run"})
    path = receipt.write(tmp_path / receipt.filename())
    text = build_report([path], tmp_path / "out").markdown_path.read_text(encoding="utf-8")
    rows = text.splitlines()
    plain = next(row for row in rows if row.startswith("| plain | 8,192 |"))
    vllm = next(row for row in rows if row.startswith("| vllm | 8,192 |"))
    assert plain.endswith("| **unverified** |") and vllm.endswith("| yes |")
    assert "not verified by the server" in text and "cold by construction" in text
    cases = {row.split(" | ")[1]: row for row in rows if row.startswith("| ") and "`" in row}
    assert "| unverified | plain |" in cases["`cold/plain/8192`"]
    assert "| pass | vllm |" in cases["`cold/vllm/8192`"]
    assert "| skip |" in cases["`skipped/other`"]  # a plain skip stays a skip


# --------------------------------------------------------------------------- several receipts


def test_one_report_covers_every_kind_and_lists_unknown_ones(tmp_path: Path):
    folder = tmp_path / "receipts"
    paths = [qualify_receipt(folder), bench_receipt(folder), serve_receipt(folder),
             unknown_kind_receipt(folder)]
    result = build_report([folder], tmp_path / "out")
    text = result.markdown_path.read_text(encoding="utf-8")

    for path in paths:
        for case_id in case_ids(path):
            assert f"`{case_id}`" in text, case_id
    assert result.unknown_kinds == ["soak"]
    assert "Kind `soak` is not one this report knows" in text
    assert len(result.plots) == 3 and len({p.name for p in result.plots}) == 3
    assert result.paths[0] == result.markdown_path
    assert {r["kind"] for r in result.to_dict()["receipts"]} == \
        {"qualify", "bench", "serve-sweep", "soak"}


def test_receipts_with_one_file_name_in_two_folders_get_distinct_plots(tmp_path: Path):
    first = qualify_receipt(tmp_path / "main", name="qualify.json")
    second = qualify_receipt(tmp_path / "head", name="qualify.json")
    result = build_report([first, second], tmp_path / "out")
    assert [p.name for p in result.plots] == ["qualify-kernel-time.png",
                                              "qualify-2-kernel-time.png"]


# --------------------------------------------------------------------------- verification


def test_a_receipt_that_fails_verification_is_rendered_and_marked(tmp_path: Path):
    path = qualify_receipt(tmp_path)
    tamper(path)
    result = build_report([path], tmp_path / "out")
    text = result.markdown_path.read_text(encoding="utf-8")
    assert [r.path for r in result.unverified] == [path]
    assert "**Warning: 1 receipt(s) fail verification**" in text
    assert "> **NOT VERIFIED.**" in text and "sha256 mismatch" in text
    assert all(f"`{case_id}`" in text for case_id in case_ids(path))


def test_require_verified_refuses_a_tampered_receipt_and_writes_nothing(tmp_path: Path):
    good, bad = qualify_receipt(tmp_path / "a"), qualify_receipt(tmp_path / "b")
    tamper(bad)
    with pytest.raises(ReportError, match="refusing 1 receipt"):
        build_report([good, bad], tmp_path / "out", require_verified=True)
    assert not (tmp_path / "out").exists()
    build_report([good], tmp_path / "out", require_verified=True)
    assert (tmp_path / "out" / "report.md").is_file()


def test_sources_that_differ_from_the_tree_in_hand_are_noted(tmp_path: Path):
    path = qualify_receipt(tmp_path)
    current = dict(source_hashes())
    changed = min(current)
    current[changed] = "0" * 64
    result = build_report([path], tmp_path / "out", current_sources=current)
    text = result.markdown_path.read_text(encoding="utf-8")
    assert "- sources: differ from the tree in hand" in text and changed in text
    assert result.unverified == []  # other sources are a note, not a failed verification


# --------------------------------------------------------------------------- the cases table


TABLE_COLUMNS = ["receipt", "kind", "backend", "device", "verified", "case", "verdict",
                 "scenario", "arm", "kernel", "mode", "gates", "tokens", "seqs", "heads",
                 "head_dim", "prompt_tokens", "median_ms", "ci_low_ms", "ci_high_ms", "n_samples"]


def test_the_table_has_a_row_per_case_per_receipt_and_the_documented_columns(tmp_path: Path):
    folder = tmp_path / "receipts"
    paths = [qualify_receipt(folder), bench_receipt(folder), serve_receipt(folder),
             unknown_kind_receipt(folder)]
    table = report_table([folder])
    assert list(table.columns) == TABLE_COLUMNS == list(COLUMNS)
    assert table.groupby("receipt").size().to_dict() == {
        path.name: len(case_ids(path)) for path in paths}
    for path in paths:
        rows = table[table.receipt == path.name]
        assert list(rows.case) == case_ids(path)
    assert set(table.kind) == {"qualify", "bench", "serve-sweep", "soak"}
    assert table.verified.all() and set(table.device) == {"NVIDIA H200"}


def test_table_rows_carry_each_kinds_fields_and_the_bootstrap_of_the_raw_samples(
        tmp_path: Path):
    folder = tmp_path / "receipts"
    qualify, bench, serve = (qualify_receipt(folder), bench_receipt(folder),
                             serve_receipt(folder))
    table = report_table([folder]).set_index("case")
    cases = {case["id"]: case for path in (qualify, bench, serve)
             for case in load_receipt(path)["cases"]}

    timed = "accuracy-C4-H32-K128-R8-unaligned-precomputed-lb5"
    row, samples = table.loc[timed], cases[timed]["samples_ms"]
    assert (row.kind, row.backend, row.scenario, row.verdict) == (
        "qualify", "triton", "accuracy", "fail")
    assert (row.tokens, row.seqs, row.heads, row.head_dim) == (2057, 8, 32, 128)
    assert row.median_ms == statistics.median(samples) and row.n_samples == 15
    assert (row.ci_low_ms, row.ci_high_ms) == bootstrap_ci(samples)
    untimed = table.loc["contract-plan-refuses-capacity-3"]
    assert untimed.n_samples == 0 and untimed[["median_ms", "ci_low_ms"]].isna().all()

    fla = table.loc["fla-8192x32x1"]  # a bench case per kernel: that kernel's samples
    assert (fla.kernel, fla.tokens, fla.heads, fla.n_samples) == ("fla", 8192, 32, 50)
    assert fla.median_ms == statistics.median(cases["fla-8192x32x1"]["samples_ms"])
    mapped = table.loc["shape-8192x8x4x2048"]  # per-kernel mapping: kdabench's samples
    assert (mapped.kernel, mapped.n_samples) == ("kdabench", 50)
    assert mapped.median_ms == statistics.median(
        cases["shape-8192x8x4x2048"]["kernels"]["kdabench"]["samples_ms"])

    cold = table.loc["cold/baseline/16384"]  # its receipt records an interval of seed 1
    samples = cases["cold/baseline/16384"]["samples_ms"]
    assert (cold.scenario, cold.arm, cold.prompt_tokens, cold.n_samples) == (
        "cold-ttft", "baseline", 16384, 7)
    assert pd.isna(cold.backend)
    assert (cold.ci_low_ms, cold.ci_high_ms) == bootstrap_ci(samples)
    decode = table.loc["decode/baseline"]
    assert decode.scenario == "decode" and pd.isna(decode.median_ms) and decode.n_samples == 0


def test_a_committed_bench_receipt_is_tabled_by_its_first_backends_kernel():
    path = RESULTS / "bench-nvidia-h200-20261203T061909.json"
    doc = load_receipt(path)
    table = report_table([path])
    assert list(table.case) == [case["id"] for case in doc["cases"]]
    first = doc["cases"][0]
    samples = first["modes"][first["primary_mode"]]["kdabench"]["samples_ms"]
    row = table.iloc[0]
    assert (row.receipt, row.backend, row.kernel, row["mode"]) == (
        path.name, "triton", "kdabench", first["primary_mode"])
    assert row.n_samples == len(samples) and row.median_ms == statistics.median(samples)


def test_the_table_marks_an_unverified_receipt_or_refuses_it(tmp_path: Path):
    good, bad = qualify_receipt(tmp_path / "a"), qualify_receipt(tmp_path / "b")
    tamper(bad)
    table = report_table([good, bad])
    assert table.groupby("verified").size().to_dict() == {
        True: len(case_ids(good)), False: len(case_ids(bad))}
    with pytest.raises(ReportError, match="refusing 1 receipt"):
        report_table([good, bad], require_verified=True)


# --------------------------------------------------------------------------- bad input


def test_inputs_that_are_not_readable_receipts_raise_report_error(tmp_path: Path):
    with pytest.raises(ReportError, match="no such file or folder"):
        build_report([tmp_path / "absent.json"], tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="no \\*.json receipt"):
        read_receipts([tmp_path / "empty"])
    not_json = tmp_path / "notes.json"
    not_json.write_text("this is not JSON\n", encoding="utf-8")
    with pytest.raises(ReportError, match="not valid JSON"):
        build_report([not_json], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_file_named_twice_is_reported_once(tmp_path: Path):
    path = qualify_receipt(tmp_path)
    assert [receipt.path for receipt in read_receipts([path, tmp_path, path])] == [path]


def test_md_table_escapes_pipes_and_folds_newlines():
    table = md_table(["a", "b"], [["x|y", "one\ntwo"], [None, ""]])
    assert table.splitlines() == ["| a | b |", "| --- | --- |", "| x\\|y | one two |",
                                  "| - | - |"]
