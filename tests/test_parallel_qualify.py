"""Qualification in worker processes: --workers N on the CPU tier (what runs here), the GPU
choice and worker environment of --gpus, a dying worker, and --gpus on two GPUs (gpu)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from kdabench.cli.main import cli
from kdabench.matrix import parse_matrix
from kdabench.qualify import (
    MULTICAST_OFF,
    ParallelQualification,
    Qualification,
    QualifyError,
    WorkerFailed,
    parse_gpus,
)
from kdabench.qualify.parallel import worker_environment
from kdabench.receipts import load_receipt, verify_file, verify_receipt

TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")

TINY = """
schema = "kdabench.matrix.v1"
name = "tiny"
[layouts.R3]
lengths = [5, 16, 17]

[[group]]
scenario = "accuracy"
tiers = ["cpu"]
capacity = [1, 2]
heads = 1
layout = "R3"

[[group]]
scenario = "fault"
tiers = ["cpu"]
variant = ["duplicate-final", "offset-zero"]
heads = 1
layout = "R3"

[[group]]
scenario = "contract"
tiers = ["cpu"]
variant = ["decode-names-every-bit"]
"""


def invoke(*args: str | Path):
    return CliRunner().invoke(cli, [str(arg) for arg in args], prog_name="kdabench")


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def ids_and_verdicts(doc):
    return [(case["id"], case["index"], case["verdict"]) for case in doc["cases"]]


# --------------------------------------------------------------------------- --workers


@pytest.mark.interpreter
def test_two_cpu_workers_merge_to_the_one_process_run(tmp_path, tiny):
    result = invoke("qualify", "--workers", "2", "--matrix", tiny, "--out", tmp_path / "w")
    assert result.exit_code == 0, result.output
    assert "worker 1 · shard 1/2" in result.stderr and "worker 2 · shard 2/2" in result.stderr
    (path,) = (tmp_path / "w").glob("qualify-*.json")
    check = verify_file(path)
    assert check.ok and check.sources_match and check.status == "complete"
    merged = load_receipt(path)
    assert verify_receipt(merged).ok

    whole = Qualification(parse_matrix(TINY, origin=str(tiny)), tier="cpu",
                          out_dir=tmp_path / "one").run()
    whole_doc = load_receipt(whole.receipt_path)
    assert ids_and_verdicts(merged) == ids_and_verdicts(whole_doc)
    assert merged["summary"] == whole_doc["summary"] == {
        "total": 5, "pass": 5, "fail": 0, "error": 0, "skip": 0}

    config = merged["config"]
    assert "shard" not in config and config["tier"] == "cpu"
    assert [entry["shard"] for entry in config["merged_from"]] == ["1/2", "2/2"]
    assert all(entry["device"]["kind"] == "cpu" for entry in config["merged_from"])
    assert [w["shard"] for w in config["workers"]] == ["1/2", "2/2"]
    assert [w["cases"] for w in config["workers"]] == [3, 2]
    assert all(w["returncode"] == 0 and w["cuda_visible_devices"] is None
               for w in config["workers"])
    assert config["parallel"] == {"mode": "workers", "count": 2, "multicast_off": MULTICAST_OFF}
    assert not list((tmp_path / "w").glob(".*"))  # no temporary file left beside it


def test_a_dying_worker_fails_the_run_with_its_log_tail(tmp_path, tiny, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the kept work folder goes here
    def dies(self, shard, folder):
        return [sys.executable, "-c",
                f"import sys; print('worker {shard[0]} says boom'); sys.exit(3)"]

    monkeypatch.setattr(ParallelQualification, "worker_command", dies)
    result = invoke("qualify", "--workers", "2", "--matrix", tiny, "--out", tmp_path)
    assert result.exit_code == 1, result.output
    assert "worker 1 says boom" in result.stderr and "worker 2 says boom" in result.stderr
    assert "2 worker(s) failed" in result.stderr and "(exit 3)" in result.stderr
    assert not list(tmp_path.glob("qualify-*.json"))


def test_worker_failed_keeps_the_folder_and_names_the_worker(tmp_path, tiny, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    def second_dies(self, shard, folder):
        code = 0 if shard[0] == 1 else 5
        return [sys.executable, "-c", f"import sys; print('last words'); sys.exit({code})"]

    monkeypatch.setattr(ParallelQualification, "worker_command", second_dies)
    run = ParallelQualification(parse_matrix(TINY), tier="cpu", workers=2, out_dir=tmp_path)
    with pytest.raises(WorkerFailed) as caught:
        run.run(poll_s=0.05)
    # worker 1 exited 0 but left no receipt: it failed too
    assert [(label, code) for label, code, _ in caught.value.failures] == [
        ("worker 1 · shard 1/2", 0), ("worker 2 · shard 2/2", 5)]
    assert caught.value.failures[1][2] == "last words"
    assert caught.value.folder.parent == tmp_path
    assert (caught.value.folder / "shard2of2" / "worker.log").exists()


def test_workers_are_capped_at_the_case_count_and_run_their_shard(tmp_path, tiny):
    run = ParallelQualification(parse_matrix(TINY), tier="cpu", workers=8,
                                contains="accuracy", matrix_path=tiny, out_dir=tmp_path)
    assert run.count == 2 and len(run.cases) == 2
    command = run.worker_command((2, 2), tmp_path / "s")
    assert command[:4] == [sys.executable, "-m", "kdabench.cli.main", "qualify"]
    joined = " ".join(command)
    assert "--tier cpu" in joined and "--shard 2/2" in joined and "--filter accuracy" in joined
    assert f"--matrix {tiny.resolve()}" in joined and f"--out {tmp_path / 's'}" in joined


# --------------------------------------------------------------------------- GPUs, environment


def test_parse_gpus():
    assert parse_gpus("all", ["0", "1"]) == ["0", "1"]
    assert parse_gpus("1", ["0", "1"]) == ["1"]
    assert parse_gpus("0,1", ["4", "6"]) == ["4", "6"]  # inside an inherited CUDA_VISIBLE_DEVICES
    with pytest.raises(QualifyError, match=r"asks for GPU 1 but this machine has 1 GPU\(s\)"):
        parse_gpus("0,1", ["0"])
    with pytest.raises(QualifyError, match="torch sees none"):
        parse_gpus("all", [])
    with pytest.raises(QualifyError, match="names a GPU twice"):
        parse_gpus("0,0", ["0", "1"])
    with pytest.raises(QualifyError, match="expected 'all' or GPU indices"):
        parse_gpus("first", ["0"])


def test_worker_environment(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gpu = worker_environment("1", 2)
    assert gpu["CUDA_VISIBLE_DEVICES"] == "1" and "TRITON_INTERPRET" not in gpu
    cpu = worker_environment(None, 2)
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and cpu["TRITON_INTERPRET"] == "1"
    for env in (gpu, cpu):
        assert env["NCCL_NVLS_ENABLE"] == "0"
        assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
        assert env["NVSHMEM_DISABLE_NVLS"] == "1"


@pytest.mark.parametrize(("args", "fragment"), [
    (["--workers", "2", "--shard", "1/2"], "leave out --shard"),
    (["--workers", "2", "--gpus", "all"], "--gpus and --workers do not combine"),
    (["--workers", "2", "--tier", "gpu"], "--workers runs the CPU tier only"),
    (["--gpus", "all", "--tier", "cpu"], "--gpus runs the GPU tier"),
    (["--workers", "0"], "--workers must be at least 1"),
])
def test_bad_worker_options_exit_2(tiny, args, fragment):
    result = invoke("qualify", "--matrix", tiny, *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr and "Traceback" not in result.output


def test_more_gpus_than_the_machine_has_exit_2(tmp_path):
    asked = ",".join(str(i) for i in range(torch.cuda.device_count() + 1))
    result = invoke("qualify", "--gpus", asked, "--out", tmp_path)
    assert result.exit_code == 2, result.output
    assert ("this machine has" in result.stderr) or ("torch sees none" in result.stderr)


# --------------------------------------------------------------------------- two GPUs


GPU_TINY = """
schema = "kdabench.matrix.v1"
name = "gpu-tiny"
timing = { warmup = 1, reps = 3 }
[layouts.R8]
lengths = [1, 15, 16, 17, 64, 100, 200, 33]

[[group]]
scenario = "accuracy"
tiers = ["gpu"]
capacity = [1, 2, 4]
heads = 4
head_dim = 128
layout = "R8"

[[group]]
scenario = "fault"
tiers = ["gpu"]
variant = ["duplicate-final", "live-count-over-capacity"]
heads = 4
layout = "R8"
"""


@pytest.mark.gpu
@TWO_GPUS
def test_two_gpus_merge_to_the_one_gpu_run(tmp_path):
    path = tmp_path / "gpu-tiny.toml"
    path.write_text(GPU_TINY)
    result = invoke("qualify", "--gpus", "all", "--matrix", path, "--out", tmp_path / "m")
    assert result.exit_code == 0, result.output
    (merged_path,) = (tmp_path / "m").glob("qualify-*.json")
    merged = load_receipt(merged_path)
    assert verify_file(merged_path).ok
    whole = Qualification(parse_matrix(GPU_TINY), tier="gpu", out_dir=tmp_path / "one").run()
    assert ids_and_verdicts(merged) == ids_and_verdicts(load_receipt(whole.receipt_path))
    uuids = {entry["device"]["uuid"] for entry in merged["config"]["merged_from"]}
    assert len(uuids) == torch.cuda.device_count()
