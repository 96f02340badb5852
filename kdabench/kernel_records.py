"""What a receipt says of the kernel config a case ran with: the config, its source, the mode,
the backend that ran it (and the config a backend name pins), and for the Triton split
pipeline the ranges of chunks it runs in."""

from __future__ import annotations

import dataclasses
from typing import Any

KERNEL_RECORD_KEYS = ("kernel_config", "config_source", "policy_mode")
CUTE_SPLIT_PREFIX = "cute-s"  # a backend name "cute-s<N>": the cute backend with key_split N
CUTE_WGMMA = "cute-wgmma"  # the cute backend with its pass on warpgroup MMA (sm_90a)


def backend_and_config(name: str) -> tuple[str, Any]:
    """The kernel backend a backend name (bench --backends, qualify --backend) plans on and
    the config it pins (None: the policy's): ``cute-s2`` is the cute backend with
    ``CuteConfig(key_split=2)``, ``cute-wgmma`` with ``CuteConfig(algorithm="wgmma")``."""
    if name.startswith(CUTE_SPLIT_PREFIX) and name[len(CUTE_SPLIT_PREFIX):].isdigit():
        pinned = {"key_split": int(name[len(CUTE_SPLIT_PREFIX):])}
    elif name == CUTE_WGMMA:
        pinned = {"algorithm": "wgmma"}
    else:
        return name, None
    from kdabench.kernels.config import CuteConfig

    return "cute", CuteConfig(**pinned)


def config_record(config: Any, source: str, mode: str) -> dict[str, Any]:
    """{kernel_config, config_source, policy_mode} of a KernelConfig resolved from `source`."""
    return dict(zip(KERNEL_RECORD_KEYS, (dataclasses.asdict(config), source, mode),
                    strict=True))


def split_ranges(plan: Any) -> dict[str, int] | None:
    """{"eager": n, "graph": n}: the ranges of chunks a Triton split-pipeline plan runs in when
    bound at its capacity, called eagerly and under CUDA-graph capture; None for other plans
    (and for parallel segments, whose ranges run at once: the config's `segments`)."""
    if plan.caps.backend != "triton" or plan.config.pipeline != "split" \
            or plan.config.segments > 1:
        return None
    from kdabench.kernels.triton.launch import chunk_slots, split_range_count

    caps = plan.caps
    slots = chunk_slots(caps.max_tokens, caps.max_seqs, plan.config.chunk_size)
    return {mode: split_range_count(slots, caps.max_seqs, mode == "graph")
            for mode in ("eager", "graph")}


def plan_record(plan: Any) -> dict[str, Any]:
    """The record of a plan: its config, where it came from, the mode it was resolved under,
    the backend that runs it (what "auto" resolved to), and ``split_ranges`` where the split
    pipeline runs (see :func:`split_ranges`)."""
    record = config_record(plan.config, plan.config_source, plan.policy_mode)
    record["backend"] = plan.caps.backend
    ranges = split_ranges(plan)
    if ranges is not None:
        record["split_ranges"] = ranges
    return record
