"""The profile-configs scenario: each distinct config of the device's profile, forced and checked."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from kdabench import kernels
from kdabench.kernels.config import CuteConfig
from kdabench.kernels.profiles import entry_document, profile_document
from kdabench.matrix import SCENARIOS, load_matrix, parse_matrix
from kdabench.qualify import RUNNERS, Qualification, config_label
from kdabench.receipts import verify_file

MATRIX = """
schema = "kdabench.matrix.v1"
name = "profile-configs"
[layouts.R2]
lengths = [7, 40]

[[group]]
scenario = "profile-configs"
tiers = ["cpu"]
capacity = 2
heads = 1
layout = "R2"
"""
SMALL = kernels.KernelConfig(chunk_size=16, block_v=16)
LARGE = kernels.KernelConfig(chunk_size=32, block_v=32, num_stages=3)


def query(**change) -> kernels.KdaQuery:
    fields = {"heads": 1, "head_dim": 64, "dtype": "bfloat16", "capacity": 2,
              "gate": "precomputed", "token_bucket": 64, "seq_bucket": 2, **change}
    return kernels.KdaQuery(**fields)


@pytest.fixture
def profile_folder(tmp_path: Path, monkeypatch) -> Path:
    """$KDABENCH_PROFILE_DIR on an empty folder; the policy mode left to its default."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    monkeypatch.setenv("KDABENCH_PROFILE_DIR", str(folder))
    monkeypatch.delenv("KDABENCH_POLICY_MODE", raising=False)
    return folder


def write_profile(folder: Path, entries: list[tuple[kernels.KdaQuery, kernels.KernelConfig]]):
    document = profile_document("cpu", [entry_document(q, c) for q, c in entries])
    (folder / "cpu.json").write_text(json.dumps(document))


@pytest.fixture
def planned(monkeypatch) -> list[kernels.KernelConfig]:
    """The configs the kernel was planned with, in call order."""
    seen = []
    real = kernels.plan

    def spy(caps, config=None, **kwargs):
        seen.append(config)
        return real(caps, config, **kwargs)

    monkeypatch.setattr(kernels, "plan", spy)
    return seen


def run_case(tmp_path: Path) -> dict:
    run = Qualification(parse_matrix(MATRIX), tier="cpu", out_dir=tmp_path / "out")
    (case,) = run.run().cases
    return case


def test_the_default_matrix_runs_it_on_both_tiers():
    assert RUNNERS["profile-configs"] and "profile-configs" in SCENARIOS
    ids = {tier: [c.id for c in load_matrix().expand(tier) if c.scenario == "profile-configs"]
           for tier in ("cpu", "gpu")}
    assert ids == {
        "cpu": ["profile-configs-C2-H1-K64-R5-unaligned-precomputed-lb5"],
        "gpu": ["profile-configs-C4-H8-K128-L8192x1-unaligned-precomputed-lb5",
                "profile-configs-C2-H4-K128-R16-unaligned-precomputed-lb5"],
    }


def test_config_label_names_every_field():
    assert config_label(LARGE) == ("c32 bv32 w4 s3 pw4 tf32 float32 fused seg1 substitution "
                                   "checkpoints-in-kernel")


@pytest.mark.interpreter
def test_each_distinct_config_is_run_and_checked(tmp_path, profile_folder, planned):
    # three entries, two configs: LARGE serves two queries and runs once
    write_profile(profile_folder, [(query(), SMALL), (query(capacity=4), LARGE),
                                   (query(heads=2), LARGE)])
    case = run_case(tmp_path)
    assert case["verdict"] == "pass", case["message"]
    assert planned == [SMALL, LARGE]
    assert case["kernel_config"] == [dataclasses.asdict(c) for c in (SMALL, LARGE)]
    assert case["config_source"] == "explicit: each distinct config of cpu.json (2 from 3 entries)"
    assert case["policy_mode"] is None
    small, large = case["details"]["configs"]
    assert small["queries"] == [query().describe()]
    assert large["queries"] == [query(capacity=4).describe(), query(heads=2).describe()]
    for checked in (small, large):
        assert checked["verdict"] == "pass" and checked["error_code"] == 0
        assert 0 < checked["errors"]["output"] < 5e-3
        assert 0 < checked["errors"]["checkpoint"] < 3e-3
        assert 0 < checked["errors"]["final_state"] < 3e-3
    lines = case["checks"]["configs"]
    assert lines[0].startswith("c16 bv16 w4 s2 pw4 tf32 float32 fused seg1 substitution "
                               "checkpoints-in-kernel "
                               f"(profile entry for {query().describe()}): output ")
    assert lines[1].startswith("c32 bv32 w4 s3 pw4 tf32 float32 fused seg1 substitution "
                               "checkpoints-in-kernel (profile entries for ")
    assert all(" <= 5.0e-03" in line and line.endswith("unwritten slots unchanged -> pass")
               for line in lines)
    assert case["errors"]["output"] == max(small["errors"]["output"], large["errors"]["output"])
    assert verify_file(next((tmp_path / "out").glob("qualify-*.json"))).ok


@pytest.mark.interpreter
def test_one_wrong_config_fails_the_case(tmp_path, profile_folder, monkeypatch):
    write_profile(profile_folder, [(query(), SMALL), (query(capacity=4), LARGE)])
    real = kernels.run

    def wrong_with_small_chunks(binding):
        result = real(binding)
        if binding.plan.config.chunk_size == 16:
            finals = binding.final_state_indices.long()
            binding.state_pool[finals[finals >= 0]] *= 1.01
        return result

    monkeypatch.setattr(kernels, "run", wrong_with_small_chunks)
    case = run_case(tmp_path)
    assert case["verdict"] == "fail"
    assert case["message"].startswith(
        "c16 bv16 w4 s2 pw4 tf32 float32 fused seg1 substitution checkpoints-in-kernel: "
        "output ")
    assert "final_state" in case["message"] and "c32" not in case["message"]
    small, large = case["details"]["configs"]
    assert (small["verdict"], large["verdict"]) == ("fail", "pass")
    assert " > 3.0e-03" in case["checks"]["configs"][0]
    assert case["checks"]["configs"][0].endswith(" -> fail")


@pytest.mark.interpreter
def test_without_a_profile_the_case_passes_and_says_why(tmp_path, profile_folder, planned):
    case = run_case(tmp_path)
    assert case["verdict"] == "pass" and planned == []
    assert case["message"] == (
        f"no profile for device 'cpu' (cpu.json not in {profile_folder.name}): the heuristic is the "
        "only config (qualified by the other scenarios)")
    assert case["kernel_config"] is None
    write_profile(profile_folder, [])
    case = run_case(tmp_path)
    assert case["verdict"] == "pass" and planned == []
    assert case["message"].startswith("profile cpu.json has no entries: the heuristic is ")


@pytest.mark.interpreter
def test_configs_for_another_head_dim_are_listed_not_run(tmp_path, profile_folder, planned):
    wide = kernels.KernelConfig(block_v=128)
    write_profile(profile_folder, [(query(head_dim=128), wide)])
    case = run_case(tmp_path)
    assert case["verdict"] == "pass" and planned == []
    assert case["message"] == ("none of the 1 configs of cpu.json can run head_dim 64: the "
                               "policy picks them only for other head dims")
    assert list(case["details"]["not_run"]) == [config_label(wide)]


@pytest.mark.parametrize(("config", "says"), [
    (None, "takes its default config"),
    (CuteConfig(key_split=2), "pins the config with key_split=2")])
def test_a_cute_run_says_which_config_it_runs_instead(config, says):
    from kdabench.qualify.harness import Context
    from kdabench.qualify.profile_configs import run_profile_configs

    (case,) = [c for c in parse_matrix(MATRIX).expand("cpu")]
    ctx = Context(device=torch.device("cpu"), tier="cpu", backend="cute", timing=None,
                  config=config)
    out = run_profile_configs(ctx, case)
    assert says in out.note and "--backend cute-s<N>" in out.note
    assert not out.failures and not out.errors
