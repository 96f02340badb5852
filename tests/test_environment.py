"""kdabench.environment: device identity, toolchain and git state (CPU tier)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import torch

from kdabench import environment
from kdabench.environment import (
    DEVICE_KEYS,
    TOOLCHAIN_DISTRIBUTIONS,
    device_identity,
    git_state,
    toolchain,
)


def test_cpu_identity_has_every_key():
    identity = device_identity("cpu")
    assert tuple(identity) == DEVICE_KEYS
    assert identity["kind"] == "cpu" and identity["device"] == "cpu"
    assert identity["name"] and identity["cpu_model"]
    assert identity["cpu_count"] >= 1
    assert identity["compute_capability"] is None and identity["sm_count"] is None
    json.dumps(identity)


def test_default_identity_is_the_device_in_hand():
    identity = device_identity()
    assert tuple(identity) == DEVICE_KEYS
    assert identity["kind"] == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.gpu
def test_gpu_identity():
    identity = device_identity("cuda")
    assert identity["device"].startswith("cuda:")
    major, minor = identity["compute_capability"].split(".")
    assert int(major) >= 7 and minor.isdigit()
    assert identity["sm_count"] > 0 and identity["total_memory_bytes"] > 0
    assert identity["cuda_runtime_version"] == torch.version.cuda


@pytest.mark.parametrize("device", ["warp-drive", "meta"])
def test_device_that_is_not_cpu_or_cuda_is_refused(device):
    with pytest.raises(ValueError):
        device_identity(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_cuda_on_a_machine_without_one_is_refused():
    with pytest.raises(ValueError, match="no CUDA GPU"):
        device_identity("cuda:0")


def test_toolchain_has_every_key_and_reads_installed_versions():
    versions = toolchain()
    assert set(versions) == {"python", *TOOLCHAIN_DISTRIBUTIONS}
    for present in ("python", "kdabench", "torch", "triton", "click", "numpy"):
        assert versions[present], present
    assert torch.__version__.startswith(versions["torch"].split("+")[0])
    json.dumps(versions)


def test_git_state_outside_a_checkout_is_none(tmp_path):
    assert git_state(tmp_path) == {"commit": None, "dirty": None}
    assert git_state(tmp_path / "missing") == {"commit": None, "dirty": None}


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_state_of_a_checkout(tmp_path):
    def git(*args):
        subprocess.run(
            ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            check=True,
            capture_output=True,
        )

    git("init", "-q")
    assert git_state(tmp_path) == {"commit": None, "dirty": False}
    (tmp_path / "a.txt").write_text("a\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "a")
    state = git_state(tmp_path)
    assert state["dirty"] is False
    assert len(state["commit"]) == 40 and int(state["commit"], 16) >= 0
    (tmp_path / "a.txt").write_text("b\n")
    assert git_state(tmp_path) == {"commit": state["commit"], "dirty": True}
    # a tree copied into an ignored folder of the checkout is not the checkout's commit
    (tmp_path / ".gitignore").write_text("copy/\n")
    (tmp_path / "copy").mkdir()
    assert git_state(tmp_path / "copy") == {"commit": None, "dirty": None}


def test_usable_cpus_are_the_affinity_capped_by_a_cgroup_quota(monkeypatch):
    affinity = len(os.sched_getaffinity(0))
    monkeypatch.setattr(environment, "cpu_quota", lambda: None)
    assert environment.usable_cpus() == affinity
    monkeypatch.setattr(environment, "cpu_quota", lambda: 1)
    assert environment.usable_cpus() == 1
    assert environment.device_identity("cpu")["cpu_count"] == 1
    monkeypatch.setattr(environment, "cpu_quota", lambda: affinity + 4)
    assert environment.usable_cpus() == affinity
