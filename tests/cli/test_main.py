"""The `kdabench` group and `kdabench kernels info`, through click's CliRunner (CPU tier)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
import torch
from cli_helpers import assert_one_line_error, invoke
from click.testing import CliRunner

import kdabench
from kdabench import kernels as kernel_package
from kdabench.cli.errors import Finding, user_errors
from kdabench.cli.main import KdabenchGroup, cli
from kdabench.environment import DEVICE_KEYS

SUPPORT_KEYS = {
    "backend",
    "device",
    "eligible",
    "reasons",
    "interpreter",
    "capacities",
    "head_dims",
    "gate_modes",
    "index_dtypes",
    "chunk_size",
    "min_lower_bound",
    "shared_memory_budget_bytes",
    "shared_memory_per_block_bytes",
}


@pytest.fixture
def fake_support_report(monkeypatch):
    """Replace the kernel's support report with one of the documented shape."""
    calls = []

    def support_report(device=None):
        calls.append(device)
        return {
            "backend": "triton",
            "device": device,
            "eligible": False,
            "reasons": ["needs [bold]sm_90[/bold] or newer", "second reason"],
            "interpreter": True,
            "capacities": [1, 2, 4],
            "head_dims": [64, 128],
            "gate_modes": ["precomputed", "sigmoid", "softplus"],
            "index_dtypes": ["int32", "int64"],
            "chunk_size": 16,
            "min_lower_bound": -5.0,
            "shared_memory_budget_bytes": 101376,
            "a_field_added_later": "shown too",
        }

    monkeypatch.setattr(kernel_package, "support_report", support_report, raising=False)
    return calls


def test_help_explains_the_tool_and_the_exit_codes():
    result = invoke("--help")
    assert result.exit_code == 0, result.output
    assert "Kimi Delta Attention" in result.output
    assert "kernels" in result.output
    assert "--debug" in result.output
    assert "Exit codes:" in result.output
    for line in ("0  ok", "1  a finding", "2  bad input"):
        assert line in result.output


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    """(path, command) for every command under `group`, groups included."""
    for name, command in sorted(group.commands.items()):
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


@pytest.mark.parametrize("path", [" ".join(path) for path, _ in _commands(cli)])
def test_every_command_help_lists_the_exit_codes(path):
    result = invoke(*path.split(), "--help")
    assert result.exit_code == 0, result.output
    assert "Exit codes:" in result.output
    assert "2  bad input" in result.output


def test_kernels_info_on_the_cpu_shows_no_shared_memory():
    result = invoke("kernels", "info", "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    support = json.loads(result.stdout)["support"]
    assert support["shared_memory_budget_bytes"] is None
    assert support["shared_memory_per_block_bytes"] is None
    table = invoke("kernels", "info", "--device", "cpu").stdout
    assert "KiB)" not in table.split("triton backend on cpu")[1]


def test_kernels_help():
    result = invoke("kernels", "--help")
    assert result.exit_code == 0, result.output
    assert "info" in result.output
    result = invoke("kernels", "info", "--help")
    assert result.exit_code == 0, result.output
    assert "--device" in result.output and "--json" in result.output


def test_version_is_the_installed_distribution_version():
    result = invoke("--version")
    assert result.exit_code == 0, result.output
    assert kdabench.__version__ in result.output
    assert kdabench.__version__ == importlib.metadata.version("kdabench")


def test_kernels_info_table_with_the_real_support_report():
    result = invoke("kernels", "info", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "backend(s): triton" in result.stdout
    assert "Device in hand" in result.stdout
    assert "checkpoint capacities" in result.stdout
    assert "toolchain: python" in result.stdout


def test_kernels_info_json_with_the_real_support_report():
    result = invoke("kernels", "info", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert set(document) == {"device_identity", "support", "toolchain"}
    assert set(document["device_identity"]) == set(DEVICE_KEYS)
    assert SUPPORT_KEYS <= set(document["support"])
    assert document["support"]["device"] == document["device_identity"]["device"]
    assert document["toolchain"]["torch"] is not None


def test_kernels_info_renders_every_field_of_the_report(fake_support_report):
    result = invoke("kernels", "info", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert fake_support_report == ["cpu"]
    out = result.stdout
    assert "triton backend on cpu" in out
    assert "needs [bold]sm_90[/bold] or newer" in out  # reasons are text, not rich markup
    assert "second reason" in out
    assert "precomputed, sigmoid, softplus" in out
    assert "int32, int64" in out
    assert "101376 (99.0 KiB)" in out
    assert "a_field_added_later" in out


def test_kernels_info_json_with_a_fake_report(fake_support_report):
    result = invoke("kernels", "info", "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["support"]["eligible"] is False
    assert document["support"]["capacities"] == [1, 2, 4]
    assert document["device_identity"]["kind"] == "cpu"


def test_bad_option_is_one_line_and_exit_code_2():
    assert_one_line_error(invoke("kernels", "info", "--bogus"), 2, "--bogus", "--help", empty_stdout=True)


def test_unknown_command_is_one_line_and_exit_code_2():
    assert_one_line_error(invoke("no-such-command"), 2, "no-such-command", empty_stdout=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_asking_for_a_missing_gpu_is_bad_input():
    assert_one_line_error(invoke("kernels", "info", "--device", "cuda"), 2, "no CUDA GPU", empty_stdout=True)


def test_malformed_device_is_bad_input():
    assert_one_line_error(invoke("kernels", "info", "--device", "warp-drive"), 2, "warp-drive", empty_stdout=True)


def test_unexpected_exception_is_one_line_without_debug(monkeypatch):
    def broken_report(device=None):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(kernel_package, "support_report", broken_report, raising=False)
    assert_one_line_error(invoke("kernels", "info"), 3, "kaboom", "--debug", empty_stdout=True)

    result = invoke("--debug", "kernels", "info")
    assert result.exit_code == 3
    assert "Traceback" in result.stderr and "kaboom" in result.stderr


def test_findings_and_library_errors_map_to_their_exit_codes():
    @click.group(cls=KdabenchGroup)
    def group():
        pass

    @group.command()
    def finds():
        click.echo("case table")
        raise Finding("2 of 3 cases failed")

    @group.command()
    def refuses():
        with user_errors(KeyError, ValueError):
            raise ValueError("matrix.toml: axis 'capacity' lists 3, allowed 1, 2, 4")

    result = CliRunner().invoke(group, ["finds"])
    assert result.exit_code == 1
    assert result.stdout == "case table\n"
    assert result.stderr.strip() == "finding: 2 of 3 cases failed"

    result = CliRunner().invoke(group, ["refuses"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: matrix.toml: axis 'capacity' lists 3, allowed 1, 2, 4"


HEAVY = ("torch", "triton", "cutlass")
RUN_AND_LIST_HEAVY = f"""
import sys
from kdabench.cli.main import cli
try:
    cli(sys.argv[1:], prog_name="kdabench")
except SystemExit as stop:
    assert not stop.code, stop.code
print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))
"""


@pytest.mark.parametrize("args", [
    ["--help"], ["verify", "results/"],
    ["compare", "results/", "results/"],
    ["report", "results/", "--out", "{tmp}"],
], ids=["help", "verify", "compare", "report"])
def test_commands_on_json_receipts_import_no_torch_triton_or_cute(args, tmp_path):
    """--help, verify, compare and report read JSON: they must start fast (README figure)."""
    repository = Path(__file__).resolve().parents[2]
    args = [arg.format(tmp=tmp_path / "report") for arg in args]
    done = subprocess.run([sys.executable, "-c", RUN_AND_LIST_HEAVY, *args], cwd=repository,
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-500:]
