"""sha256 of every kernel and oracle source file, and how two such sets differ.

A receipt records which kernel and oracle sources produced it. The keys are paths as
they appear in the repository (``kernels/triton/prefill.py``, ``oracles/recurrent.py``),
not as they appear on disk, so an editable install and a wheel install of the same
sources give the same dictionary.

The packages are located with :func:`importlib.util.find_spec`, which resolves the
``package-dir`` mapping of an editable install without importing the packages (the
kernel package pulls in torch and triton; hashing must not).
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Import name -> the folder name it has in the repository (pyproject `package-dir`).
SOURCE_PACKAGES: dict[str, str] = {
    "kdabench.kernels": "kernels",
    "kdabench.oracles": "oracles",
}

_SKIP_DIRS = frozenset({"__pycache__"})


def package_dirs(packages: Mapping[str, str] | None = None) -> dict[str, Path]:
    """Return {repository folder name: folder on disk} for each source package.

    Raises ``ModuleNotFoundError`` when a package is not installed.
    """
    packages = SOURCE_PACKAGES if packages is None else packages
    found: dict[str, Path] = {}
    for import_name, repo_name in packages.items():
        spec = importlib.util.find_spec(import_name)
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(f"source package {import_name!r} is not installed")
        locations = list(spec.submodule_search_locations)
        found[repo_name] = Path(locations[0]).resolve()
    return found


def hash_file(path: Path) -> str:
    """sha256 hex digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def hash_tree(root: Path, prefix: str) -> dict[str, str]:
    """sha256 of every ``.py`` file under ``root``, keyed ``prefix/relative/posix/path``.

    ``__pycache__`` folders are skipped. Keys are sorted.
    """
    root = Path(root)
    hashes: dict[str, str] = {}
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if any(part in _SKIP_DIRS for part in relative.parts) or not path.is_file():
            continue
        hashes[f"{prefix}/{relative.as_posix()}"] = hash_file(path)
    return dict(sorted(hashes.items()))


def source_hashes(packages: Mapping[str, str] | None = None) -> dict[str, str]:
    """sha256 of every kernel and oracle source file, keyed by repository path, sorted.

    ``packages`` maps import names to repository folder names; the default is
    :data:`SOURCE_PACKAGES` (``kdabench.kernels`` -> ``kernels``, ``kdabench.oracles`` ->
    ``oracles``).
    """
    hashes: dict[str, str] = {}
    for repo_name, folder in package_dirs(packages).items():
        hashes.update(hash_tree(folder, repo_name))
    return dict(sorted(hashes.items()))


@dataclass(frozen=True)
class SourceDiff:
    """How the sources a receipt recorded compare with the sources in hand.

    ``changed``: in both, different hash. ``missing``: recorded, absent now.
    ``added``: present now, not recorded. ``matching``: in both, same hash.
    """

    matching: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)

    @property
    def match(self) -> bool:
        """True when the two sets of sources are identical."""
        return not (self.changed or self.missing or self.added)

    def to_dict(self) -> dict:
        return {**asdict(self), "match": self.match}

    def describe(self) -> str:
        """One line: 'N files match' or what differs."""
        if self.match:
            return f"{len(self.matching)} source files match"
        parts = []
        for label, names in (("changed", self.changed), ("missing", self.missing),
                             ("added", self.added)):
            if names:
                parts.append(f"{label}: {', '.join(names)}")
        return "; ".join(parts)


def compare_source_hashes(recorded: Mapping[str, str], current: Mapping[str, str]) -> SourceDiff:
    """Compare recorded source hashes with current ones (each list sorted)."""
    recorded_keys, current_keys = set(recorded), set(current)
    both = recorded_keys & current_keys
    return SourceDiff(
        matching=sorted(k for k in both if recorded[k] == current[k]),
        changed=sorted(k for k in both if recorded[k] != current[k]),
        missing=sorted(recorded_keys - current_keys),
        added=sorted(current_keys - recorded_keys),
    )
