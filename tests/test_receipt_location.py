"""Where receipts go without --out: the folder given, else $KDABENCH_OUT, else .kdabench/ in
the current directory; never the repository's results/, which holds curated evidence."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from kdabench.cli.main import cli
from kdabench.receipts import OUT_ENV, receipt_dir, verify_file
from kdabench.receipts.qualified import RESULTS_ENV

REPOSITORY = Path(__file__).resolve().parents[1]
RESULTS = REPOSITORY / "results"

ONE_CASE = """
schema = "kdabench.matrix.v1"
name = "one-case"
[layouts.R3]
lengths = [5, 16, 17]

[[group]]
scenario = "accuracy"
tiers = ["cpu"]
capacity = 1
heads = 1
layout = "R3"
"""


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh current directory, with neither $KDABENCH_OUT nor $KDABENCH_RESULTS set."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.delenv(OUT_ENV, raising=False)
    monkeypatch.delenv(RESULTS_ENV, raising=False)
    return Path.cwd()


def test_the_folder_given_wins(cwd: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(OUT_ENV, str(tmp_path / "from-env"))
    assert receipt_dir(tmp_path / "given") == tmp_path / "given"
    assert receipt_dir("results/") == Path("results")


def test_then_the_environment_variable(cwd: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(OUT_ENV, str(tmp_path / "from-env"))
    assert receipt_dir() == receipt_dir(None) == tmp_path / "from-env"


def test_else_the_working_folder_in_the_current_directory(cwd: Path, tmp_path: Path,
                                                          monkeypatch) -> None:
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "evidence"))  # where evidence is read
    assert receipt_dir() == cwd / ".kdabench"
    monkeypatch.setenv(OUT_ENV, "")  # set but empty: as if unset
    assert receipt_dir() == cwd / ".kdabench"


def test_the_working_folder_ignores_itself_in_any_repository(cwd: Path) -> None:
    folder = receipt_dir()
    assert (folder / ".gitignore").read_text().splitlines()[-1] == "*"
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", str(cwd)], check=True)
        (folder / "qualify-x.json").write_text("{}")
        status = subprocess.run(["git", "status", "--porcelain"], cwd=cwd, check=True,
                                capture_output=True, text=True)
        assert status.stdout == ""


@pytest.mark.skipif(shutil.which("git") is None or not (REPOSITORY / ".git").exists(),
                    reason="needs git and a checkout")
def test_the_working_folder_is_git_ignored() -> None:
    ignored = subprocess.run(["git", "check-ignore", "-q", ".kdabench/qualify-x.json"],
                             cwd=REPOSITORY, check=False)
    assert ignored.returncode == 0


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` with its size and modification time."""
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in folder.rglob("*") if path.is_file()} if folder.is_dir() else {}


def test_a_qualify_run_without_out_writes_into_the_working_folder_only(cwd: Path,
                                                                      tmp_path: Path) -> None:
    matrix = tmp_path / "one-case.toml"
    matrix.write_text(ONE_CASE)
    before = _files(RESULTS)
    result = CliRunner().invoke(cli, ["qualify", "--tier", "cpu", "--matrix", str(matrix)],
                                prog_name="kdabench")
    assert result.exit_code == 0, result.output
    receipts = list((cwd / ".kdabench").glob("qualify-*.json"))
    assert len(receipts) == 1 and verify_file(receipts[0]).ok
    assert str(receipts[0]) in result.stderr
    assert [path.name for path in cwd.iterdir()] == [".kdabench"]
    assert _files(RESULTS) == before
