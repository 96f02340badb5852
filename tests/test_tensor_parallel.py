"""The tensor-parallel case: two gloo ranks under the Triton interpreter (here), NCCL ranks on
two GPUs (gpu), and `kdabench qualify --tp N`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from kdabench.cli.main import cli
from kdabench.receipts import load_receipt, verify_file
from kdabench.tensor_parallel import SCENARIO, TpShape, free_port, run_tensor_parallel

TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


def invoke(*args: str | Path):
    return CliRunner().invoke(cli, [str(arg) for arg in args], prog_name="kdabench")


def assert_passes(result: dict, world_size: int) -> None:
    assert result["verdict"] == "pass", result["message"]
    checks = result["checks"]
    assert checks["output_bitwise_equal"] and checks["states_bitwise_equal"]
    assert checks["unwritten_slots_unchanged"]
    assert checks["error_codes"] == [0] * world_size and checks["one_process_error_code"] == 0
    assert 0 < result["errors"]["output"] <= 5e-3
    assert result["errors"]["final_state"] <= 3e-3 and result["errors"]["checkpoint"] <= 3e-3
    assert len(result["devices"]) == world_size


def test_two_gloo_ranks_equal_one_process_bit_for_bit():
    shape = TpShape(heads=4, head_dim=64, lengths=(5, 19), capacity=2)
    result = run_tensor_parallel(2, backend="gloo", device="cpu", shape=shape)
    assert_passes(result, 2)
    assert result["dist_backend"] == "gloo" and result["checks"]["heads_per_rank"] == 2
    assert result["checks"]["exported_states"] == 2 + 4  # two finals, two checkpoints each


def test_heads_that_do_not_split_are_refused():
    with pytest.raises(ValueError, match="3 heads do not split evenly over 2 ranks"):
        run_tensor_parallel(2, backend="gloo", device="cpu",
                            shape=TpShape(heads=3, head_dim=64, lengths=(5,), capacity=1))


def test_free_port_is_a_port():
    assert 0 < free_port() < 65536


def test_qualify_tp_writes_a_receipt(tmp_path):
    result = invoke("qualify", "--tp", "2", "--tier", "cpu", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("qualify-tp2-*.json")
    assert verify_file(path).ok
    doc = load_receipt(path)
    assert doc["kind"] == "qualify" and doc["status"] == "complete"
    config = doc["config"]
    assert config["scenario"] == SCENARIO and config["world_size"] == 2
    assert config["dist_backend"] == "gloo" and len(config["devices"]) == 2
    assert config["multicast_off"]["NCCL_NVLS_ENABLE"] == "0"
    (case,) = doc["cases"]
    assert case["scenario"] == SCENARIO and case["verdict"] == "pass"
    assert case["id"] == "tensor-parallel-W2-H2-K64-C2-L5.19-unaligned"
    assert case["checks"]["output_bitwise_equal"] and case["checks"]["states_bitwise_equal"]


@pytest.mark.parametrize(("args", "fragment"), [
    (["--tp", "2", "--workers", "2"], "--workers and --tp do not combine"),
    (["--tp", "2", "--filter", "x"], "--tp runs one fixed case"),
    (["--tp", "0", "--tier", "cpu"], "--tp must be at least 1"),
])
def test_bad_tp_options_exit_2(tmp_path, args, fragment):
    result = invoke("qualify", "--out", tmp_path, *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr


def test_tp_on_more_gpus_than_there_are_exit_2(tmp_path):
    ranks = str(torch.cuda.device_count() + 1)
    result = invoke("qualify", "--tp", ranks, "--tier", "gpu", "--out", tmp_path)
    assert result.exit_code == 2, result.output
    assert f"needs {ranks} GPUs" in result.stderr


@pytest.mark.gpu
@TWO_GPUS
def test_two_nccl_ranks_equal_one_gpu_bit_for_bit():
    result = run_tensor_parallel(2, backend="nccl", device="cuda")
    assert_passes(result, 2)
    assert result["dist_backend"] == "nccl"
    assert len({identity["uuid"] for identity in result["devices"]}) == 2
