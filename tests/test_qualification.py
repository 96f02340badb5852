"""Qualification status over receipts built through the receipts library."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kdabench.kernels import Caps
from kdabench.receipts import merge_receipts, new_receipt, qualified, render_receipt
from kdabench.receipts.qualified import (
    NotQualifiedError,
    QualificationStatus,
    default_results_dir,
    kernel_hashes,
    qualification_status,
    qualified_plan,
)
from kdabench.sources import source_hashes

H200 = {
    "kind": "cuda", "device": "cuda:0", "name": "NVIDIA H200", "compute_capability": "9.0",
    "sm_count": 132, "total_memory_bytes": 150_000_000_000, "uuid": "GPU-0",
    "driver_version": "580.159.04", "cuda_runtime_version": "13.0",
    "cpu_model": "Intel Xeon", "cpu_count": 16,
}
CPU = {**dict.fromkeys(H200), "kind": "cpu", "device": "cpu", "name": "Intel Xeon",
       "cpu_model": "Intel Xeon", "cpu_count": 2}
CONFIG = {"tier": "gpu", "backend": "triton", "matrix_name": "default",
          "matrix_origin": "default", "matrix_sha256": "0" * 64, "matrix": {"name": "default"},
          "filter": None, "timing": {"warmup": 3, "reps": 15}}


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return source_hashes()


def write(folder: Path, *, sources: dict, device: dict = H200, config: dict | None = None,
          verdicts=("pass", "pass", "pass"), status: str = "complete",
          created_at: str = "2026-12-02T16:24:05Z", name: str | None = None) -> Path:
    builder = new_receipt("qualify", config=config or CONFIG, command_line=["kdabench"],
                          device=device, sources=sources, created_at=created_at)
    for index, verdict in enumerate(verdicts):
        builder.add_case({"id": f"case-{index}", "index": index, "scenario": "accuracy",
                          "verdict": verdict, "message": None if verdict == "pass" else "bad"})
    return builder.write(folder / (name or builder.filename()), status=status)


def status_of(folder: Path, sources: dict, device: str = "NVIDIA H200",
              backend: str = "triton") -> QualificationStatus:
    return qualification_status(device, backend, folder, current_sources=sources)


def test_a_passing_gpu_receipt_with_matching_sources_qualifies(tmp_path, sources):
    path = write(tmp_path, sources=sources)
    status = status_of(tmp_path, sources)
    assert status.qualified and status.receipt == path
    assert "every case passes on NVIDIA H200 (triton)" in status.reason
    assert status.to_dict() == {"qualified": True, "receipt": str(path), "reason": status.reason}


def test_the_installed_sources_are_the_default(tmp_path, sources):
    write(tmp_path, sources=sources)
    assert qualification_status("NVIDIA H200", "triton", tmp_path).qualified


@pytest.mark.parametrize(("change", "reason"), [
    ({"verdicts": ("pass", "fail", "pass")}, "has 1 of 3 cases not passing (case-1)"),
    ({"verdicts": ("pass", "error")}, "has 1 of 2 cases not passing"),
    ({"verdicts": ()}, "has 0 of 0 cases not passing"),
    ({"status": "partial"}, "is partial (an interrupted run)"),
    ({"config": {**CONFIG, "shard": "1/2"}}, "is shard 1/2 alone; merge the shards first"),
    ({"config": {**CONFIG, "filter": "fault"}}, "ran only the cases matching --filter 'fault'"),
    ({"config": {**CONFIG, "matrix_origin": "file"}}, "ran a custom matrix"),
])
def test_receipts_that_do_not_qualify_say_why(tmp_path, sources, change, reason):
    path = write(tmp_path, sources=sources, **change)
    status = status_of(tmp_path, sources)
    assert not status.qualified and status.receipt == path
    assert reason in status.reason


def test_a_changed_kernel_source_unqualifies(tmp_path, sources):
    kernel_file = next(iter(kernel_hashes(sources)))
    write(tmp_path, sources={**sources, kernel_file: "f" * 64})
    status = status_of(tmp_path, sources)
    assert not status.qualified
    assert "other kernel sources" in status.reason and kernel_file in status.reason


def test_an_added_kernel_file_unqualifies(tmp_path, sources):
    write(tmp_path, sources=sources)
    status = status_of(tmp_path, {**sources, "kernels/cute/new.py": "a" * 64})
    assert not status.qualified and "added: kernels/cute/new.py" in status.reason


def test_only_kernel_sources_count(tmp_path, sources):
    oracle_file = next(path for path in sources if path.startswith("oracles/"))
    write(tmp_path, sources={**sources, oracle_file: "0" * 64})
    assert status_of(tmp_path, sources).qualified


@pytest.mark.parametrize(("device", "backend", "fragment"), [
    ("NVIDIA GB10", "triton", "no GPU qualify receipt for 'NVIDIA GB10' / triton"),
    ("NVIDIA H200", "cute", "qualifies backend 'triton', not 'cute'"),
])
def test_other_device_or_backend(tmp_path, sources, device, backend, fragment):
    write(tmp_path, sources=sources)
    status = status_of(tmp_path, sources, device=device, backend=backend)
    assert not status.qualified and fragment in status.reason


def test_a_cpu_receipt_does_not_qualify(tmp_path, sources):
    write(tmp_path, sources=sources, device=CPU, config={**CONFIG, "tier": "cpu"})
    status = status_of(tmp_path, sources, device="Intel Xeon")
    assert not status.qualified and status.receipt is None
    assert "no GPU qualify receipt for 'Intel Xeon'" in status.reason


def test_an_edited_receipt_does_not_qualify(tmp_path, sources):
    path = write(tmp_path, sources=sources, verdicts=("pass", "fail"))
    path.write_bytes(path.read_bytes().replace(b'"verdict": "fail"', b'"verdict": "pass"'))
    status = status_of(tmp_path, sources)
    assert not status.qualified and "does not verify" in status.reason


def test_other_kinds_and_junk_are_skipped(tmp_path, sources):
    builder = new_receipt("bench", config=CONFIG, command_line=[], device=H200, sources=sources)
    builder.add_case({"id": "x", "verdict": "pass"})
    builder.write(tmp_path / "bench.json")
    (tmp_path / "notes.json").write_text("{not json")
    (tmp_path / "README.md").write_text("receipts live here\n")
    status = status_of(tmp_path, sources)
    assert not status.qualified and "(1 receipt(s) looked at)" in status.reason


def test_one_good_receipt_among_bad_ones_qualifies(tmp_path, sources):
    write(tmp_path, sources=sources, verdicts=("fail",), created_at="2026-12-03T10:00:00Z")
    sub = tmp_path / "nvidia-h200"
    sub.mkdir()
    good = write(sub, sources=sources, created_at="2026-12-01T10:00:00Z")
    status = status_of(tmp_path, sources)
    assert status.qualified and status.receipt == good


def test_merged_shards_qualify(tmp_path, sources):
    docs = []
    for index in (1, 2):
        builder = new_receipt("qualify", config={**CONFIG, "shard": f"{index}/2"},
                              command_line=[], device=H200, sources=sources,
                              created_at="2026-12-02T16:24:05Z")
        builder.add_case({"id": f"case-{index}", "index": index, "verdict": "pass"})
        docs.append(builder.document())
    merged = merge_receipts(docs)
    (tmp_path / "merged.json").write_bytes(render_receipt(merged))
    assert status_of(tmp_path, sources).qualified


def test_no_results_folder(tmp_path, sources):
    status = status_of(tmp_path / "absent", sources)
    assert not status.qualified and status.receipt is None
    assert "no results folder" in status.reason


def test_results_folder_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv(qualified.RESULTS_ENV, str(tmp_path))
    assert default_results_dir() == tmp_path
    monkeypatch.delenv(qualified.RESULTS_ENV)
    root = qualified.repository_dir()
    assert root is not None and (root / "kernels").is_dir()
    assert default_results_dir() == root / "results"


def test_env_results_folder_is_read(tmp_path, sources, monkeypatch):
    write(tmp_path, sources=sources)
    monkeypatch.setenv(qualified.RESULTS_ENV, str(tmp_path))
    assert qualification_status("NVIDIA H200", "triton", current_sources=sources).qualified


def test_qualified_plan_refuses_an_unqualified_device_when_required(tmp_path):
    caps = Caps(device="cpu", num_heads=1, head_dim=64, max_tokens=16, max_seqs=1,
                max_state_slots=2)
    with pytest.raises(NotQualifiedError, match="not a CUDA device"):
        qualified_plan(caps, require=True, results_dir=tmp_path)
    planned, status = qualified_plan(caps, results_dir=tmp_path)
    assert caps.backend == "auto" and not status.qualified
    assert planned.caps == dataclasses.replace(caps, backend="triton")  # no profile: Triton


def test_qualified_plan_accepts_a_qualified_device(tmp_path, sources, monkeypatch):
    write(tmp_path, sources=sources)
    monkeypatch.setattr(qualified, "device_name_of", lambda device: "NVIDIA H200")
    caps = Caps(device="cpu", num_heads=1, head_dim=64, max_tokens=16, max_seqs=1,
                max_state_slots=2)
    planned, status = qualified_plan(caps, require=True, results_dir=tmp_path)
    assert status.qualified and planned.caps == dataclasses.replace(caps, backend="triton")
    monkeypatch.setattr(qualified, "device_name_of", lambda device: "NVIDIA GB10")
    with pytest.raises(NotQualifiedError, match="GB10"):
        qualified_plan(caps, require=True, results_dir=tmp_path)
