"""The import contracts of pyproject.toml ([tool.importlinter]), run through
.ci/lint_imports.py: the real tree keeps them, a planted import breaks the contract it should,
and the kernel contract module imports no torch, Triton or CuTe."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(".ci") / "lint_imports.py"
LAYERS = "The CLI sits on the harness, the harness on the oracles, the oracles on the kernels"
ORACLES = "The oracles import no kernel code, only the kernel contract's constants"
CLI = "Nothing below the CLI imports the CLI"
ACYCLIC = "No import cycles between sibling packages or modules"


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(root / LINT), "--no-logo"], capture_output=True,
                          text=True, check=False)


def test_the_tree_keeps_every_import_contract():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in (LAYERS, ORACLES, CLI, ACYCLIC):
        assert name in " ".join(result.stdout.split())


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """The package sources, pyproject.toml and the lint script, copied."""
    root = tmp_path_factory.mktemp("tree")
    for folder in ("kdabench", "kernels", "oracles", "profiles", ".ci"):
        shutil.copytree(ROOT / folder, root / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


@pytest.mark.parametrize(("module", "planted", "contract", "line"), [
    ("kernels/config.py", "import kdabench.sources", LAYERS,
     "kdabench.kernels is not allowed to import kdabench.sources"),
    ("kernels/cute/variants.py", "from kdabench.matrix import CAPACITIES", LAYERS,
     "kdabench.kernels is not allowed to import kdabench.matrix"),
    ("oracles/metadata.py", "from kdabench.kernels.api import plan", ORACLES,
     "kdabench.oracles is not allowed to import kdabench.kernels"),
    ("kdabench/sources.py", "import kdabench.cli.errors", CLI,
     "protected package kdabench.cli: - kdabench.sources -> kdabench.cli.errors"),
    ("kdabench/serve/handler.py", "from kdabench.serve import server", ACYCLIC,
     "No cycles are allowed in kdabench.serve"),
])
def test_a_planted_import_breaks_its_contract(copy, module, planted, contract, line):
    path = copy / module
    original = path.read_text()
    try:
        path.write_text(f"{original}\n{planted}  # planted\n")
        result = lint(copy)
    finally:
        path.write_text(original)
    output = " ".join(result.stdout.split())
    assert result.returncode != 0, result.stdout
    assert f"{contract} BROKEN" in output
    assert line in output


def test_the_copy_keeps_the_contracts_unplanted(copy):
    """The planted cases fail for their plant alone: the copied tree itself passes."""
    result = lint(copy)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_kernel_contract_imports_no_torch_triton_or_cute():
    code = ("import sys, kdabench.kernels.contract\n"
            "print(sorted(m for m in ('torch', 'triton', 'cutlass', 'tvm_ffi', 'numpy')"
            " if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"
