"""Reading a receipt file and verifying it: the hash, the one rendering, the summary, and
the recorded source hashes against the tree in hand."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kdabench.datafiles import read_bytes
from kdabench.receipts.encoding import (
    _HASH_FIELD,
    _REQUIRED_FIELDS,
    SCHEMA,
    STATUSES,
    ReceiptError,
    compute_hash,
    render_receipt,
    sanitize,
    summarize,
)
from kdabench.sources import SourceDiff, compare_source_hashes, source_hashes


def _parse(raw: bytes, label: str) -> dict[str, Any]:
    def reject_constant(name: str) -> Any:
        raise ReceiptError(f"{label}: {name} is not valid in a receipt (not JSON)")

    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=reject_constant)
    except UnicodeDecodeError as exc:
        raise ReceiptError(f"{label}: not UTF-8 text, so not a receipt") from exc
    except json.JSONDecodeError as exc:
        raise ReceiptError(
            f"{label}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from exc
    if not isinstance(doc, dict):
        raise ReceiptError(f"{label}: a receipt is a JSON object, found {type(doc).__name__}")
    schema = doc.get("schema")
    if schema != SCHEMA:
        found = "no schema field" if schema is None else f"schema {schema!r}"
        raise ReceiptError(f"{label}: {found}; expected a {SCHEMA} receipt")
    absent = [name for name in _REQUIRED_FIELDS if name not in doc]
    if absent:
        raise ReceiptError(f"{label}: {SCHEMA} receipt lacks field(s): {', '.join(absent)}")
    if not isinstance(doc["cases"], list) or not all(isinstance(c, dict) for c in doc["cases"]):
        raise ReceiptError(f"{label}: 'cases' must be a list of objects")
    return doc


def read_receipt(path: str | os.PathLike) -> tuple[dict[str, Any], bytes]:
    """Read a receipt file; returns (document, raw bytes). Raises :class:`ReceiptError`."""
    raw = read_bytes(path, "file", ReceiptError)
    return _parse(raw, str(path)), raw


def load_receipt(path: str | os.PathLike) -> dict[str, Any]:
    """Load a receipt file as a dict. Raises :class:`ReceiptError` for a file that cannot
    be read, is not JSON, or is not a ``kdabench.receipt.v1`` receipt."""
    return read_receipt(path)[0]


@dataclass
class Verification:
    """What :func:`verify_receipt` found.

    ``ok`` is the verdict on integrity: the hash verifies, the summary matches the
    cases and, when the file's bytes were given, they are the receipt's one rendering.
    Source hashes that differ from the tree in hand are reported in ``sources`` and
    ``sources_match``; they do not make a receipt fail to verify. ``problems`` lists
    integrity failures, ``warnings`` other things to say (a partial receipt).
    ``resealed`` is the receipt's record of a reseal (:mod:`kdabench.receipts.reseal`), if any.
    """

    hash_ok: bool
    recorded: str | None
    recomputed: str
    bytes_ok: bool | None
    summary_ok: bool
    kind: str | None
    status: str | None
    device: dict[str, Any]
    summary: dict[str, int]
    created_at: str | None
    tool_version: str | None
    git: dict[str, Any]
    sources: SourceDiff
    path: str | None = None
    resealed: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.hash_ok and self.summary_ok and self.bytes_ok is not False

    @property
    def partial(self) -> bool:
        return self.status != "complete"

    @property
    def sources_match(self) -> bool:
        return self.sources.match

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok,
            "hash_ok": self.hash_ok,
            "recorded": self.recorded,
            "recomputed": self.recomputed,
            "bytes_ok": self.bytes_ok,
            "summary_ok": self.summary_ok,
            "kind": self.kind,
            "status": self.status,
            "partial": self.partial,
            "device": self.device,
            "summary": self.summary,
            "created_at": self.created_at,
            "tool_version": self.tool_version,
            "git": self.git,
            "resealed": self.resealed,
            "sources_match": self.sources_match,
            "sources": self.sources.to_dict(),
            "problems": list(self.problems),
            "warnings": list(self.warnings),
        }


def verify_receipt(
    doc: Mapping[str, Any],
    current_sources: Mapping[str, str] | None = None,
    *,
    raw: bytes | None = None,
    path: str | os.PathLike | None = None,
) -> Verification:
    """Re-check a receipt's hash and compare its source hashes with the tree in hand.

    ``current_sources`` defaults to :func:`kdabench.sources.source_hashes`. Pass the
    file's ``raw`` bytes to also require that they are the receipt's one rendering
    (:func:`verify_file` does), so that no byte of the file can change unnoticed.
    """
    problems: list[str] = []
    recorded = doc.get(_HASH_FIELD)
    try:
        recomputed = compute_hash(doc)
    except ValueError:  # NaN or infinity inside a dict that was never sanitised
        recomputed = compute_hash(sanitize(doc))
        problems.append("holds NaN/inf numbers; receipts store them as strings")
    hash_ok = isinstance(recorded, str) and recorded == recomputed
    if not hash_ok:
        problems.append(f"sha256 mismatch: recorded {recorded}, recomputed {recomputed}")

    bytes_ok: bool | None = None
    if raw is not None:
        try:
            bytes_ok = raw == render_receipt(doc)
        except ValueError:
            bytes_ok = False
        if not bytes_ok and hash_ok:
            problems.append("file bytes differ from the receipt's rendering (edited layout)")

    cases = doc.get("cases") if isinstance(doc.get("cases"), list) else []
    summary = doc.get("summary") if isinstance(doc.get("summary"), dict) else {}
    summary_ok = summary == summarize(c for c in cases if isinstance(c, Mapping))
    if not summary_ok:
        problems.append("summary does not match the cases")

    warnings: list[str] = []
    status = doc.get("status")
    if status == "partial":
        warnings.append("partial receipt: the run was interrupted before its last case")
    elif status not in STATUSES:
        warnings.append(f"unknown status {status!r}")

    recorded_sources = doc.get("sources") if isinstance(doc.get("sources"), dict) else {}
    current = source_hashes() if current_sources is None else current_sources
    diff = compare_source_hashes(recorded_sources, current)

    return Verification(
        hash_ok=hash_ok,
        recorded=recorded if isinstance(recorded, str) else None,
        recomputed=recomputed,
        bytes_ok=bytes_ok,
        summary_ok=summary_ok,
        kind=doc.get("kind"),
        status=status,
        device=doc.get("device") if isinstance(doc.get("device"), dict) else {},
        summary=summary,
        created_at=doc.get("created_at"),
        tool_version=doc.get("tool_version"),
        git=doc.get("git") if isinstance(doc.get("git"), dict) else {},
        sources=diff,
        path=None if path is None else str(path),
        resealed=doc.get("resealed") if isinstance(doc.get("resealed"), dict) else None,
        problems=problems,
        warnings=warnings,
    )


def verify_bytes(
    raw: bytes, current_sources: Mapping[str, str] | None = None, *, label: str = "receipt"
) -> Verification:
    """Parse and verify a receipt's file bytes. Raises :class:`ReceiptError` for bytes
    that are not a receipt (not UTF-8, not JSON, wrong schema)."""
    return verify_receipt(_parse(raw, label), current_sources, raw=raw)


def verify_file(
    path: str | os.PathLike, current_sources: Mapping[str, str] | None = None
) -> Verification:
    """Read and verify a receipt file, bytes included. Raises :class:`ReceiptError` for a
    file that cannot be read or is not a receipt."""
    doc, raw = read_receipt(path)
    return verify_receipt(doc, current_sources, raw=raw, path=path)
