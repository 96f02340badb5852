"""Which receipt files a command was pointed at: files as given, folders as their *.json."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def receipt_files(inputs: Iterable[str | os.PathLike], error: type[Exception]) -> list[Path]:
    """Receipt files named by ``inputs``, each once: files as given, folders as their
    ``*.json`` (hidden files left out); ``error`` when a path is missing or a folder holds
    no receipt."""
    paths: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.glob("*.json")
                           if p.is_file() and not p.name.startswith("."))
            if not found:
                raise error(f"{path}: a folder with no *.json receipt in it")
            paths += found
        elif path.exists():
            paths.append(path)
        else:
            raise error(f"{path}: no such file or folder")
    unique: list[Path] = []
    seen: set[Path] = set()
    for path in paths:
        if path.resolve() not in seen:
            seen.add(path.resolve())
            unique.append(path)
    return unique
