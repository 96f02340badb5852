"""Arms files: the packaged ones load; bad ones fail with one clear line (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kdabench.cli.main import cli
from kdabench.sweep.arms import ArmsError, check_patterns, load_arms, parse_arms, redact_env

GOOD = """
schema = "kdabench.arms.v1"
name = "two"
[sweep]
prompt_tokens = [64]
[common]
env = { SHARED = "1", HF_TOKEN = "hf_secret" }
args = ["--flag"]
[[arms]]
name = "a"
env = { X = 1, Y = true }
activation = ["on"]
[[arms]]
name = "b"
prefix_cache = false
args = ["--b"]
"""


def test_packaged_arms_load() -> None:
    local = load_arms("local")
    assert [arm.name for arm in local.arms] == ["no-cache", "final-only", "checkpoints"]
    assert all(arm.activation for arm in local.arms)
    seed = load_arms("vllm-seed")
    assert [arm.name for arm in seed.arms] == ["neither", "coalescing-only", "mhc-only", "both"]
    flags = [(a.env["VLLM_B12X_KDA_PREFILL_COALESCING"], a.env["VLLM_GLM53_MHC_PREFILL_SHARD"])
             for a in seed.arms]
    assert flags == [("0", "0"), ("1", "0"), ("0", "1"), ("1", "1")]


def test_good_file_parses_and_redacts() -> None:
    arms = parse_arms(GOOD)
    first, second = arms.arms
    assert first.env == {"X": "1", "Y": "1"}
    assert arms.arm_env(first) == {"SHARED": "1", "HF_TOKEN": "hf_secret", "X": "1", "Y": "1"}
    assert arms.arm_args(second) == ["--flag", "--b"]
    assert second.prefix_cache is False
    assert arms.to_receipt()["common"]["env"]["HF_TOKEN"] == "<redacted>"
    assert redact_env({"OPENAI_API_KEY": "k", "PORT": "1"}) == {
        "OPENAI_API_KEY": "<redacted>", "PORT": "1"}


def test_check_patterns() -> None:
    log = "start prefix_cache=on\nrequest cached_tokens=32\n"
    assert check_patterns(["prefix_cache=on", "cached_tokens=[1-9]"], log)["status"] == "passed"
    failed = check_patterns(["checkpoint_export=on"], log)
    assert failed["status"] == "failed" and failed["missing"] == ["checkpoint_export=on"]
    assert check_patterns(["x"], None)["status"] == "not checked"


BAD = [
    ("not-toml", "this is = = not toml", "not valid TOML"),
    ("no-schema", 'name = "x"\n[[arms]]\nname = "a"\n', "schema"),
    ("no-arms", 'schema = "kdabench.arms.v1"\n', "no arms"),
    ("unknown-key", 'schema = "kdabench.arms.v1"\n[[arms]]\nname = "a"\nenvv = {}\n',
     "unknown key(s) 'envv'"),
    ("duplicate", 'schema = "kdabench.arms.v1"\n[[arms]]\nname = "a"\n[[arms]]\nname = "a"\n',
     "used twice"),
    ("bad-regex", 'schema = "kdabench.arms.v1"\n[[arms]]\nname = "a"\nactivation = ["(["]\n',
     "not a valid regular expression"),
    ("nameless", 'schema = "kdabench.arms.v1"\n[[arms]]\nenv = {}\n', "has no 'name'"),
    ("args-type", 'schema = "kdabench.arms.v1"\n[[arms]]\nname = "a"\nargs = "x"\n',
     "must be a list of strings"),
    ("sweep-type", 'schema = "kdabench.arms.v1"\n[sweep]\nsamples = "3"\n[[arms]]\nname = "a"\n',
     "wrong type"),
    ("env-type", 'schema = "kdabench.arms.v1"\n[[arms]]\nname = "a"\nenv = { A = [1] }\n',
     "must be a string or number"),
]


@pytest.mark.parametrize("text,fragment", [(t, f) for _, t, f in BAD], ids=[i for i, _, _ in BAD])
def test_bad_arms_file_is_one_clear_line(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ArmsError, match=None) as caught:
        parse_arms(text, label="arms.toml")
    assert fragment in str(caught.value)
    path = tmp_path / "arms.toml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["serve-sweep", "--arms", str(path), "--out",
                                      str(tmp_path)], prog_name="kdabench")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert not list(tmp_path.glob("serve-sweep-*.json"))


def test_missing_arms_file_and_bad_options(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["serve-sweep", "--arms", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2 and "no such arms file" in result.stderr
    result = runner.invoke(cli, ["serve-sweep", "--endpoint", "http://x", "--launch", "y"])
    assert result.exit_code == 2 and "not both" in result.stderr
    result = runner.invoke(cli, ["serve-sweep", "--samples", "3", "--rounds", "2",
                                 "--endpoint", "http://127.0.0.1:9", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "rounds divide samples" in result.stderr
    result = runner.invoke(cli, ["serve-sweep", "--prompt-tokens", "abc"])
    assert result.exit_code == 2 and "comma-separated" in result.stderr


def test_help_names_the_receipt_folder_and_the_prompt_limit() -> None:
    result = CliRunner().invoke(cli, ["serve-sweep", "--help"], prog_name="kdabench")
    assert result.exit_code == 0
    assert "$KDABENCH_OUT" in result.stdout and ".kdabench/" in result.stdout
    assert "KDABENCH_RESULTS" not in result.stdout and "max_model_len" in result.stdout
