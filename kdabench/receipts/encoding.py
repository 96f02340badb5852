"""The receipt schema's constants and its one encoding: sanitising, canonical JSON, the
sha256 over it, the on-disk rendering, and sealing a body (summary and hash added)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

SCHEMA = "kdabench.receipt.v1"
KINDS = ("qualify", "bench", "serve-sweep", "fuzz")
VERDICTS = ("pass", "fail", "error", "skip")
STATUSES = ("complete", "partial")


_HASH_FIELD = "sha256"
_REQUIRED_FIELDS = (
    "schema", "kind", "tool_version", "created_at", "git", "sources", "device",
    "toolchain", "command_line", "config", "cases", "summary", "status", _HASH_FIELD,
)


class ReceiptError(ValueError):
    """A receipt cannot be read, built or merged; the message is one line for the user."""


def sanitize(value: Any) -> Any:
    """Return a JSON-safe copy of ``value``.

    Floats NaN/inf/-inf become "nan"/"inf"/"-inf"; tuples become lists; numpy and torch
    scalars become Python numbers (via ``.item()``); ``Path`` becomes ``str``. Mapping
    keys must be strings. Anything else raises ``TypeError`` naming the type.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return float(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"receipt keys must be strings, got {type(key).__name__}: {key!r}")
            out[key] = sanitize(item)
        return out
    if isinstance(value, (list, tuple)):
        return [sanitize(item) for item in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return sanitize(item())
        except (TypeError, ValueError):
            pass
    raise TypeError(f"cannot store {type(value).__name__} in a receipt: {value!r}")


def canonical_json(obj: Any) -> bytes:
    """The canonical UTF-8 JSON bytes of an already sanitised object."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def compute_hash(doc: Mapping[str, Any]) -> str:
    """sha256 hex of the canonical JSON of every field of ``doc`` except ``sha256``."""
    body = {key: value for key, value in doc.items() if key != _HASH_FIELD}
    return hashlib.sha256(canonical_json(body)).hexdigest()


def render_receipt(doc: Mapping[str, Any]) -> bytes:
    """The one on-disk form of a receipt: sorted keys, indent 2, UTF-8, final newline."""
    text = json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False)
    return (text + "\n").encode("utf-8")


def summarize(cases: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Counts by verdict: {"total", "pass", "fail", "error", "skip"}."""
    counts = Counter(case.get("verdict") for case in cases)
    summary = {"total": sum(counts.values())}
    summary.update({verdict: counts.get(verdict, 0) for verdict in VERDICTS})
    return summary


def utc_now() -> str:
    """Current UTC time as ISO 8601 with seconds and a Z suffix."""
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    return now.isoformat().replace("+00:00", "Z")


def seal(body: Mapping[str, Any]) -> dict[str, Any]:
    """Sanitise a receipt body, recompute its summary and add its ``sha256``."""
    doc = sanitize({key: value for key, value in body.items() if key != _HASH_FIELD})
    doc["summary"] = summarize(doc.get("cases", []))
    doc[_HASH_FIELD] = compute_hash(doc)
    return doc
