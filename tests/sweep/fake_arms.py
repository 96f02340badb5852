"""Sweeps run against sweep_fake_server.py: a quick [sweep] table (small prompts, few samples,
short windows) that test modules append their arms to, two arms that differ in the fake
server's prefix cache, and :func:`run_sweep`, `kdabench serve-sweep` over an arms text."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from click.testing import CliRunner, Result

from kdabench.cli.main import cli

SWEEP = """
schema = "kdabench.arms.v1"
name = "fake"
[sweep]
prompt_tokens = [64, 128]
samples = 2
warmups = 1
probe_tokens = 8
decode_window_s = 0.2
decode_prompt_tokens = 32
shared_prefix_tokens = 64
health_timeout_s = 20.0
"""

TWO_ARMS = SWEEP + """
[[arms]]
name = "cache-on"
env = { FAKE_PREFIX_CACHE = "1", FAKE_SPEC = "1" }
args = ["--tag", "cache-arm"]
activation = ['prefix_cache=on', 'tag=cache-arm']
activation_after = ['cached_tokens=[1-9]']

[[arms]]
name = "cache-off"
env = { FAKE_PREFIX_CACHE = "0" }
prefix_cache = false
activation = ['prefix_cache=off']
"""


def run_sweep(tmp_path: Path, arms_text: str, *args: str,
              env: Mapping[str, str] | None = None) -> tuple[Result, list[Path]]:
    """`kdabench serve-sweep --arms FILE --out DIR ARGS` in-process: the click result and the
    receipts written to DIR."""
    arms = tmp_path / "arms.toml"
    arms.write_text(arms_text)
    out = tmp_path / "out"
    result = CliRunner(env=dict(env or {})).invoke(
        cli, ["serve-sweep", "--arms", str(arms), "--out", str(out), *args],
        prog_name="kdabench")
    return result, sorted(out.glob("serve-sweep-*.json"))
