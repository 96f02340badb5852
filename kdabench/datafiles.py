"""Reading kdabench's data files (matrices, shapes, arms, receipts) with one-line errors."""

from __future__ import annotations

import hashlib
import os
from importlib import resources
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def packaged_bytes(name: str) -> bytes:
    """The bytes of a file shipped in kdabench/data/."""
    return resources.files("kdabench").joinpath("data", name).read_bytes()


def read_bytes(path: str | os.PathLike, noun: str, error: type[Exception]) -> bytes:
    """A file's bytes; `error` with "no such <noun>", "is a folder" or "cannot read"."""
    path = Path(path)
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise error(f"{path}: no such {noun}") from exc
    except IsADirectoryError as exc:
        raise error(f"{path}: is a folder, not a {noun}") from exc
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror})") from exc


def load_data_file(path: str | os.PathLike | None, default: str, noun: str,
                   error: type[Exception], parse: Any) -> Any:
    """parse(bytes, origin=...) of the file at `path`, or of kdabench/data/`default` when
    path is None (origin "default")."""
    if path is None:
        return parse(packaged_bytes(default), origin="default")
    return parse(read_bytes(path, noun, error), origin=str(path))


def parse_toml(raw: bytes | str, origin: str, error: type[Exception]) -> tuple[dict[str, Any], str]:
    """(document, sha256 of the bytes) of TOML text; `error` names `origin` and the line."""
    data = raw.encode("utf-8") if isinstance(raw, str) else raw
    try:
        document = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise error(f"{origin}: not UTF-8 text") from exc
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{origin}: TOML syntax error: {exc}") from exc
    return document, hashlib.sha256(data).hexdigest()
