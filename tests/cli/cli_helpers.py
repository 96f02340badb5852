"""What the CLI tests share: invoking `kdabench` in process and checking a one-line failure."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from kdabench.cli.main import cli


def invoke(*args: str | Path):
    """Run `kdabench ARGS...` in this process; the click Result."""
    return CliRunner().invoke(cli, [str(arg) for arg in args], prog_name="kdabench")


def assert_one_line_error(result, exit_code: int, *fragments: str,
                          empty_stdout: bool = False) -> None:
    """The failure a user sees: the exit code, one line on stderr holding every fragment,
    no traceback (and nothing on stdout when `empty_stdout`)."""
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    if empty_stdout:
        assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
