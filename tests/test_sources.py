"""Source hashes: which kernel and oracle files a receipt says produced it."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from kdabench.sources import (
    SourceDiff,
    compare_source_hashes,
    hash_tree,
    package_dirs,
    source_hashes,
)

REPO = Path(__file__).resolve().parent.parent


def test_source_hashes_cover_kernels_and_oracles():
    hashes = source_hashes()
    assert "kernels/__init__.py" in hashes
    assert "oracles/__init__.py" in hashes
    assert all(key.startswith(("kernels/", "oracles/")) for key in hashes)
    assert all(key.endswith(".py") and "__pycache__" not in key for key in hashes)
    assert list(hashes) == sorted(hashes)


def test_source_hashes_are_sha256_of_the_files_in_the_tree():
    dirs = package_dirs()
    hashes = source_hashes()
    for key, digest in hashes.items():
        folder, _, relative = key.partition("/")
        on_disk = dirs[folder] / relative
        assert hashlib.sha256(on_disk.read_bytes()).hexdigest() == digest, key
    expected = {
        path.relative_to(dirs[folder].parent).as_posix()
        for folder in ("kernels", "oracles")
        for path in dirs[folder].rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert set(hashes) == expected


def test_package_dirs_resolve_the_package_dir_mapping():
    dirs = package_dirs()
    assert set(dirs) == {"kernels", "oracles"}
    assert (dirs["kernels"] / "__init__.py").is_file()
    assert (dirs["oracles"] / "__init__.py").is_file()


def test_unknown_package_is_a_clear_error():
    with pytest.raises(ModuleNotFoundError, match=r"kdabench.no_such_package"):
        package_dirs({"kdabench.no_such_package": "nothing"})


def test_hash_tree_keeps_py_files_and_skips_pycache(tmp_path: Path):
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "prefill.py").write_text("x = 1\n")
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "notes.txt").write_text("not source\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "stale.py").write_text("y = 2\n")
    (tmp_path / "triton" / "__pycache__").mkdir()
    (tmp_path / "triton" / "__pycache__" / "prefill.cpython-312.pyc").write_bytes(b"\0")

    hashes = hash_tree(tmp_path, "kernels")

    assert list(hashes) == ["kernels/__init__.py", "kernels/triton/prefill.py"]
    assert hashes["kernels/triton/prefill.py"] == hashlib.sha256(b"x = 1\n").hexdigest()


def test_hash_tree_changes_when_one_byte_changes(tmp_path: Path):
    source = tmp_path / "chunk.py"
    source.write_text("scale = 0.125\n")
    before = hash_tree(tmp_path, "kernels")
    source.write_text("scale = 0.126\n")
    after = hash_tree(tmp_path, "kernels")
    assert compare_source_hashes(before, after).changed == ["kernels/chunk.py"]


def test_compare_source_hashes_sorts_into_four_lists():
    recorded = {"kernels/a.py": "1", "kernels/b.py": "2", "oracles/c.py": "3"}
    current = {"kernels/a.py": "1", "kernels/b.py": "9", "oracles/d.py": "4"}
    diff = compare_source_hashes(recorded, current)
    assert diff == SourceDiff(
        matching=["kernels/a.py"],
        changed=["kernels/b.py"],
        missing=["oracles/c.py"],
        added=["oracles/d.py"],
    )
    assert not diff.match
    assert "changed: kernels/b.py" in diff.describe()
    assert diff.to_dict()["match"] is False


def test_identical_sources_match():
    hashes = source_hashes()
    diff = compare_source_hashes(hashes, dict(hashes))
    assert diff.match
    assert diff.matching == list(hashes)
    assert diff.describe() == f"{len(hashes)} source files match"


def test_hashing_does_not_import_the_kernel_package():
    code = (
        "import sys\n"
        "from kdabench.sources import source_hashes\n"
        "assert source_hashes()\n"
        "print('kdabench.kernels' in sys.modules, 'torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert done.stdout.split() == ["False", "False"]
