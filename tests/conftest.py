"""Test tiers: CPU by default; tests marked `gpu` (marker declared in pyproject) skip
without a CUDA GPU, and on such a machine the Triton kernels run under the interpreter."""

from __future__ import annotations

import os
import zlib

import pytest
import torch

from kdabench import interp_memcheck

CUDA_AVAILABLE = torch.cuda.is_available()

# Must happen before any test module imports kdabench.kernels: triton.jit decides at
# decoration time whether a kernel is compiled or interpreted.
if not CUDA_AVAILABLE:
    os.environ["TRITON_INTERPRET"] = "1"
    # every interpreted load and store must stay inside its launch's tensor arguments
    MEMCHECK = interp_memcheck.install()


def pytest_report_header(config: pytest.Config) -> str:
    if CUDA_AVAILABLE:
        return f"kdabench: CUDA GPU {torch.cuda.get_device_name()}: gpu tests run"
    checked = "bounds-checked" if MEMCHECK else "NOT bounds-checked (interpreter internals moved)"
    return ("kdabench: no CUDA GPU: gpu tests skip, Triton kernels run with TRITON_INTERPRET=1, "
            f"every load and store {checked}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    needs_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    needs_interpreter = pytest.mark.skip(
        reason="the CPU tier needs the Triton interpreter; this process compiled the kernels "
        "for a GPU")
    for item in items:
        if not CUDA_AVAILABLE and item.get_closest_marker("gpu") is not None:
            item.add_marker(needs_gpu)
        if CUDA_AVAILABLE and item.get_closest_marker("interpreter") is not None:
            item.add_marker(needs_interpreter)


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A seed fixed per test (derived from its id), so a failure replays exactly."""
    return zlib.crc32(request.node.nodeid.encode())


@pytest.fixture
def rng(seed: int) -> torch.Generator:
    """A CPU torch generator seeded with `seed`; draw on it, then move tensors to the device."""
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="session")
def cute_build(tmp_path_factory: pytest.TempPathFactory):
    """`kdabench build-kernels --arch sm_90a,sm_121a --out DIR --json`, once per session:
    (DIR, the click result). Skips without the CuTe DSL, unless $KDABENCH_REQUIRE_CUTE=1 (CI)."""
    import kdabench.kernels.cute  # noqa: F401  (puts the DSL's packages on sys.path)

    try:
        import cutlass.cute  # noqa: F401
    except ImportError as exc:
        if os.environ.get("KDABENCH_REQUIRE_CUTE") == "1":
            pytest.fail(f"KDABENCH_REQUIRE_CUTE=1 but the CuTe DSL does not import: {exc}")
        pytest.skip(f"the CuTe DSL is not installed ({exc}); pip install 'kdabench[cute]'")
    from click.testing import CliRunner

    from kdabench.cli.main import cli

    out = tmp_path_factory.mktemp("cute-kernels")
    result = CliRunner().invoke(cli, ["build-kernels", "--arch", "sm_90a,sm_121a", "--out",
                                      str(out), "--json"])
    return out, result
