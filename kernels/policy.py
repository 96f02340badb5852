"""Which kernel config a planned call gets, and from where: policy modes and resolution.

Modes (chosen per call with `policy_mode=`, else by $KDABENCH_POLICY_MODE, else AUTO):

    AUTO             the device's profile entry for the query when there is one, else the
                     heuristic (and the config source says which, and why)
    HEURISTIC_ONLY   the heuristic; profiles are not read
    PREPLANNED_ONLY  the profile entry, or KdaPolicyError naming the query that has none

    resolved = resolve_config(caps, mode="AUTO", device_name="NVIDIA H200")
    resolved.config, resolved.source   # KernelConfig(...), "profile nvidia-h200.json (query v1 ...)"
    resolved.backend                   # "triton", or "cute" where caps.backend is "auto" and the
                                       # profile entry says the cute backend measured fastest

The device name defaults to the name of caps.device (torch.cuda.get_device_name; "cpu" for the
CPU), so resolution is testable from a device-name string alone, without a GPU.
"""

from __future__ import annotations

import enum
import functools
import os
from dataclasses import dataclass

import torch

from .catalog import KdaPolicyError, KdaQuery
from .config import AUTO_BACKEND, BACKENDS, Caps, CuteConfig, KernelConfig
from .folders import shown_folder
from .profiles import find_profile, profile_dir, profile_path

POLICY_MODE_ENV = "KDABENCH_POLICY_MODE"


class PolicyMode(str, enum.Enum):
    AUTO = "AUTO"
    HEURISTIC_ONLY = "HEURISTIC_ONLY"
    PREPLANNED_ONLY = "PREPLANNED_ONLY"


POLICY_MODES = tuple(mode.value for mode in PolicyMode)
EXPLICIT_SOURCE = "explicit"  # the config source of a config given to plan(), not resolved


def parse_mode(value: str | PolicyMode, origin: str = "policy_mode") -> PolicyMode:
    """A mode from its name (case and '-' for '_' do not matter); KdaPolicyError otherwise."""
    if isinstance(value, PolicyMode):
        return value
    name = str(value).strip().upper().replace("-", "_")
    try:
        return PolicyMode(name)
    except ValueError:
        raise KdaPolicyError(f"{origin} {value!r} is not a policy mode (one of "
                             f"{', '.join(POLICY_MODES)})") from None


def resolve_mode(mode: str | PolicyMode | None = None) -> PolicyMode:
    """The per-call mode when given, else $KDABENCH_POLICY_MODE, else AUTO."""
    if mode is not None:
        return parse_mode(mode)
    from_env = os.environ.get(POLICY_MODE_ENV)
    if from_env:
        return parse_mode(from_env, f"${POLICY_MODE_ENV}")
    return PolicyMode.AUTO


FEW_PROGRAMS = 16  # heads x sequences at or below which V is split into 16-column blocks


def heuristic_config(caps: Caps) -> KernelConfig:
    """32-token chunks; 16-column V blocks when few (sequence, head) programs would run, 32
    otherwise; a third pipeline stage where shared memory allows (sm_90, sm_100: 227 KB)."""
    block_v = 16 if caps.num_heads * caps.max_seqs <= FEW_PROGRAMS else 32
    stages = 3 if block_v == 16 and _large_shared_memory(caps.device) else 2
    return KernelConfig(chunk_size=32, block_v=min(block_v, caps.head_dim), num_warps=4,
                        num_stages=stages)


def _large_shared_memory(device: torch.device | str) -> bool:
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] in (9, 10)


def device_name_of(device: torch.device | str) -> str:
    """The name profiles are kept under: the CUDA device's name, or the device type."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    index = torch.cuda.current_device() if device.index is None else device.index
    return _cuda_name(index)


@functools.cache
def _cuda_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


@dataclass(frozen=True)
class Resolution:
    """A resolved config: the config, where it came from (one line), the mode and query."""

    config: KernelConfig | CuteConfig
    source: str
    mode: PolicyMode
    query: KdaQuery
    profile: str | None = None  # the profile file's name when the config came from one
    backend: str = BACKENDS[0]  # the backend the config is for


def cute_origin(caps: Caps) -> str:
    """Where the cute backend's compiled kernels come from, for a config source."""
    device = torch.device(caps.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return "cute backend (no CUDA device)"
    from .cute.launch import origin

    return f"cute backend, {origin(device)}"


def resolve_config(caps: Caps, *, activation_dtype: torch.dtype | str = torch.bfloat16,
                   mode: str | PolicyMode | None = None, device_name: str | None = None,
                   directory: str | os.PathLike | None = None) -> Resolution:
    """The config a plan of `caps` gets under `mode`, and its backend (see the module
    docstring). caps.backend "auto" takes the profile entry's backend; without an entry, or
    under HEURISTIC_ONLY, it is "triton".

    directory: the profile folder (default $KDABENCH_PROFILE_DIR, else the packaged one).
    Raises KdaPolicyError for a bad mode, a profile that does not load, or PREPLANNED_ONLY
    without an entry for the query.
    """
    mode = resolve_mode(mode)
    query = KdaQuery.from_caps(caps, activation_dtype)
    if caps.backend == "cute":
        return Resolution(CuteConfig(), cute_origin(caps), mode, query, backend="cute")
    if mode is PolicyMode.HEURISTIC_ONLY:
        return Resolution(heuristic_config(caps), "heuristic (policy mode HEURISTIC_ONLY)",
                          mode, query)
    name = device_name if device_name is not None else device_name_of(caps.device)
    profile = find_profile(name, directory)
    entry = profile.lookup(query) if profile is not None else None
    if entry is not None:
        source = f"profile {profile.name} ({query.describe()})"
        if caps.backend == AUTO_BACKEND and entry.backend == "cute":
            return Resolution(entry.cute_config or CuteConfig(),
                              f"{source}: the cute backend measured fastest; "
                              f"{cute_origin(caps)}", mode, query, profile.name, "cute")
        return Resolution(entry.config, source, mode, query, profile.name)
    if profile is None:
        missing = (f"no profile entry for {query.describe()}: no profile for device {name!r} "
                   f"({profile_path(name, directory).name} not in "
                   f"{shown_folder(profile_dir(directory))})")
    else:
        missing = f"no profile entry for {query.describe()} in {profile.name}"
    if mode is PolicyMode.PREPLANNED_ONLY:
        raise KdaPolicyError(f"policy mode PREPLANNED_ONLY: {missing}; add the query to a "
                             "queries file and run `kdabench tune` on this device, or plan "
                             "with policy mode AUTO")
    return Resolution(heuristic_config(caps), f"heuristic ({missing})", mode, query)
