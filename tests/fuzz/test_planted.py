"""A planted defect is found, shrunk and replayed; the high-slot path runs on the CPU with a
low line; the campaign's counts add up; a CPU rig plans one V block per program."""

from __future__ import annotations

import json

import pytest
import torch

from kdabench.fuzz import CPU_LIMITS, Campaign, replay
from kdabench.fuzz.cases import Rigs, Shape
from kdabench.fuzz.check import default_target, run_set
from kdabench.fuzz.generate import valid_set
from kdabench.fuzz.receipt import run_campaign
from kdabench.kernels import MetadataFault, run
from kdabench.receipts import verify_file

pytestmark = pytest.mark.interpreter
CPU = torch.device("cpu")
DUP = int(MetadataFault.DUPLICATE_WRITE_SLOT)


def ignores_duplicates(binding):
    """The defect: the DUPLICATE_WRITE_SLOT bit is cleared after the run."""
    result = run(binding)
    result.error_code.bitwise_and_(~DUP)
    return result


def test_a_cpu_rig_plans_one_v_block_per_program():
    plan = Rigs(CPU).get("triton", Shape(CPU_LIMITS, 2, 0)).plan
    assert plan.config.block_v == CPU_LIMITS.head_dim and plan.config_source == "explicit"


def test_a_planted_defect_is_found_shrunk_and_replayed(tmp_path):
    campaign = Campaign(["triton"], 4, 60, None, CPU, CPU_LIMITS, warm=False,
                        target=ignores_duplicates)
    runs, receipt = run_campaign(campaign, out_dir=tmp_path, command_line=["kdabench", "fuzz"])
    found = runs[0]
    assert found.failed > 0 and found.findings
    first = found.findings[0]
    assert first["check"] == "error-code" and first["expected_error_code"] & DUP
    case = tmp_path / first["file"]
    doc = json.loads(case.read_text())
    assert len(doc["set"]["initial"]) <= 2 and doc["failed"]["check"] == "error-code"
    assert not replay([case], CPU, ignores_duplicates)[0].result.ok
    assert replay([case], CPU)[0].result.ok
    check = verify_file(receipt)
    assert check.ok and check.kind == "fuzz" and not check.partial


def test_high_slot_sets_run_past_a_line_on_the_cpu():
    shape = Shape(CPU_LIMITS, 2, 3, slot_base=40)
    rig = Rigs(CPU).get("triton", shape)
    import random

    rng = random.Random(1)
    for _ in range(3):
        fset = valid_set(CPU_LIMITS, 2, rng).rebased(40)
        result = run_set(rig, fset, default_target())
        assert result.ok and result.code == 0, result.failures
        assert min(s for s in fset.write_slots()) >= 40


def test_counts_add_up_and_warm_up_runs(tmp_path):
    campaign = Campaign(["triton", "cute"], 2, 30, None, CPU, CPU_LIMITS, warm=True)
    runs, _ = run_campaign(campaign, out_dir=tmp_path, command_line=["kdabench", "fuzz"])
    triton, cute = runs
    assert triton.ok and triton.sets == 30 == triton.valid + triton.faulty
    assert sum(triton.per_capacity.values()) == 30
    assert cute.skipped and "CUDA" in cute.skipped
