"""The serve-sweep report's server table and shared-prefix section, from receipt fields."""

from __future__ import annotations

from pathlib import Path

from kdabench.report.serve_servers import server_lines, shared_prefix_lines

H200 = {"status": "reported", "device": "NVIDIA H200", "compute_capability": "9.0",
        "driver_version": "580.1", "backend": "kernel", "model": "kimi-linear-tp4",
        "retention": {"checkpoint_export": True, "block_tokens": 1024,
                      "max_batched_tokens": 8192, "cache_gib": 4.0},
        "torch": "2.11.0+cu130", "triton": "3.6.0"}


def test_server_lines_name_the_device_per_arm_and_unknown_servers():
    doc = {"config": {"servers": {"checkpoints": {"runs_on": H200},
                                  "vllm": {"runs_on": {"status": "unknown"}}}}}
    text = "\n".join(server_lines(doc))
    assert "| checkpoints | NVIDIA H200 | 9.0 | 580.1 | kernel · kimi-linear-tp4 |" in text
    assert "| 2.11.0+cu130 · 3.6.0 |" in text
    assert "| vllm | unknown (the server's /version does not say) |" in text
    assert server_lines({"config": {"servers": {"a": {}}}}) == []  # older receipts


def test_shared_prefix_lines_table_plot_and_skipped(tmp_path: Path):
    cases = [{"kind": "shared-prefix", "arm": arm, "total_tokens": 65536,
              "shared_tokens": 57344, "p2_ttft_ms": [p2] * 7, "p2_median_ms": p2,
              "p2_ci95_ms": [p2 - 1, p2 + 1], "p1_median_ms": 100.0}
             for arm, p2 in (("final-only", 100.0), ("checkpoints", 15.0))]
    doc = {"config": {"shared_prefix_skipped": [
        {"total_tokens": 131072, "shared_tokens": 4, "reason": "too long"}]}}
    lines, plots = shared_prefix_lines(doc, cases, tmp_path / "shared.png")
    text = "\n".join(lines)
    assert "| checkpoints | 65,536 | 57,344 | 7 | 15.0 | 14.0 – 16.0 | 100 |" in text
    assert "Skipped: 131072 tokens sharing 4 (too long)." in text
    assert plots == [tmp_path / "shared.png"] and plots[0].stat().st_size > 0
    assert shared_prefix_lines({}, [], tmp_path / "none.png") == ([], [])
