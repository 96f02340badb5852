"""What an ahead-of-time build of the cute backend writes, and how to tell that it matches."""

from __future__ import annotations

import hashlib
from pathlib import Path

MANIFEST_SCHEMA = "kdabench.cute-kernels/v1"
MANIFEST_NAME = "manifest.json"
LIBRARY_NAME = "libkdabench_cute.so"
RUNTIME_NAME = "libcute_dsl_runtime.so"
SUPPORTED_ARCHS = ("sm_90a", "sm_100a", "sm_120a", "sm_121a")
# What decides the binaries, relative to kernels/: the DSL sources and the contract they read.
COMPILED_SOURCES = ("cute/source.py", "cute/chunk_source.py", "cute/wgmma_source.py",
                    "cute/ptx.py", "cute/compile.py", "cute/variants.py", "contract.py")


def file_sha256(path: Path) -> str:
    """sha256 hex digest of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def kernel_source_hashes() -> dict[str, str]:
    """sha256 of the files that decide the compiled kernels, keyed kernels/<path>."""
    kernels = Path(__file__).resolve().parent.parent
    return {f"kernels/{name}": file_sha256(kernels / name) for name in COMPILED_SOURCES}


def arch_of(capability: tuple[int, int]) -> str:
    """The DSL target of a compute capability: (9, 0) -> sm_90a, (12, 1) -> sm_121a."""
    major, minor = capability
    return f"sm_{major}{minor}a"


def manifest_problems(manifest: dict, arch: str, directory: Path) -> list[str]:
    """Why a manifest does not fit this arch and these sources (empty when it does)."""
    problems = []
    if manifest.get("schema") != MANIFEST_SCHEMA:
        problems.append(f"schema {manifest.get('schema')!r}, expected {MANIFEST_SCHEMA!r}")
    if manifest.get("arch") != arch:
        problems.append(f"built for {manifest.get('arch')!r}, this GPU needs {arch!r}")
    if manifest.get("sources") != kernel_source_hashes():
        problems.append("built from other kernel sources (rebuild: kdabench build-kernels)")
    for name, digest in (manifest.get("files") or {}).items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif file_sha256(path) != digest:
            problems.append(f"{name} does not match its sha256 in the manifest")
    if not manifest.get("files"):
        problems.append("the manifest lists no files")
    return problems
