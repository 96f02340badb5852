"""Expanded cases, the matrix that holds them, case ids, and selecting by tier and shard."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kdabench.matrix.axes import AXES, SCENARIOS, TIERS, MatrixError


@dataclass(frozen=True)
class Case:
    """One expanded case.

    params: every axis of its scenario (with defaults filled in); lengths: the layout's
    sequence lengths (empty when the scenario reads no layout); options: the scenario's
    options and the tolerances; index: position in the tier's expansion.
    """

    index: int
    id: str
    scenario: str
    group: int
    params: Mapping[str, Any]
    lengths: tuple[int, ...]
    options: Mapping[str, Any]
    tiers: tuple[str, ...]

    def describe(self) -> dict[str, Any]:
        """The case as receipt fields."""
        return {"id": self.id, "index": self.index, "scenario": self.scenario,
                "params": dict(self.params), "group": self.group}


@dataclass(frozen=True)
class Matrix:
    """A parsed, validated matrix. ``document`` is the TOML as read (it goes into receipts)."""

    origin: str
    sha256: str
    document: Mapping[str, Any]
    name: str
    seed: int
    backends: tuple[str, ...]
    tolerances: Mapping[str, float]
    timing: Mapping[str, int]
    layouts: Mapping[str, tuple[int, ...]]
    groups: tuple[Mapping[str, Any], ...]

    def expand(self, tier: str) -> list[Case]:
        """Every case of `tier`, in matrix order, with stable ids and indices."""
        if tier not in TIERS:
            raise MatrixError(f"unknown tier {tier!r}; expected one of {', '.join(TIERS)}")
        cases: list[Case] = []
        seen: dict[str, int] = {}
        for number, group in enumerate(self.groups, start=1):
            if tier not in group["tiers"]:
                continue
            for params, options in _expand_group(group, self.tolerances):
                case_id = case_id_for(group["scenario"], params)
                if case_id in seen:
                    raise MatrixError(
                        f"{self.origin}: case {case_id!r} appears in group {seen[case_id]} "
                        f"and again in group {number}"
                    )
                seen[case_id] = number
                layout = params.get("layout")
                cases.append(Case(
                    index=len(cases), id=case_id, scenario=group["scenario"], group=number,
                    params=params, lengths=self.layouts[layout] if layout else (),
                    options=options, tiers=tuple(group["tiers"]),
                ))
        return cases


def case_id_for(scenario: str, params: Mapping[str, Any]) -> str:
    """The id of a case: the scenario, then each axis's label in :data:`AXES` order."""
    parts = [scenario]
    for name, axis in AXES.items():
        if name in params:
            label = axis.label(params[name])
            if label:
                parts.append(label)
    return "-".join(parts)


def _expand_group(group: Mapping[str, Any], tolerances: Mapping[str, float]):
    scenario = SCENARIOS[group["scenario"]]
    lists = [group["axes"].get(name, [AXES[name].default]) for name in scenario.axes]
    options = {**scenario.options, **group["options"],
               "tolerances": {**tolerances, **group.get("tolerances", {})}}
    for values in itertools.product(*lists):
        yield dict(zip(scenario.axes, values, strict=True)), options


# --------------------------------------------------------------------------- selection


def parse_shard(text: str) -> tuple[int, int]:
    """(I, N) from "I/N" with 1 <= I <= N."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match:
        raise MatrixError(f"shard {text!r} is not I/N (for example 1/2)")
    return check_shard(int(match.group(1)), int(match.group(2)))


def check_shard(index: int, count: int) -> tuple[int, int]:
    """(I, N) when 1 <= I <= N (shard I of N: the items at positions p with p % N == I - 1)."""
    if not 1 <= index <= count:
        raise MatrixError(f"shard {index}/{count}: I must lie in 1..N")
    return index, count


def select_cases(
    cases: Iterable[Case], *, shard: tuple[int, int] | None = None, contains: str | None = None
) -> list[Case]:
    """The cases of shard I/N (index % N == I - 1) whose ids contain `contains`."""
    selected = list(cases)
    if shard is not None:
        index, count = check_shard(*shard)
        selected = [case for case in selected if case.index % count == index - 1]
    if contains:
        selected = [case for case in selected if contains in case.id]
    return selected
