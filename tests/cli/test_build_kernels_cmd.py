"""`kdabench build-kernels`: bad input exits 2, a check of a missing build exits 1, and the
build the session fixture made passes `--check`."""

from __future__ import annotations

from click.testing import CliRunner

from kdabench.cli.main import cli


def invoke(*args: str):
    return CliRunner().invoke(cli, ["build-kernels", *args])


def test_unknown_arch_is_bad_input():
    result = invoke("--arch", "sm_80")
    assert result.exit_code == 2
    assert "unknown sm_80" in result.output


def test_zero_jobs_is_bad_input():
    result = invoke("--jobs", "0", "--arch", "sm_90a")
    assert result.exit_code == 2
    assert "--jobs" in result.output


def test_check_of_an_empty_folder_is_a_finding(tmp_path):
    result = invoke("--check", "--arch", "sm_90a", "--out", str(tmp_path))
    assert result.exit_code == 1
    assert "no manifest" in result.output


def test_check_of_a_good_build_passes(cute_build):
    out, _ = cute_build
    result = invoke("--check", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "sm_90a" in result.output and "sm_121a" in result.output
    assert "sources match" in result.output


def test_help_says_no_gpu_is_needed():
    result = invoke("--help")
    assert result.exit_code == 0
    assert "not a GPU" in result.output
    assert "--jobs" in result.output
