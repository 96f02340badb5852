"""Where the cute backend's compiled functions come from on this machine.

In order: an ahead-of-time build for the GPU's arch whose manifest matches the kernel sources
(`$KDABENCH_CUTE_KERNELS`, default `~/.cache/kdabench/cute-kernels`, loaded through
apache-tvm-ffi), else a just-in-time compile when nvidia-cutlass-dsl is installed, else
nothing, with the reasons. `KernelLibrary.origin` is the one line a plan reports.
"""

from __future__ import annotations

import ctypes
import json
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch

from ..folders import shown_folder
from .manifest import LIBRARY_NAME, MANIFEST_NAME, RUNTIME_NAME, arch_of, manifest_problems
from .variants import Variant

ARTIFACTS_ENV = "KDABENCH_CUTE_KERNELS"
DEFAULT_ARTIFACTS = "~/.cache/kdabench/cute-kernels"


def configured_artifact_dir() -> str:
    """Where ahead-of-time builds live, as configured: $KDABENCH_CUTE_KERNELS, else
    ~/.cache/kdabench/cute-kernels (the name a plan's origin shows: no machine's folders)."""
    return os.environ.get(ARTIFACTS_ENV) or DEFAULT_ARTIFACTS


def artifact_dir() -> Path:
    """The folder of :func:`configured_artifact_dir` on this machine."""
    return Path(configured_artifact_dir()).expanduser()


@dataclass
class KernelLibrary:
    """The compiled functions for one arch: from an AOT module, or compiled on demand."""

    arch: str
    origin: str
    module: Any = None
    functions: set[str] = field(default_factory=set)
    compiled: dict[str, Any] = field(default_factory=dict)

    @property
    def jit(self) -> bool:
        return self.module is None

    def missing(self, variant: Variant) -> str | None:
        """Why `variant` cannot be had here (None when it can)."""
        if self.jit or variant.name in self.functions:
            return None
        if _dsl_available():
            return None
        return (f"{variant.name} is not in the ahead-of-time build ({self.origin}) and the CuTe "
                "DSL is not installed to compile it (pip install 'kdabench[cute]')")

    def function(self, variant: Variant):
        """The callable for `variant` (compiles it the first time when it is not prebuilt)."""
        if not self.jit and variant.name in self.functions:
            return getattr(self.module, variant.name)
        if variant.name not in self.compiled:
            from .compile import compile_variant

            self.compiled[variant.name] = compile_variant(variant, self.arch)
        return self.compiled[variant.name]


@cache
def _dsl_available() -> bool:
    try:
        import cutlass.cute  # noqa: F401
    except ImportError:
        return False
    return True


def _tvm_ffi():
    try:
        import tvm_ffi
    except ImportError:
        return None
    return tvm_ffi


def _load_aot(arch: str, directory: str | Path) -> tuple[KernelLibrary | None, list[str]]:
    folder = Path(directory).expanduser() / arch
    manifest_path = folder / MANIFEST_NAME
    if not manifest_path.is_file():
        return None, [f"no ahead-of-time build for {arch} in {directory} "
                      "(kdabench build-kernels --arch " + arch + ")"]
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        return None, [f"{manifest_path} is unreadable: {exc}"]
    problems = manifest_problems(manifest, arch, folder)
    if problems:
        return None, [f"{manifest_path}: " + "; ".join(problems)]
    tvm_ffi = _tvm_ffi()
    if tvm_ffi is None:
        return None, ["apache-tvm-ffi is not installed (it loads the ahead-of-time build)"]
    try:
        ctypes.CDLL(str(folder / RUNTIME_NAME), mode=ctypes.RTLD_GLOBAL)
        module = tvm_ffi.load_module(str((folder / LIBRARY_NAME).resolve()))
    except (OSError, RuntimeError) as exc:
        return None, [f"loading {folder / LIBRARY_NAME} failed: {exc}"]
    origin = (f"aot {shown_folder(directory)}/{arch} (nvidia-cutlass-dsl {manifest.get('dsl_version')}, "
              f"built {manifest.get('built_at')})")
    return KernelLibrary(arch, origin, module, set(manifest.get("functions", {}))), []


@cache
def _library(arch: str, directory: str) -> tuple[KernelLibrary | None, tuple[str, ...]]:
    library, reasons = _load_aot(arch, directory)
    if library is not None:
        return library, ()
    if _dsl_available() and _tvm_ffi() is not None:
        from .compile import dsl_version

        return KernelLibrary(arch, f"jit (nvidia-cutlass-dsl {dsl_version()})"), ()
    reasons.append("the CuTe DSL is not installed to compile the kernels just in time "
                   "(pip install 'kdabench[cute]')")
    return None, tuple(reasons)


def library_for(device: torch.device) -> tuple[KernelLibrary | None, list[str]]:
    """The kernel library for a CUDA device, or None and the reasons there is none."""
    arch = arch_of(torch.cuda.get_device_capability(device))
    library, reasons = _library(arch, configured_artifact_dir())
    return library, list(reasons)
