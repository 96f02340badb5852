"""Where the cute backend's functions come from, checked without a GPU: a matching
ahead-of-time build is loaded through apache-tvm-ffi; without one, the installed DSL compiles
on demand; the origin line says which."""

from __future__ import annotations

import shutil

import torch

from kdabench.kernels.cute import runtime
from kdabench.kernels.cute.manifest import LIBRARY_NAME
from kdabench.kernels.cute.variants import aot_variants, state_pass_variant
from kdabench.kernels.folders import shown_folder


def test_artifact_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(runtime.ARTIFACTS_ENV, str(tmp_path))
    assert runtime.artifact_dir() == tmp_path
    monkeypatch.delenv(runtime.ARTIFACTS_ENV)
    assert runtime.artifact_dir().parts[-3:] == (".cache", "kdabench", "cute-kernels")


def test_a_matching_build_is_loaded_with_every_function(cute_build):
    out, _ = cute_build
    library, reasons = runtime._load_aot("sm_121a", out)
    assert reasons == [] and library is not None
    assert library.origin.startswith(f"aot {shown_folder(out)}/sm_121a "
                                     "(nvidia-cutlass-dsl ")
    assert library.functions == {variant.name for variant in aot_variants("sm_121a")}
    assert not library.jit
    assert type(library.function(aot_variants("sm_121a")[0])).__name__ == "Function"


def test_the_origin_names_the_folder_as_configured(cute_build, monkeypatch):
    """A receipt records a plan's origin: the folder as configured, not this machine's path."""
    out, _ = cute_build
    monkeypatch.chdir(out.parent)
    library, reasons = runtime._load_aot("sm_121a", out.name)
    assert reasons == [] and library.origin.startswith(f"aot {out.name}/sm_121a (")
    monkeypatch.delenv(runtime.ARTIFACTS_ENV, raising=False)
    assert runtime.configured_artifact_dir() == "~/.cache/kdabench/cute-kernels"


def test_an_absolute_folder_is_named_without_the_machine_s_path(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert shown_folder(tmp_path / ".cute-kernels") == ".cute-kernels"
    assert shown_folder("build/kernels") == "build/kernels"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert shown_folder(tmp_path / "home" / ".cache" / "k") == "~/.cache/k"
    elsewhere = tmp_path.parent / "other-folder" / "kernels"
    assert shown_folder(elsewhere) == "kernels"
    assert shown_folder(tmp_path) == tmp_path.name  # the current directory itself


def test_a_tampered_build_is_not_loaded(cute_build, tmp_path):
    out, _ = cute_build
    shutil.copytree(out / "sm_90a", tmp_path / "sm_90a")
    with open(tmp_path / "sm_90a" / LIBRARY_NAME, "ab") as handle:
        handle.write(b"\0")
    library, reasons = runtime._load_aot("sm_90a", tmp_path)
    assert library is None
    assert "does not match its sha256" in reasons[0]


def test_without_a_build_the_dsl_compiles_on_demand(cute_build, tmp_path):
    library, reasons = runtime._library("sm_90a", str(tmp_path))
    assert reasons == () and library is not None and library.jit
    assert library.origin.startswith("jit (nvidia-cutlass-dsl ")
    fp16 = state_pass_variant(64, 2, torch.float16, torch.float16)  # in no AOT build
    assert library.missing(fp16) is None
    assert library.function(fp16) is library.function(fp16)  # compiled once, then cached
