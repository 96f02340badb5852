"""Receipts: one verifiable JSON document per run (schema ``kdabench.receipt.v1``).

A receipt holds::

    schema         "kdabench.receipt.v1"
    kind           "qualify" | "bench" | "serve-sweep"
    tool_version   kdabench version that wrote it
    created_at     UTC ISO 8601, seconds ("2026-12-02T16:24:00Z")
    git            {"commit": str | None, "dirty": bool | None}
    sources        {"kernels/triton/prefill.py": sha256, ...}  (kdabench.sources)
    device         device identity (kdabench.environment.device_identity)
    toolchain      {"python": ..., "torch": ..., ...}         (kdabench.environment.toolchain)
    command_line   argv as a list of strings
    config         free dict: the matrix, the options
    cases          [{"id": str, "verdict": "pass"|"fail"|"error"|"skip", ...free fields}]
    summary        {"total": n, "pass": n, "fail": n, "error": n, "skip": n}  (computed)
    status         "complete" | "partial" (an interrupted run)
    sha256         sha256 hex of the canonical JSON of every other field

Canonical JSON is ``json.dumps(obj, sort_keys=True, separators=(",", ":"),
ensure_ascii=False, allow_nan=False)`` encoded UTF-8. NaN and infinities are not JSON:
:func:`sanitize` turns them into the strings "nan", "inf", "-inf" before anything is
hashed or written.

On disk a receipt is rendered in exactly one way (:func:`render_receipt`: sorted keys,
two-space indent, trailing newline), so :func:`verify_file` can reject any edited
byte: an edit inside a value breaks the hash, an edit of whitespace or key order breaks
the rendering.

Writes are atomic (temporary file in the same folder, fsync, ``os.replace``). A
:class:`ReceiptWriter` rewrites the receipt as "partial" while cases arrive and as
"complete" when its ``with`` block ends normally; an exception or Ctrl-C leaves the
last partial receipt, which still verifies.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdabench.sources import SourceDiff, compare_source_hashes, source_hashes

SCHEMA = "kdabench.receipt.v1"
KINDS = ("qualify", "bench", "serve-sweep")
VERDICTS = ("pass", "fail", "error", "skip")
STATUSES = ("complete", "partial")

# Config keys that legitimately differ between shards of one matrix run; every other
# config key must be equal for shards to be merged.
SHARD_CONFIG_KEYS = frozenset({"shard"})

# Device identity keys that name one unit or its host rather than the device model;
# shards run on two GPUs of the same model may differ in these and still be merged.
DEVICE_UNIT_KEYS = frozenset({"device", "uuid", "cpu_model", "cpu_count"})

_HASH_FIELD = "sha256"
_REQUIRED_FIELDS = (
    "schema", "kind", "tool_version", "created_at", "git", "sources", "device",
    "toolchain", "command_line", "config", "cases", "summary", "status", _HASH_FIELD,
)


class ReceiptError(ValueError):
    """A receipt cannot be read, built or merged; the message is one line for the user."""


# --------------------------------------------------------------------------- encoding


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


# --------------------------------------------------------------------------- file names


def device_slug(device: Mapping[str, Any] | str | None) -> str:
    """A file-name-safe slug for a device: "NVIDIA H200" -> "nvidia-h200"."""
    if isinstance(device, Mapping):
        name = device.get("name") or device.get("type") or "unknown"
    else:
        name = device or "unknown"
    name = re.sub(r"\((r|tm|c)\)", " ", str(name).lower())
    slug = re.sub(r"[^a-z0-9]+", "-", name).strip("-")
    return slug or "unknown"


def receipt_filename(kind: str, device: Mapping[str, Any] | str | None, created_at: str) -> str:
    """``<kind>-<device-slug>-<YYYYmmddTHHMMSS>.json`` for a receipt."""
    _check_kind(kind)
    try:
        moment = _dt.datetime.fromisoformat(created_at.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ReceiptError(f"created_at {created_at!r} is not an ISO 8601 time") from exc
    if moment.tzinfo is not None:
        moment = moment.astimezone(_dt.timezone.utc)
    return f"{kind}-{device_slug(device)}-{moment.strftime('%Y%m%dT%H%M%S')}.json"


# --------------------------------------------------------------------------- writing


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically: temp file in the same folder, fsync, replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary: str | None = None
    try:
        with tempfile.NamedTemporaryFile(
            mode="wb", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
        ) as handle:
            temporary = handle.name
            os.chmod(temporary, 0o666 & ~_current_umask())  # as open() would create it
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        if temporary is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
        raise
    _fsync_dir(path.parent)
    return path


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ReceiptError(f"unknown receipt kind {kind!r}; expected one of {', '.join(KINDS)}")


def seal(body: Mapping[str, Any]) -> dict[str, Any]:
    """Sanitise a receipt body, recompute its summary and add its ``sha256``."""
    doc = sanitize({key: value for key, value in body.items() if key != _HASH_FIELD})
    doc["summary"] = summarize(doc.get("cases", []))
    doc[_HASH_FIELD] = compute_hash(doc)
    return doc


class ReceiptBuilder:
    """Collects the cases of one run and renders them as a sealed receipt.

    Made by :func:`new_receipt`. Attributes are plain data and may be read; cases are
    added with :meth:`add_case` only, so ids stay unique and verdicts valid.
    """

    def __init__(
        self,
        kind: str,
        *,
        config: Mapping[str, Any],
        command_line: Sequence[str],
        device: Mapping[str, Any],
        toolchain: Mapping[str, Any],
        git: Mapping[str, Any],
        sources: Mapping[str, str],
        tool_version: str,
        created_at: str,
    ) -> None:
        _check_kind(kind)
        self.kind = kind
        self.config = sanitize(dict(config))
        self.command_line = [str(arg) for arg in command_line]
        self.device = sanitize(dict(device))
        self.toolchain = sanitize(dict(toolchain))
        self.git = sanitize(dict(git))
        self.sources = dict(sorted(sources.items()))
        self.tool_version = tool_version
        self.created_at = created_at
        self._cases: list[dict[str, Any]] = []
        self._ids: set[str] = set()

    @property
    def cases(self) -> list[dict[str, Any]]:
        """A copy of the cases added so far, in the order added."""
        return [dict(case) for case in self._cases]

    def add_case(self, case: Mapping[str, Any]) -> dict[str, Any]:
        """Add one case; returns the sanitised copy stored.

        A case needs a unique string ``id`` and a ``verdict`` in pass/fail/error/skip;
        every other field is free (errors, tolerances, samples_ms, median_ms, index...).
        """
        case_id = case.get("id")
        if not isinstance(case_id, str) or not case_id:
            raise ReceiptError(f"a case needs a non-empty string 'id', got {case_id!r}")
        verdict = case.get("verdict")
        if verdict not in VERDICTS:
            raise ReceiptError(
                f"case {case_id!r}: verdict {verdict!r} is not one of {', '.join(VERDICTS)}"
            )
        if case_id in self._ids:
            raise ReceiptError(f"case id {case_id!r} was added twice")
        stored = sanitize(dict(case))
        self._cases.append(stored)
        self._ids.add(case_id)
        return dict(stored)

    def document(self, status: str = "complete") -> dict[str, Any]:
        """The sealed receipt (with summary and sha256) for the cases so far."""
        if status not in STATUSES:
            raise ReceiptError(f"status {status!r} is not one of {', '.join(STATUSES)}")
        return seal({
            "schema": SCHEMA,
            "kind": self.kind,
            "tool_version": self.tool_version,
            "created_at": self.created_at,
            "git": self.git,
            "sources": self.sources,
            "device": self.device,
            "toolchain": self.toolchain,
            "command_line": self.command_line,
            "config": self.config,
            "cases": self._cases,
            "status": status,
        })

    def filename(self) -> str:
        """``<kind>-<device-slug>-<YYYYmmddTHHMMSS>.json`` for this receipt."""
        return receipt_filename(self.kind, self.device, self.created_at)

    def write(self, path: str | os.PathLike, status: str = "complete") -> Path:
        """Write the receipt atomically to ``path``; returns the path."""
        return atomic_write_bytes(path, render_receipt(self.document(status)))

    def writer(self, path: str | os.PathLike, *, every: int = 1) -> ReceiptWriter:
        """A :class:`ReceiptWriter` for this builder (see there)."""
        return ReceiptWriter(self, path, every=every)


class ReceiptWriter:
    """Keeps a receipt on disk current while a run adds cases.

    ::

        with new_receipt("qualify", config=cfg).writer(out_path) as receipt:
            for case in cases:
                receipt.add_case(run(case))

    On entry it writes an empty "partial" receipt; every ``every`` cases it rewrites
    the receipt as "partial"; when the block ends normally it writes "complete". When
    the block raises (an exception or KeyboardInterrupt) it writes "partial" with every
    case added so far and lets the exception propagate.
    """

    def __init__(self, builder: ReceiptBuilder, path: str | os.PathLike, *, every: int = 1):
        if every < 1:
            raise ValueError("every must be at least 1")
        self.builder = builder
        self.path = Path(path)
        self.every = every
        self.status: str | None = None
        self._unwritten = 0

    def add_case(self, case: Mapping[str, Any]) -> dict[str, Any]:
        stored = self.builder.add_case(case)
        self._unwritten += 1
        if self._unwritten >= self.every:
            self.flush()
        return stored

    def flush(self, status: str = "partial") -> Path:
        """Write the receipt now with ``status``."""
        self.builder.write(self.path, status=status)
        self.status = status
        self._unwritten = 0
        return self.path

    def __enter__(self) -> ReceiptWriter:  # noqa: PYI034 - Self needs Python 3.11
        self.flush("partial")
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.flush("complete" if exc_type is None else "partial")
        return False


def _tool_version() -> str:
    import kdabench

    version = getattr(kdabench, "__version__", None)
    if version:
        return str(version)
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("kdabench")
    except PackageNotFoundError:  # an uninstalled tree still writes receipts
        return "unknown"


def repo_root() -> Path:
    """The folder that holds the kdabench package (the repository in a checkout)."""
    import kdabench

    return Path(kdabench.__file__).resolve().parent.parent


def new_receipt(
    kind: str,
    *,
    config: Mapping[str, Any],
    command_line: Sequence[str] | None = None,
    device: Any = None,
    sources: Mapping[str, str] | None = None,
    created_at: str | None = None,
) -> ReceiptBuilder:
    """Start a receipt: collects tool version, git state, source hashes, device, toolchain.

    ``device`` is an identity dict, or anything :func:`kdabench.environment.device_identity`
    accepts (None: the current device). ``command_line`` defaults to ``sys.argv``;
    ``sources`` to :func:`kdabench.sources.source_hashes`; ``created_at`` to now (UTC).
    """
    from kdabench import environment

    _check_kind(kind)
    if not isinstance(device, Mapping):
        device = environment.device_identity(None if device is None else str(device))
    return ReceiptBuilder(
        kind,
        config=config,
        command_line=list(sys.argv) if command_line is None else command_line,
        device=device,
        toolchain=environment.toolchain(),
        git=environment.git_state(repo_root()),
        sources=source_hashes() if sources is None else sources,
        tool_version=_tool_version(),
        created_at=utc_now() if created_at is None else created_at,
    )


# --------------------------------------------------------------------------- reading


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
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise ReceiptError(f"{path}: no such file") from exc
    except IsADirectoryError as exc:
        raise ReceiptError(f"{path}: is a folder, not a receipt file") from exc
    except OSError as exc:
        raise ReceiptError(f"{path}: cannot read ({exc.strerror})") from exc
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


# --------------------------------------------------------------------------- merging


def _shard_config(config: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in config.items() if key not in SHARD_CONFIG_KEYS}


def _device_model(device: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in device.items() if key not in DEVICE_UNIT_KEYS}


def _differing_keys(first: Mapping[str, Any], other: Mapping[str, Any]) -> list[str]:
    keys = set(first) | set(other)
    return sorted(key for key in keys if first.get(key) != other.get(key))


def _case_order(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    indices = [case.get("index") for case in cases]
    if cases and all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
        seen: dict[int, str] = {}
        for case in cases:
            if case["index"] in seen:
                raise ReceiptError(
                    f"cases {seen[case['index']]!r} and {case['id']!r} share index {case['index']}"
                )
            seen[case["index"]] = case["id"]
        return sorted(cases, key=lambda case: case["index"])
    return sorted(cases, key=lambda case: case["id"])


def merge_receipts(
    docs: Sequence[Mapping[str, Any]],
    *,
    labels: Sequence[str] | None = None,
    command_line: Sequence[str] | None = None,
    created_at: str | None = None,
) -> dict[str, Any]:
    """Join shard receipts of one run into one sealed receipt.

    Every shard must verify, be complete, and share kind, tool version, git commit,
    source hashes, toolchain, device model (keys in :data:`DEVICE_UNIT_KEYS` may differ)
    and config (keys in :data:`SHARD_CONFIG_KEYS` may differ); case ids must be unique
    across shards. Cases are ordered by their ``index`` field when every case has one,
    else by id. ``config["merged_from"]`` records each shard (label, shard, sha256,
    created_at, case count, device). The merged receipt is "partial" when the shards
    declare a shard count (``config["shard"]`` as "I/N" or {"index", "count"}) and some
    shard of it is absent. Raises :class:`ReceiptError` with the reason otherwise.
    """
    if not docs:
        raise ReceiptError("nothing to merge: give at least one shard receipt")
    labels = list(labels) if labels is not None else [f"shard {i + 1}" for i in range(len(docs))]
    if len(labels) != len(docs):
        raise ReceiptError("merge_receipts: one label per receipt")

    for doc, label in zip(docs, labels, strict=True):
        if doc.get("schema") != SCHEMA:
            raise ReceiptError(f"{label}: not a {SCHEMA} receipt")
        check = verify_receipt(doc, current_sources=doc.get("sources") or {})
        if not (check.hash_ok and check.summary_ok):
            raise ReceiptError(f"{label}: does not verify ({'; '.join(check.problems)})")
        if doc.get("status") != "complete":
            raise ReceiptError(f"{label}: is a partial receipt (interrupted run); rerun that shard")

    first, first_label = docs[0], labels[0]
    for doc, label in zip(docs[1:], labels[1:], strict=True):
        if doc["kind"] != first["kind"]:
            raise ReceiptError(
                f"{label} is a {doc['kind']!r} receipt, {first_label} a {first['kind']!r} one; "
                "only receipts of one kind merge"
            )
        if doc["sources"] != first["sources"]:
            diff = compare_source_hashes(first["sources"], doc["sources"])
            raise ReceiptError(
                f"{label} and {first_label} were made from different kernel/oracle sources "
                f"({diff.describe()})"
            )
        if _shard_config(doc["config"]) != _shard_config(first["config"]):
            keys = _differing_keys(_shard_config(first["config"]), _shard_config(doc["config"]))
            raise ReceiptError(
                f"{label} and {first_label} ran different configurations "
                f"(differing config keys: {', '.join(keys)})"
            )
        if doc["tool_version"] != first["tool_version"]:
            raise ReceiptError(
                f"{label} was made by kdabench {doc['tool_version']}, {first_label} by "
                f"{first['tool_version']}"
            )
        if doc["toolchain"] != first["toolchain"]:
            keys = _differing_keys(first["toolchain"], doc["toolchain"])
            raise ReceiptError(
                f"{label} and {first_label} used different toolchains ({', '.join(keys)})"
            )
        if _device_model(doc["device"]) != _device_model(first["device"]):
            keys = _differing_keys(_device_model(first["device"]), _device_model(doc["device"]))
            raise ReceiptError(
                f"{label} and {first_label} ran on different devices ({', '.join(keys)})"
            )
        if doc["git"].get("commit") != first["git"].get("commit"):
            raise ReceiptError(
                f"{label} was made at commit {doc['git'].get('commit')}, {first_label} at "
                f"{first['git'].get('commit')}"
            )

    owner: dict[str, str] = {}
    cases: list[dict[str, Any]] = []
    for doc, label in zip(docs, labels, strict=True):
        for case in doc["cases"]:
            case_id = case.get("id")
            if case_id in owner:
                raise ReceiptError(
                    f"case id {case_id!r} appears in both {owner[case_id]} and {label}"
                )
            owner[case_id] = label
            cases.append(dict(case))
    cases = _case_order(cases)

    shards = [doc["config"].get("shard") for doc in docs]
    status = "complete" if _shards_complete(shards) else "partial"
    config = _shard_config(first["config"])
    config["merged_from"] = [
        {
            "label": label,
            "shard": doc["config"].get("shard"),
            "sha256": doc[_HASH_FIELD],
            "created_at": doc["created_at"],
            "cases": len(doc["cases"]),
            "device": doc["device"],
        }
        for doc, label in zip(docs, labels, strict=True)
    ]
    return seal({
        "schema": SCHEMA,
        "kind": first["kind"],
        "tool_version": first["tool_version"],
        "created_at": utc_now() if created_at is None else created_at,
        "git": {
            "commit": first["git"].get("commit"),
            "dirty": any(bool(doc["git"].get("dirty")) for doc in docs),
        },
        "sources": first["sources"],
        "device": first["device"],
        "toolchain": first["toolchain"],
        "command_line": list(sys.argv) if command_line is None else list(command_line),
        "config": config,
        "cases": cases,
        "status": status,
    })


def parse_shard(shard: Any) -> tuple[int, int] | None:
    """(index, count) from "I/N" or {"index": I, "count": N}; None when not a shard."""
    if isinstance(shard, str):
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", shard)
        if match:
            return int(match.group(1)), int(match.group(2))
        return None
    if isinstance(shard, Mapping):
        index, count = shard.get("index"), shard.get("count")
        if isinstance(index, int) and isinstance(count, int):
            return index, count
    return None


def _shards_complete(shards: list[Any]) -> bool:
    parsed = [parse_shard(shard) for shard in shards]
    if any(item is None for item in parsed):
        return True  # shards that do not declare a count cannot be checked for gaps
    counts = {count for _, count in parsed}
    if len(counts) != 1:
        raise ReceiptError(
            f"shards disagree on the shard count: {', '.join(str(s) for s in shards)}"
        )
    (count,) = counts
    indices = [index for index, _ in parsed]
    if len(set(indices)) != len(indices):
        raise ReceiptError(f"the same shard appears twice: {', '.join(str(s) for s in shards)}")
    return set(indices) == set(range(1, count + 1))


def missing_shards(merged: Mapping[str, Any]) -> list[str]:
    """For a merged receipt, the shards ("I/N") its shard count names but it lacks."""
    sources = merged.get("config", {}).get("merged_from", [])
    parsed = [parse_shard(entry.get("shard")) for entry in sources]
    if not parsed or any(item is None for item in parsed):
        return []
    count = parsed[0][1]
    present = {index for index, _ in parsed}
    return [f"{index}/{count}" for index in range(1, count + 1) if index not in present]
