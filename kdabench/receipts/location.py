"""Where a command writes its receipts when it is not told: a working folder, not results/.

Everyday runs (`kdabench qualify`, `bench`, `serve-sweep`) leave their receipts in
``.kdabench/`` in the current directory, or in $KDABENCH_OUT, the way asv and
pytest-benchmark keep theirs. Like pytest's cache, ``.kdabench/`` holds a ``.gitignore`` of
``*``, so it stays out of whatever repository it is made in. The repository's results/ holds
only the curated evidence the README cites, written there on purpose with
``--out results/`` (and read by :mod:`kdabench.receipts.qualified`).
"""

from __future__ import annotations

import os
from pathlib import Path

OUT_ENV = "KDABENCH_OUT"
WORKING_FOLDER = ".kdabench"


def receipt_dir(out_dir: str | os.PathLike | None = None) -> Path:
    """The folder a receipt is written to: ``out_dir`` when given, else $KDABENCH_OUT, else
    ``.kdabench/`` in the current directory (made, git-ignored, by :func:`working_folder`)."""
    if out_dir:
        return Path(out_dir)
    configured = os.environ.get(OUT_ENV)
    if configured:
        return Path(configured)
    return working_folder(Path.cwd())


def working_folder(parent: Path) -> Path:
    """``parent/.kdabench``, made on first use with a ``.gitignore`` of ``*``."""
    folder = parent / WORKING_FOLDER
    ignore = folder / ".gitignore"
    if not ignore.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        ignore.write_text("# kdabench's working receipts (see `kdabench qualify --help`)\n*\n")
    return folder
