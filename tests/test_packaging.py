"""pyproject.toml lists every package folder: a folder left out imports in an editable install
(its parent's folder is on the path) but is missing from a built wheel."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent


def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed():
    config = _setuptools()
    listed = set(config["packages"])
    folders = {}
    for name, folder in config["package-dir"].items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            parts = init.parent.relative_to(root).parts
            folders[".".join((name, *parts))] = init.parent
    missing = sorted(set(folders) - listed)
    assert not missing, f"package folders missing from pyproject's packages: {missing}"


def test_every_listed_package_has_its_folder():
    config = _setuptools()
    for name in config["packages"]:
        folder = config["package-dir"].get(name)
        assert folder is not None, f"{name} has no package-dir entry"
        assert (REPO / folder / "__init__.py").is_file(), f"{name}: {folder}/__init__.py missing"
