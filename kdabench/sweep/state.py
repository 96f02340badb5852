""":class:`ArmState`: everything a sweep has measured for one arm, raw."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kdabench.sweep.arms import Arm
from kdabench.sweep.client import ServerClient
from kdabench.sweep.prompts import PromptFactory


@dataclass
class ArmState:
    """Everything measured for one arm so far (raw; cases are derived from it)."""

    arm: Arm
    server: Any
    client: ServerClient | None = None
    prompts: PromptFactory | None = None
    info: dict[str, Any] = field(default_factory=dict)
    activation_before: dict[str, Any] | None = None
    activation_after: dict[str, Any] | None = None
    log_offset: int = 0
    warmups: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    probe: dict[str, Any] | None = None
    samples: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    discarded: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    failed_samples: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # cut short
    shared_prefix: list[dict[str, Any]] = field(default_factory=list)
    shared_prefix_warmups: list[dict[str, Any]] = field(default_factory=list)  # never counted
    decode: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None

    @property
    def active(self) -> bool:
        return self.failure is None

    @property
    def activation_status(self) -> str:
        statuses = [a["status"] for a in (self.activation_before, self.activation_after) if a]
        if "failed" in statuses:
            return "failed"
        if not statuses or all(s == "not checked" for s in statuses):
            return "not checked"
        return "passed"
