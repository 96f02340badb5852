"""Qualification status: does results/ hold the evidence that a device is qualified?

A device (by name, as torch reports it: "NVIDIA H200") is qualified for a backend when the
results folder holds a receipt that

* verifies (its sha256 and rendering are intact) and is complete (not an interrupted run);
* is a GPU-tier `kdabench qualify` receipt made on a device of that name, for that backend;
* ran the whole packaged matrix: the default matrix, no --filter, no lone shard (shards
  merged with `kdabench merge` count as a whole run);
* has every case passing; and
* recorded kernel sources (``kernels/...`` hashes) equal to the kernels installed now.

    status = qualification_status("NVIDIA H200", "triton")
    status.qualified, status.receipt, status.reason

    planned, status = qualified_plan(caps, require=True)   # refuses an unqualified device

The results folder is, in order: the `results_dir` argument, the KDABENCH_RESULTS
environment variable, the repository's results/ (beside the kernels package's folder, when
that folder's parent holds pyproject.toml), else ./results.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdabench.receipts import ReceiptError, read_receipt, verify_receipt
from kdabench.sources import compare_source_hashes, source_hashes

RESULTS_ENV = "KDABENCH_RESULTS"
KERNEL_PREFIX = "kernels/"


class NotQualifiedError(RuntimeError):
    """plan was asked to require qualification and the device has none."""


@dataclass(frozen=True)
class QualificationStatus:
    """qualified: the verdict; receipt: the receipt that qualifies, or the closest one that
    does not (None when there is none); reason: one sentence saying why."""

    qualified: bool
    receipt: Path | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"qualified": self.qualified,
                "receipt": None if self.receipt is None else str(self.receipt),
                "reason": self.reason}


def repository_dir() -> Path | None:
    """The checkout that holds the kernels package (found without importing it), if any."""
    spec = importlib.util.find_spec("kdabench.kernels")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))).resolve().parent
    return root if (root / "pyproject.toml").is_file() else None


def default_results_dir() -> Path:
    """KDABENCH_RESULTS, else the repository's results/, else ./results."""
    configured = os.environ.get(RESULTS_ENV)
    if configured:
        return Path(configured)
    root = repository_dir()
    return (root if root is not None else Path.cwd()) / "results"


def kernel_hashes(sources: Mapping[str, str]) -> dict[str, str]:
    """The kernel entries (``kernels/...``) of a source-hash mapping."""
    return {path: digest for path, digest in sources.items() if path.startswith(KERNEL_PREFIX)}


def _rejection(doc: Mapping[str, Any], raw: bytes, path: Path, device_name: str, backend: str,
               current_kernels: Mapping[str, str]) -> tuple[int, str | None]:
    """(how far the receipt got through the checks, why it stops there; None if it passes)."""
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    device = doc.get("device") if isinstance(doc.get("device"), dict) else {}
    if doc.get("kind") != "qualify":
        return 0, f"{path.name} is a {doc.get('kind')!r} receipt, not a qualify one"
    if config.get("tier") != "gpu" or device.get("kind") != "cuda":
        return 1, f"{path.name} is a {config.get('tier')}-tier receipt, not a GPU one"
    if str(device.get("name", "")).strip() != device_name.strip():
        return 1, f"{path.name} was made on {device.get('name')!r}, not {device_name!r}"
    if config.get("backend") != backend:
        return 2, f"{path.name} qualifies backend {config.get('backend')!r}, not {backend!r}"
    check = verify_receipt(doc, current_sources={}, raw=raw, path=path)
    if not check.ok:
        return 3, f"{path.name} does not verify ({'; '.join(check.problems)})"
    if doc.get("status") != "complete":
        return 4, f"{path.name} is partial (an interrupted run)"
    if config.get("shard"):
        return 5, f"{path.name} is shard {config['shard']} alone; merge the shards first"
    if config.get("filter"):
        return 5, f"{path.name} ran only the cases matching --filter {config['filter']!r}"
    if config.get("matrix_origin") != "default":
        return 5, f"{path.name} ran a custom matrix, not the packaged default"
    summary = doc.get("summary") if isinstance(doc.get("summary"), dict) else {}
    total, passed = summary.get("total", 0), summary.get("pass", 0)
    if not total or passed != total:
        failing = [c.get("id") for c in doc.get("cases", []) if c.get("verdict") != "pass"]
        shown = ", ".join(map(str, failing[:3])) + (" ..." if len(failing) > 3 else "")
        return 6, (f"{path.name} has {total - passed} of {total} cases not passing"
                   + (f" ({shown})" if shown else ""))
    recorded = kernel_hashes(doc.get("sources") or {})
    if recorded != current_kernels:
        diff = compare_source_hashes(recorded, current_kernels)
        return 7, f"{path.name} was made from other kernel sources ({diff.describe()})"
    return 8, None


def qualification_status(
    device_name: str,
    backend: str,
    results_dir: str | os.PathLike | None = None,
    *,
    current_sources: Mapping[str, str] | None = None,
) -> QualificationStatus:
    """Whether `device_name` is qualified for `backend` by a receipt in the results folder.

    current_sources: the source hashes to compare with (default: the installed tree's,
    :func:`kdabench.sources.source_hashes`); only the ``kernels/...`` entries count.
    """
    folder = Path(results_dir) if results_dir is not None else default_results_dir()
    if not folder.is_dir():
        return QualificationStatus(False, None, f"no results folder at {folder}")
    current = kernel_hashes(source_hashes() if current_sources is None else current_sources)
    best: tuple[int, str, Path, str] | None = None  # (progress, created_at, path, reason)
    looked = 0
    for path in sorted(folder.rglob("*.json")):
        if path.name.startswith("."):
            continue  # a write in progress
        try:
            doc, raw = read_receipt(path)
        except ReceiptError:
            continue
        looked += 1
        progress, reason = _rejection(doc, raw, path, device_name, backend, current)
        created = str(doc.get("created_at") or "")
        if reason is None:
            candidate = (progress, created, path, "")
        else:
            candidate = (progress, created, path, reason)
        if best is None or candidate[:2] > best[:2]:
            best = candidate
    if best is None or best[0] < 2:
        return QualificationStatus(
            False, None,
            f"no GPU qualify receipt for {device_name!r} / {backend} in {folder} "
            f"({looked} receipt(s) looked at); run `kdabench qualify --tier gpu` on it",
        )
    progress, _, path, reason = best
    if progress == 8:
        return QualificationStatus(
            True, path, f"{path.name}: every case passes on {device_name} ({backend}) and its "
            "kernel sources match the installed kernels",
        )
    return QualificationStatus(False, path, reason)


def device_name_of(device: str | Any) -> str | None:
    """The torch name of a CUDA device ("NVIDIA H200"); None for the CPU (never qualified)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(device)


def device_status(device: str | Any, backend: str,
                  results_dir: str | os.PathLike | None = None) -> QualificationStatus:
    """qualification_status for a torch device; the CPU is never qualified."""
    name = device_name_of(device)
    if name is None:
        return QualificationStatus(False, None, f"{device} is not a CUDA device: only GPU "
                                   "qualify receipts qualify a device")
    return qualification_status(name, backend, results_dir)


def qualified_plan(caps: Any, config: Any = None, *, require: bool = False,
                   results_dir: str | os.PathLike | None = None) -> tuple[Any, QualificationStatus]:
    """kdabench.kernels.plan(caps, config) with its qualification status (config None: the
    policy catalog resolves one, as plan() does).

    require=True refuses (NotQualifiedError, with the reason) a device that results/ does not
    qualify for the plan's backend (caps.backend "auto" resolved) with the installed kernel
    sources.
    """
    from kdabench.kernels import plan

    planned = plan(caps, config)
    backend = planned.caps.backend
    status = device_status(caps.device, backend, results_dir)
    if require and not status.qualified:
        raise NotQualifiedError(f"{caps.device} is not qualified for {backend}: {status.reason}")
    return planned, status
