#!/usr/bin/env python3
"""Run import-linter (`lint-imports`) over kdabench as it is installed, with the contracts of
this checkout's pyproject.toml; arguments go on to lint-imports (e.g. --verbose).

grimp, import-linter's graph builder, finds a package's modules by walking the one folder
`import kdabench` resolves to, but pyproject's package-dir puts kdabench.kernels, .oracles and
.profiles in folders of their own (kernels/, oracles/, profiles/). So this builds a view: a
temporary kdabench/ of symbolic links, one per entry of kdabench/ and one per package that
package-dir maps elsewhere, and lints that. The checkout it lints is the one this file is in.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "kdabench"


def build_view(root: Path, view: Path) -> None:
    """Lay out `view/kdabench` as the installed package: links into the checkout `root`."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    top = view / PACKAGE
    top.mkdir()
    for entry in (root / package_dir[PACKAGE]).iterdir():
        if entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry)
    for name, folder in package_dir.items():
        parts = name.split(".")
        natural = Path(package_dir[PACKAGE], *parts[1:])
        if parts[0] == PACKAGE and len(parts) == 2 and Path(folder) != natural:
            (top / parts[1]).symlink_to(root / folder)


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="kdabench-imports-") as folder:
        view = Path(folder)
        build_view(ROOT, view)
        lint = Path(sys.executable).parent / "lint-imports"
        env = {**os.environ, "PYTHONPATH": str(view)}
        command = [str(lint), "--no-cache", *argv, str(ROOT / "pyproject.toml")]
        return subprocess.run(command, cwd=view, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
