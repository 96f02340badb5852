"""Qualification in worker processes: --workers N on the CPU tier (what runs here), the worker
command (no CLI), which worker runs which case, the GPU choice and worker environment of
--gpus, a dying worker, and --gpus on two GPUs (gpu)."""

from __future__ import annotations

import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from kdabench.cli.main import cli
from kdabench.matrix import load_matrix, parse_matrix
from kdabench.qualify import (
    MULTICAST_OFF,
    ParallelQualification,
    Qualification,
    QualifyError,
    WorkerFailed,
    default_workers,
    parse_gpus,
)
from kdabench.qualify.assign import COMPILE_S, compile_key, estimated_s, plan_workers
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
    # cases 0, 2, 3 share their kernels (capacity 1); 1 (capacity 2) and 4 (contract) do not
    assert [entry["shard"] for entry in config["merged_from"]] == [
        {"index": 1, "count": 2, "cases": [0, 2, 3]}, {"index": 2, "count": 2, "cases": [1, 4]}]
    assert all(entry["device"]["kind"] == "cpu" for entry in config["merged_from"])
    assert [w["shard"] for w in config["workers"]] == ["1/2", "2/2"]
    assert [w["cases"] for w in config["workers"]] == [3, 2]
    assert all(w["returncode"] == 0 and w["cuda_visible_devices"] is None
               for w in config["workers"])
    assert config["parallel"] == {"mode": "workers", "count": 2, "gpus": 0,
                                  "assignment": "compile groups, longest first",
                                  "multicast_off": MULTICAST_OFF}
    for case in merged["cases"]:
        assert case["compile_s"] == 0 and case["run_s"] == case["wall_s"] >= 0
    time = config["time"]
    assert time["workers"] == 2 and time["compile_s"] == 0
    assert time["cases_wall_s"] == round(sum(c["wall_s"] for c in merged["cases"]), 3)
    assert time["wall_s"] >= max(w["wall_s"] for w in config["workers"])
    assert not list((tmp_path / "w").glob(".*"))  # no temporary file left beside it


def test_a_dying_worker_fails_the_run_with_its_log_tail(tmp_path, tiny, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the kept work folder goes here
    def dies(self, worker):
        return [sys.executable, "-c",
                f"import sys; print('worker {worker.shard[0]} says boom'); sys.exit(3)"]

    monkeypatch.setattr(ParallelQualification, "worker_command", dies)
    result = invoke("qualify", "--workers", "2", "--matrix", tiny, "--out", tmp_path)
    assert result.exit_code == 1, result.output
    assert "worker 1 says boom" in result.stderr and "worker 2 says boom" in result.stderr
    assert "2 worker(s) failed" in result.stderr and "(exit 3)" in result.stderr
    assert not list(tmp_path.glob("qualify-*.json"))


def test_worker_failed_keeps_the_folder_and_names_the_worker(tmp_path, tiny, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    def second_dies(self, worker):
        code = 0 if worker.shard[0] == 1 else 5
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


def test_workers_are_capped_at_the_case_count_and_run_their_cases(tmp_path, tiny):
    run = ParallelQualification(parse_matrix(TINY), tier="cpu", workers=8,
                                contains="accuracy", matrix_path=tiny, out_dir=tmp_path)
    assert run.count == 2 and len(run.cases) == 2
    second = run._workers(tmp_path)[1]
    command = run.worker_command(second)
    assert command[:3] == [sys.executable, "-m", "kdabench.qualify.worker"]
    joined = " ".join(command)
    assert "kdabench.cli" not in joined and "qualify --" not in joined
    assert "--tier cpu" in joined and "--part 2/2" in joined and "--filter accuracy" in joined
    assert "--cases 1 " in joined and f"--out {second.folder}" in joined
    assert f"--matrix {tiny.resolve()}" in joined


@pytest.mark.parametrize("name", ["cute-s2", "cute-wgmma"])
def test_a_backend_name_is_checked_by_the_backend_it_runs_on(tmp_path, name):
    """cute-s2 and cute-wgmma run on the cute backend: taken where the matrix has it (the
    workers run them, as `kdabench qualify --backend cute-s2` on a GPU does), refused by
    that name where it has not."""
    run = ParallelQualification(load_matrix(None), tier="cpu", workers=1, backend=name,
                                out_dir=tmp_path)
    assert run.backend == name
    with pytest.raises(QualifyError, match=f"backend '{name}' is not in the matrix's backends"):
        ParallelQualification(parse_matrix(TINY), tier="cpu", workers=1, backend=name,
                              out_dir=tmp_path)


def test_the_worker_and_the_parallel_run_do_not_import_the_cli():
    code = ("import sys, kdabench.qualify.parallel, kdabench.qualify.worker; "
            "print(sorted(m for m in sys.modules if m.startswith('kdabench.cli')))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True)
    assert found.stdout.strip() == "[]", found.stdout


def test_a_worker_with_a_bad_case_list_exits_2_with_one_line(tmp_path, tiny):
    found = subprocess.run(
        [sys.executable, "-m", "kdabench.qualify.worker", "--tier", "cpu", "--backend",
         "triton", "--part", "1/1", "--cases", "0,99", "--matrix", str(tiny), "--out",
         str(tmp_path)], capture_output=True, text=True, env=worker_environment(None, 1),
        check=False)
    assert found.returncode == 2, found.stderr
    assert found.stderr.strip() == f"error: no cpu-tier case of {tiny} with index 99"
    assert not list(tmp_path.glob("qualify-*.json"))


# --------------------------------------------------------------------------- assignment


def test_every_case_runs_exactly_once_in_matrix_order():
    cases = load_matrix().expand("gpu")
    for workers in (1, 2, 3, 8, 16, 200):
        plan = plan_workers(cases, workers)
        assert 1 <= len(plan) <= min(workers, len(cases)) and all(plan)
        assert sorted(c.index for part in plan for c in part) == [c.index for c in cases]
        assert all([c.index for c in part] == sorted(c.index for c in part) for part in plan)


def test_the_plan_is_deterministic_whatever_the_input_order():
    cases = load_matrix().expand("gpu")
    shuffled = list(cases)
    random.Random(7).shuffle(shuffled)
    ids = [[c.id for c in part] for part in plan_workers(cases, 8)]
    assert ids == [[c.id for c in part] for part in plan_workers(shuffled, 8)]


def test_cases_of_one_compile_key_stay_in_one_worker():
    cases = load_matrix().expand("gpu")
    plan = plan_workers(cases, 8)
    owners: dict[tuple, set[int]] = {}
    for number, part in enumerate(plan):
        for case in part:
            owners.setdefault(compile_key(case), set()).add(number)
    # no group of the default matrix is more than an eighth of its estimated time
    assert all(len(workers) == 1 for workers in owners.values())
    assert len(owners) > 8  # more groups than workers: the test is not trivially true


LONG = """
schema = "kdabench.matrix.v1"
name = "long"
[layouts.LONG]
lengths = [65536]
[layouts.SHORT]
lengths = [16]

[[group]]
scenario = "accuracy"
tiers = ["gpu"]
heads = [4, 8, 16, 32]
layout = "LONG"

[[group]]
scenario = "accuracy"
tiers = ["gpu"]
heads = [4, 8, 16, 32]
capacity = [1, 2, 4]
offsets = ["aligned", "unaligned", "first", "last"]
layout = "SHORT"
"""


def test_long_cases_are_spread_and_a_group_too_big_for_one_worker_is_cut():
    cases = parse_matrix(LONG).expand("gpu")
    plan = plan_workers(cases, 4)
    longest = [next(i for i, part in enumerate(plan) if case in part)
               for case in cases if sum(case.lengths) == 65536]
    assert sorted(longest) == [0, 1, 2, 3]  # one 65536-token case per worker
    loads = [sum(estimated_s(c) for c in part) + COMPILE_S * len({compile_key(c) for c in part})
             for part in plan]
    assert max(loads) - min(loads) < max(estimated_s(c) for c in cases)
    same = [c for c in cases if c.params["heads"] == 4 and c.params["capacity"] == 1]
    single = plan_workers(same, 3)  # one key, three workers: cut in three
    assert len(single) == 3 and sorted(c.index for p in single for c in p) == sorted(
        c.index for c in same)


def test_default_workers():
    assert default_workers(1, 16) == 8 and default_workers(1, 2) == 1
    assert default_workers(1, 6) == 3 and default_workers(8, 128) == 8
    assert default_workers(4, 2) == 4  # at least one per GPU


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
    (["--gpus", "all", "--list"], "leave out --list"),
    (["--gpus", "all", "--tier", "cpu"], "--gpus runs the GPU tier"),
    (["--workers", "0", "--tier", "cpu"], "--workers must be at least 1"),
])
def test_bad_worker_options_exit_2(tiny, args, fragment):
    result = invoke("qualify", "--matrix", tiny, *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr and "Traceback" not in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_gpu_tier_workers_without_a_gpu_exit_2(tmp_path):
    result = invoke("qualify", "--tier", "gpu", "--workers", "2", "--out", tmp_path)
    assert result.exit_code == 2, result.output
    assert "--tier gpu needs a CUDA GPU" in result.stderr and "Traceback" not in result.output


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


# --------------------------------------------------------------------------- qualified status


def test_parts_of_workers_on_one_gpu_merge_into_a_receipt_that_qualifies(tmp_path):
    from kdabench.qualify import merge_qualify_receipts
    from kdabench.receipts import ReceiptError, new_receipt, render_receipt, seal
    from kdabench.receipts.qualified import qualification_status
    from kdabench.sources import source_hashes

    h200 = {"kind": "cuda", "device": "cuda:0", "name": "NVIDIA H200", "uuid": "GPU-0",
            "compute_capability": "9.0", "cpu_count": 16}
    config = {"tier": "gpu", "backend": "triton", "matrix_name": "default",
              "matrix_origin": "default", "matrix_sha256": "0" * 64, "filter": None}
    sources = source_hashes()
    parts = [[0, 3], [1, 2, 4]]
    docs = []
    for number, indices in enumerate(parts, start=1):
        shard = {"index": number, "count": 2, "cases": indices}
        builder = new_receipt("qualify", config={**config, "shard": shard}, device=h200,
                              sources=sources, command_line=["worker"],
                              created_at="2026-12-04T17:42:53Z")
        for index in indices:
            builder.add_case({"id": f"case-{index}", "index": index, "verdict": "pass",
                              "wall_s": 2.0, "compile_s": 1.5, "run_s": 0.5})
        builder.config["time"] = {"compile_s": 1.5 * len(indices), "backend_load_s": None}
        docs.append(builder.document())
    merged = merge_qualify_receipts(docs, labels=["gpu 0 · shard 1/2", "gpu 0 · shard 2/2"],
                                    wall_s=9.0)
    merged = seal({**merged, "config": {**merged["config"], "workers": [], "parallel": {}}})
    assert merged["status"] == "complete" and "shard" not in merged["config"]
    assert [c["index"] for c in merged["cases"]] == [0, 1, 2, 3, 4]
    time = merged["config"]["time"]
    assert (time["compile_s"], time["run_s"], time["cases_wall_s"]) == (7.5, 2.5, 10.0)
    assert time["wall_s"] == 9.0 and time["workers"] == 2
    (tmp_path / "merged.json").write_bytes(render_receipt(merged))
    status = qualification_status("NVIDIA H200", "triton", tmp_path, current_sources=sources)
    assert status.qualified, status.reason
    assert verify_receipt(merged).ok

    docs[1] = {**docs[1], "config": {**docs[1]["config"], "shard": {"index": 1, "count": 2}}}
    with pytest.raises(ReceiptError, match="the same shard appears twice"):
        merge_qualify_receipts([docs[0], seal(docs[1])])
