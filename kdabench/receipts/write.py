"""Building a receipt and writing it: file names, atomic writes, the builder that collects
a run's cases, and the writer that keeps a partial receipt on disk current."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kdabench.receipts.encoding import (
    KINDS,
    SCHEMA,
    STATUSES,
    VERDICTS,
    ReceiptError,
    render_receipt,
    sanitize,
    seal,
    utc_now,
)
from kdabench.sources import source_hashes

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



def free_receipt_path(folder: Path, filename: str, shard: tuple[int, int] | None = None) -> Path:
    """Where to write receipt `filename` in `folder`: with ``-shardIofN`` for shard (I, N), and
    ``-2``, ``-3``, ... until the name is not taken."""
    stem = filename.removesuffix(".json")
    if shard is not None:
        stem += f"-shard{shard[0]}of{shard[1]}"
    path, number = folder / f"{stem}.json", 1
    while path.exists():
        number += 1
        path = folder / f"{stem}-{number}.json"
    return path

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
        self.command_line = portable_command_line(command_line, Path.cwd())
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


def portable_path(value: str, cwd: Path) -> str:
    """``value`` as a receipt records it: an absolute path relative to ``cwd`` when it lies
    inside, else by its last component; anything else as it is."""
    path = Path(value)
    if not path.is_absolute():
        return value
    return os.path.relpath(path, cwd) if path.is_relative_to(cwd) else path.name


def portable_command_line(argv: Sequence[str], cwd: Path) -> list[str]:
    """``argv`` as a receipt records it, naming no machine's folders: the program by its
    name, every other argument (and the value of ``--option=value``) by :func:`portable_path`
    against ``cwd`` (where the command ran)."""
    def portable(value: str) -> str:
        return portable_path(value, cwd)

    recorded = []
    for position, arg in enumerate(str(arg) for arg in argv):
        if position == 0:
            recorded.append(Path(arg).name if Path(arg).is_absolute() else arg)
        elif arg.startswith("--") and "=" in arg:  # --out=/path
            option, value = arg.split("=", 1)
            recorded.append(f"{option}={portable(value)}")
        else:
            recorded.append(portable(arg))
    return recorded


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


def tool_version() -> str:
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
        tool_version=tool_version(),
        created_at=utc_now() if created_at is None else created_at,
    )
