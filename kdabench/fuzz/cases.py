"""Fuzz cases as JSON files, and replaying them.

A case (schema "kdabench.fuzz.case.v1")::

    schema               "kdabench.fuzz.case.v1"
    backend              "triton" | "cute"
    shape                the rig: Limits fields (heads, head_dim, max_seqs, max_len, ...),
                         capacity, seed (inputs and pool pattern), slot_base (0, or the first
                         slot of a set rebased past the 2^31-element line)
    set                  the metadata (kdabench.fuzz.sets.FuzzSet.to_dict: cu_seqlens,
                         num_seqs, initial, final, offsets, slots, num_slots, tokens,
                         index_dtype, faults, slot_base)
    expected_error_code  what kdabench.oracles.metadata expects
    failed               null, or {"check": name, "message": str}: what failed when written

Replaying runs the set again on a rig built from `shape` and checks it in full.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from kdabench.fuzz.check import SetResult, Target, default_target, run_set
from kdabench.fuzz.generate import Limits
from kdabench.fuzz.rig import Rig, build_rig
from kdabench.fuzz.sets import FuzzSet

SCHEMA = "kdabench.fuzz.case.v1"


class CaseError(ValueError):
    """A file that is not a fuzz case; the message is one line."""


@dataclass(frozen=True)
class Shape:
    """What a rig is built from."""

    limits: Limits
    capacity: int
    seed: int
    slot_base: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {**self.limits.to_dict(), "capacity": self.capacity, "seed": self.seed,
                "slot_base": self.slot_base}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Shape:
        names = [f.name for f in fields(Limits)]
        limits = Limits(**{k: data[k] for k in names})
        return cls(limits, int(data["capacity"]), int(data["seed"]), int(data["slot_base"]))


def case_document(backend: str, shape: Shape, fset: FuzzSet,
                  result: SetResult | None) -> dict[str, Any]:
    failed = None
    if result is not None and result.failures:
        failed = {"check": result.failures[0].check, "message": result.failures[0].message}
    return {"schema": SCHEMA, "backend": backend, "shape": shape.to_dict(),
            "set": fset.to_dict(), "expected_error_code": fset.expected_code(),
            "failed": failed}


def write_case(path: str | os.PathLike, document: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return path


def load_case(path: str | os.PathLike) -> tuple[str, Shape, FuzzSet]:
    """(backend, shape, set) of a case file; raises CaseError."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CaseError(f"{path}: cannot read a fuzz case ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise CaseError(f"{path}: not a {SCHEMA} file")
    try:
        return str(doc["backend"]), Shape.from_dict(doc["shape"]), FuzzSet.from_dict(doc["set"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CaseError(f"{path}: malformed fuzz case ({exc})") from exc


def case_files(path: str | os.PathLike) -> list[Path]:
    """One file, or every *.json under a folder (sorted); raises CaseError when none."""
    path = Path(path)
    files = sorted(path.rglob("*.json")) if path.is_dir() else [path]
    if not files or not files[0].exists():
        raise CaseError(f"{path}: no fuzz case files there")
    return files


@dataclass
class Replay:
    path: Path
    result: SetResult


class Rigs:
    """Rigs built on demand and kept, keyed by backend and shape."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._rigs: dict[tuple[str, Shape], Rig] = {}

    def get(self, backend: str, shape: Shape) -> Rig:
        key = (backend, shape)
        if key not in self._rigs:
            self._rigs[key] = build_rig(backend, shape.capacity, shape.limits, self.device,
                                        seed=shape.seed, slot_base=shape.slot_base)
        return self._rigs[key]


def replay(paths: list[Path], device: torch.device, target: Target | None = None
           ) -> list[Replay]:
    """Run each case again and check it in full."""
    target = target or default_target()
    rigs, out = Rigs(device), []
    for path in paths:
        backend, shape, fset = load_case(path)
        out.append(Replay(path, run_set(rigs.get(backend, shape), fset, target)))
    return out
