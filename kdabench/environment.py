"""Who ran this: the device, the toolchain and the source tree, as plain JSON-ready dicts.

These three functions feed the receipts (docs/DESIGN.md §5) and `kdabench kernels info`.
They read; they change nothing. `toolchain()` and `git_state()` never raise;
`device_identity()` raises `ValueError` only for a device string that names no device
on this machine (a user's mistake), and otherwise fills what it cannot read with None.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

#: Keys of `device_identity()`, the same on a GPU and on a CPU-only machine.
DEVICE_KEYS = (
    "kind",  # "cuda" or "cpu"
    "device",  # the torch device string: "cuda:0", "cpu"
    "name",  # GPU name, or the CPU model on a CPU-only machine
    "compute_capability",  # "9.0"; None on the CPU
    "sm_count",
    "total_memory_bytes",  # GPU memory, or host memory for the CPU
    "uuid",
    "driver_version",  # NVIDIA driver, e.g. "580.159.04"
    "cuda_runtime_version",  # the CUDA torch was built with, e.g. "13.0"
    "cpu_model",  # the host's CPU, on every kind
    "cpu_count",  # CPUs this process may run on
)

#: Distributions reported by `toolchain()`: key -> distribution name.
TOOLCHAIN_DISTRIBUTIONS = {
    "kdabench": "kdabench",
    "torch": "torch",
    "triton": "triton",
    "click": "click",
    "rich": "rich",
    "numpy": "numpy",
    "cutlass-dsl": "nvidia-cutlass-dsl-libs-base",
    "tvm-ffi": "apache-tvm-ffi",
    "fla": "flash-linear-attention",
    "cudnn-frontend": "nvidia-cudnn-frontend",
}

_SUBPROCESS_TIMEOUT_S = 10


def device_identity(device: str | None = None) -> dict[str, Any]:
    """Describe the device in hand.

    `device` is a torch device string ("cuda", "cuda:1", "cpu"); None picks the current
    CUDA device when one is available and the CPU otherwise. Returns a dict with the keys
    of `DEVICE_KEYS`. Raises ValueError when `device` is malformed or names a CUDA device
    this machine does not have.
    """
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as error:
        raise ValueError(f"{device!r} is not a device (try 'cpu', 'cuda' or 'cuda:0')") from error

    identity: dict[str, Any] = dict.fromkeys(DEVICE_KEYS)
    identity["cpu_model"] = _cpu_model()
    identity["cpu_count"] = usable_cpus()

    if parsed.type == "cpu":
        identity.update(
            kind="cpu",
            device="cpu",
            name=identity["cpu_model"],
            total_memory_bytes=_host_memory_bytes(),
        )
        return identity

    if parsed.type != "cuda":
        raise ValueError(f"{device!r}: kdabench runs on 'cuda' or 'cpu' devices only")
    if not torch.cuda.is_available():
        raise ValueError(
            f"{device!r} asked for, but no CUDA GPU is available here "
            "(torch.cuda.is_available() is False); use --device cpu or leave it out"
        )
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if parsed.index is None else parsed.index
    if not 0 <= index < count:
        raise ValueError(f"{device!r}: there are {count} CUDA device(s) here, numbered from 0")

    props = torch.cuda.get_device_properties(index)
    identity.update(
        kind="cuda",
        device=f"cuda:{index}",
        name=props.name,
        compute_capability=f"{props.major}.{props.minor}",
        sm_count=int(props.multi_processor_count),
        total_memory_bytes=int(props.total_memory),
        uuid=_optional_str(getattr(props, "uuid", None)),
        driver_version=_nvidia_driver_version(),
        cuda_runtime_version=torch.version.cuda,
    )
    return identity


def toolchain() -> dict[str, str | None]:
    """Versions of Python and of the packages a result depends on (None where absent).

    Reads installed package metadata only: nothing is imported, so an absent or broken
    package (nvidia-cutlass-dsl, fla) costs nothing and cannot fail the call.
    """
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, distribution in TOOLCHAIN_DISTRIBUTIONS.items():
        try:
            versions[key] = importlib.metadata.version(distribution)
        except (importlib.metadata.PackageNotFoundError, OSError, ValueError):
            versions[key] = None
    return versions


def git_state(repo_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The commit checked out in `repo_dir` and whether the work tree differs from it.

    Returns {"commit": 40-hex str | None, "dirty": bool | None}. Untracked files that git
    does not ignore count as dirty. Both are None when `repo_dir` is not the top of a git
    checkout (a tree copied into an ignored folder of another checkout is not that checkout's
    commit) or git is missing; "commit" is None in a repository with no commit yet. Never
    raises.
    """
    state: dict[str, Any] = {"commit": None, "dirty": None}
    top = _git(repo_dir, "rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != Path(repo_dir).resolve():
        return state
    status = _git(repo_dir, "status", "--porcelain")
    if status is None:
        return state
    state["dirty"] = bool(status.strip())
    commit = _git(repo_dir, "rev-parse", "--verify", "--quiet", "HEAD")
    if commit is not None and commit.strip():
        state["commit"] = commit.strip()
    return state


def _git(repo_dir: str | os.PathLike[str], *args: str) -> str | None:
    """Run one git command in `repo_dir`; its stdout, or None on any failure."""
    try:
        if not Path(repo_dir).is_dir():
            return None
        completed = subprocess.run(
            ["git", "-C", str(repo_dir), *args],
            capture_output=True,
            text=True,
            timeout=_SUBPROCESS_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return completed.stdout if completed.returncode == 0 else None


def _nvidia_driver_version() -> str | None:
    """The NVIDIA driver version: torch does not report it, so ask NVML, then nvidia-smi."""
    return _driver_version_from_nvml() or _driver_version_from_nvidia_smi()


def _driver_version_from_nvml() -> str | None:
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
        try:
            buffer = ctypes.create_string_buffer(96)
            if nvml.nvmlSystemGetDriverVersion(buffer, ctypes.c_uint(len(buffer))) != 0:
                return None
            return buffer.value.decode(errors="replace").strip() or None
        finally:
            nvml.nvmlShutdown()
    except (OSError, AttributeError, UnicodeError):  # no NVML library, or a symbol missing
        return None


def _driver_version_from_nvidia_smi() -> str | None:
    try:
        completed = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=_SUBPROCESS_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if completed.returncode != 0 or not completed.stdout.strip():
        return None
    return completed.stdout.strip().splitlines()[0].strip()


def _cpu_model() -> str | None:
    """The CPU model from /proc/cpuinfo ("model name" on x86, "Model"/"Hardware" on Arm)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, sep, value = line.partition(":")
                if sep and value.strip():
                    fields.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    for key in ("model name", "model", "hardware", "cpu model"):
        if key in fields and not fields[key].isdigit():
            return fields[key]
    return platform.processor() or platform.machine() or None


CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def cpu_quota(path: Path = CGROUP_CPU_MAX) -> int | None:
    """The CPUs a cgroup (v2) quota lets this process use, rounded up; None without one."""
    try:
        quota, period = path.read_text().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity, capped by a cgroup quota where one is set
    (what worker counts are sized by, and what a receipt's device records as cpu_count)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return min(cpus, cpu_quota() or cpus)


def _host_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)
