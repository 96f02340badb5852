"""The cute backend's ahead-of-time build: compiled without a GPU for sm_90a and sm_121a; the
manifests checked; a build whose sources or files do not match its manifest is refused."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from kdabench.kernels.cute.build import check_build
from kdabench.kernels.cute.manifest import (
    LIBRARY_NAME,
    MANIFEST_NAME,
    MANIFEST_SCHEMA,
    arch_of,
    kernel_source_hashes,
    manifest_problems,
)
from kdabench.kernels.cute.variants import aot_variants, prepare_variant, state_pass_variant

ARCHS = ("sm_90a", "sm_121a")


def test_aot_variants_are_distinct_names_the_wgmma_pass_on_sm_90a_only():
    names = [variant.name for variant in aot_variants("sm_121a")]
    assert len(names) == len(set(names)) == 79
    assert "kda_state_pass_K128_CK4_v_bf16_out_bf16" in names
    assert "kda_chunk_pass_K128_CK4_W1_S4_out_bf16" in names
    assert "kda_prepare_K64_GATE1_L21_BSIG1_qk_bf16_g_f32_beta_f32_gp_f32" in names
    assert "kda_chunk_prep_K64_GATE1_L21_BSIG1_qk_bf16_g_f32_beta_f32_gp_f32_v_bf16" in names
    hopper = [variant.name for variant in aot_variants("sm_90a")]
    assert len(hopper) == len(set(hopper)) == 109
    assert set(hopper) - set(names) == {
        *(f"kda_chunk_wgmma_pass_K{k}_CK{c}_out_bf16" for k in (64, 128) for c in (1, 2, 4)),
        *(name.replace("_qk_", "_WG1_qk_") for name in names if name.startswith("kda_chunk_prep"))}


def test_variant_names_carry_constants_and_dtypes():
    variant = prepare_variant(64, "softplus", True, False, torch.bfloat16, torch.float32,
                              torch.float16, torch.float32)
    assert variant.name == "kda_prepare_K64_GATE2_L21_BSIG0_qk_bf16_g_f32_beta_f16_gp_f32"
    with pytest.raises(ValueError, match="no variant for dtype"):
        state_pass_variant(128, 4, torch.float64, torch.bfloat16)


def test_arch_of_compute_capabilities():
    assert arch_of((9, 0)) == "sm_90a"
    assert arch_of((12, 1)) == "sm_121a"


def test_manifest_problems_name_arch_sources_and_files(tmp_path):
    manifest = {"schema": MANIFEST_SCHEMA, "arch": "sm_121a",
                "sources": {**kernel_source_hashes(), "kernels/cute/source.py": "0" * 64},
                "files": {LIBRARY_NAME: "0" * 64}}
    problems = " | ".join(manifest_problems(manifest, "sm_90a", tmp_path))
    assert "this GPU needs 'sm_90a'" in problems
    assert "other kernel sources" in problems
    assert f"{LIBRARY_NAME} is missing" in problems


@pytest.mark.parametrize("arch", ARCHS)
def test_build_compiles_every_variant_and_checks(cute_build, arch):
    out, result = cute_build
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)[arch]
    assert report["problems"] == []
    manifest = report["manifest"]
    assert manifest["arch"] == arch
    assert manifest["sources"] == kernel_source_hashes()
    assert set(manifest["functions"]) == {v.name for v in aot_variants(arch)}
    library = (out / arch / LIBRARY_NAME).read_bytes()
    assert f"-arch {arch}".encode() in library  # the embedded cubin's target


def test_a_stale_or_tampered_build_is_refused(cute_build, tmp_path):
    out, _ = cute_build
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    manifest_path = copy / "sm_90a" / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    manifest["sources"]["kernels/cute/source.py"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest))
    _, problems = check_build(copy, "sm_90a")
    assert any("other kernel sources" in p for p in problems)
    with open(copy / "sm_121a" / LIBRARY_NAME, "ab") as handle:
        handle.write(b"\0")
    _, problems = check_build(copy, "sm_121a")
    assert any("does not match its sha256" in p for p in problems)


def test_a_built_function_refuses_cpu_tensors_naming_its_signature(cute_build):
    import ctypes

    import tvm_ffi

    out, _ = cute_build
    ctypes.CDLL(str(out / "sm_90a" / "libcute_dsl_runtime.so"), mode=ctypes.RTLD_GLOBAL)
    module = tvm_ffi.load_module(str(out / "sm_90a" / LIBRARY_NAME))
    flat = torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"kda_validate\(cu: Tensor.*expected device_type=cuda"):
        module.kda_validate_CK1(flat, flat.int(), flat, flat, flat, flat, flat.int(), 1, 1, 1)


def test_a_parallel_build_equals_a_serial_one(cute_build, tmp_path):
    """Worker processes compile the same objects as one process: the libraries are equal byte
    for byte, and the manifest lists the variants in the order given."""
    from kdabench.kernels.cute.build import build_arch
    from kdabench.kernels.cute.variants import chunk_index_variant, validate_variant

    variants = [validate_variant(1), chunk_index_variant(), validate_variant(4)]
    serial = build_arch("sm_90a", tmp_path / "serial", variants, jobs=1)
    done = []
    parallel = build_arch("sm_90a", tmp_path / "parallel", variants, progress=done.append, jobs=2)
    assert sorted(v.name for v in done) == sorted(v.name for v in variants)
    assert list(parallel["functions"]) == list(serial["functions"]) == [v.name for v in variants]
    assert (tmp_path / "serial" / "sm_90a" / LIBRARY_NAME).read_bytes() == \
        (tmp_path / "parallel" / "sm_90a" / LIBRARY_NAME).read_bytes()


@pytest.mark.parametrize("cpus, expected", [(1, 1), (2, 2), (64, 8)])
def test_default_jobs_follow_the_cpus_up_to_a_bound(cpus, expected, monkeypatch):
    """A build compiles as many variants at once as the process has CPUs, at most 8 (each
    worker holds about 430 MB)."""
    from kdabench.kernels.cute import build

    monkeypatch.setattr(build.os, "sched_getaffinity", lambda _pid: set(range(cpus)),
                        raising=False)
    assert build.default_jobs() == expected
