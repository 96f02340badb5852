"""What a receipt says of the kernel config a case ran with: the config, its source, the mode."""

from __future__ import annotations

import dataclasses
from typing import Any

KERNEL_RECORD_KEYS = ("kernel_config", "config_source", "policy_mode")


def config_record(config: Any, source: str, mode: str) -> dict[str, Any]:
    """{kernel_config, config_source, policy_mode} of a KernelConfig resolved from `source`."""
    return dict(zip(KERNEL_RECORD_KEYS, (dataclasses.asdict(config), source, mode),
                    strict=True))


def plan_record(plan: Any) -> dict[str, Any]:
    """The record of a plan: its config, where it came from, the mode it was resolved under."""
    return config_record(plan.config, plan.config_source, plan.policy_mode)
