"""Ahead-of-time build of the cute backend: compile, export, link, and write a manifest.

Runs without a GPU (nvidia-cutlass-dsl and a C compiler needed). Per architecture it writes
`<out>/<arch>/`: `libkdabench_cute.so` (every variant of `aot_variants(arch)`, exported through
TVM-FFI), a copy of the DSL's `libcute_dsl_runtime.so` it links against, and
`manifest.json` (arch, DSL and TVM-FFI versions, the kernel sources' sha256, each function's
variant, each file's sha256). kdabench.kernels.cute.runtime loads what matches.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import hashlib
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

from .manifest import (
    LIBRARY_NAME,
    MANIFEST_NAME,
    MANIFEST_SCHEMA,
    RUNTIME_NAME,
    SUPPORTED_ARCHS,
    file_sha256,
    kernel_source_hashes,
    manifest_problems,
)
from .variants import Variant, aot_variants

MAX_DEFAULT_JOBS = 8  # each worker holds about 430 MB (the DSL and torch) while it compiles


class BuildError(RuntimeError):
    """The build could not run (no DSL, no compiler, an unknown arch) or failed."""


def _dsl_lib_dir() -> Path:
    from cutlass.cute.export import aot_config

    return Path(aot_config.get_libdir())


def _tvm_ffi_lib_dir() -> Path:
    import tvm_ffi.libinfo

    return Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent


def _compiler() -> str:
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    raise BuildError("no C compiler (cc, gcc or clang) on PATH to link the shared library")


def default_jobs() -> int:
    """How many variants a build compiles at once: the CPUs this process may run on, at most
    MAX_DEFAULT_JOBS."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(cpus or 1, MAX_DEFAULT_JOBS)


def _compile_object(variant: Variant, arch: str, path: str) -> None:
    """Compile `variant` for `arch` and export it to the object file `path` (a worker's job)."""
    from .compile import compile_variant

    compile_variant(variant, arch).export_to_c(path, function_name=variant.name)


def build_arch(arch: str, out_dir: Path, variants: Sequence[Variant] | None = None,
               progress: Callable[[Variant], None] | None = None,
               jobs: int | None = None) -> dict:
    """Compile every variant for `arch` into `out_dir/arch`, `jobs` variants at once in worker
    processes (default: default_jobs(); 1 compiles in this process); return the manifest
    written."""
    if arch not in SUPPORTED_ARCHS:
        raise BuildError(f"unknown arch {arch!r} (one of {', '.join(SUPPORTED_ARCHS)})")
    try:
        from .compile import dsl_version
    except ImportError as exc:
        raise BuildError(f"the CuTe DSL is not installed ({exc}); pip install "
                         "'kdabench[cute]'") from exc
    variants = list(aot_variants(arch) if variants is None else variants)
    jobs = max(1, min(default_jobs() if jobs is None else jobs, len(variants)))
    target = Path(out_dir) / arch
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kdabench-cute-") as scratch:
        objects = [str(Path(scratch) / f"{variant.name}.o") for variant in variants]
        if jobs == 1:
            for variant, obj in zip(variants, objects, strict=True):
                _compile_object(variant, arch, obj)
                if progress is not None:
                    progress(variant)
        else:  # spawned workers: each compiles in its own process (MLIR, the DSL's state)
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
                pending = {pool.submit(_compile_object, variant, arch, obj): variant
                           for variant, obj in zip(variants, objects, strict=True)}
                for done in as_completed(pending):
                    done.result()
                    if progress is not None:
                        progress(pending[done])
        functions = {variant.name: asdict(variant) for variant in variants}
        library = target / LIBRARY_NAME
        dsl_lib, ffi_lib = _dsl_lib_dir(), _tvm_ffi_lib_dir()
        command = [_compiler(), "-shared", "-o", str(library), *objects,
                   f"-L{dsl_lib}", "-lcute_dsl_runtime", f"-L{ffi_lib}", "-ltvm_ffi",
                   "-Wl,-rpath,$ORIGIN"]
        linked = subprocess.run(command, capture_output=True, text=True, check=False)
        if linked.returncode != 0:
            raise BuildError(f"linking {library.name} failed: {linked.stderr.strip()[-2000:]}")
    shutil.copy2(dsl_lib / RUNTIME_NAME, target / RUNTIME_NAME)
    import tvm_ffi

    manifest = {
        "schema": MANIFEST_SCHEMA,
        "arch": arch,
        "host": f"{platform.system().lower()}-{platform.machine()}",
        "built_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "dsl_version": dsl_version(),
        "tvm_ffi_version": tvm_ffi.__version__,
        "sources": kernel_source_hashes(),
        "files": {name: file_sha256(target / name) for name in (LIBRARY_NAME, RUNTIME_NAME)},
        "functions": functions,
    }
    manifest_text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (target / MANIFEST_NAME).write_text(manifest_text)
    manifest["manifest_sha256"] = hashlib.sha256(manifest_text.encode()).hexdigest()
    return manifest


def check_build(out_dir: Path, arch: str) -> tuple[dict | None, list[str]]:
    """(the manifest, its problems): the files and sources match, every AOT variant is
    listed and exported, and the library loads through apache-tvm-ffi on this host."""
    folder = Path(out_dir) / arch
    path = folder / MANIFEST_NAME
    if not path.is_file():
        return None, [f"no manifest at {path}"]
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, [f"{path} is unreadable: {exc}"]
    problems = manifest_problems(manifest, arch, folder)
    expected = {variant.name for variant in aot_variants(arch)}
    listed = set(manifest.get("functions") or {})
    if listed != expected:
        missing, extra = sorted(expected - listed), sorted(listed - expected)
        problems.append(f"functions differ from aot_variants(arch): missing {missing[:3]}, "
                        f"unexpected {extra[:3]}")
    if problems:
        return manifest, problems
    try:
        import tvm_ffi

        ctypes.CDLL(str(folder / RUNTIME_NAME), mode=ctypes.RTLD_GLOBAL)
        module = tvm_ffi.load_module(str((folder / LIBRARY_NAME).resolve()))
    except (ImportError, OSError, RuntimeError) as exc:
        return manifest, [f"{LIBRARY_NAME} does not load: {exc}"]
    absent = [name for name in sorted(expected) if not _exports(module, name)]
    if absent:
        problems.append(f"{len(absent)} functions not exported, e.g. {absent[0]}")
    return manifest, problems


def _exports(module, name: str) -> bool:
    try:
        getattr(module, name)
    except AttributeError:
        return False
    return True
