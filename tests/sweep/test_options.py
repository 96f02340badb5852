"""Sweep defaults the GPU acceptance rests on, and the options that set them."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kdabench.cli.main import cli
from kdabench.sweep.options import SweepError, SweepOptions


def test_defaults_take_five_samples_and_both_shared_prefix_cases():
    options = SweepOptions()
    assert options.samples >= 5
    assert options.shared_prefix_cases == ((8192, 4096), (65536, 57344))


def test_shared_prefix_cases_longer_than_the_largest_prompt_are_skipped_with_a_reason():
    options = SweepOptions(prompt_tokens=(8192, 32768))
    assert options.shared_prefix_runs == ((8192, 4096),)
    assert options.shared_prefix_skipped() == [{
        "total_tokens": 65536, "shared_tokens": 57344,
        "reason": "65536 tokens is longer than the largest prompt size, 32768"}]
    assert SweepOptions(prompt_tokens=(65536,)).shared_prefix_runs == ((8192, 4096),
                                                                      (65536, 57344))
    assert SweepOptions(shared_prefix_tokens=64).shared_prefix_cases == ((64, 32),)


@pytest.mark.parametrize("pairs", [((64, 64),), ((64, 8),)])
def test_a_shared_prefix_that_shares_all_or_too_little_is_refused(pairs):
    with pytest.raises(SweepError, match="shared prefix"):
        SweepOptions(shared_prefix=pairs).validate()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shared-prefix", "8192-4096"], "--shared-prefix '8192-4096': give P1:SHARED"),
        (["--model", "tiny", "--endpoint", "http://127.0.0.1:9"], "--model tiny: an attached"),
    ],
)
def test_bad_sweep_options_exit_2_in_one_line(args, message, monkeypatch):
    monkeypatch.setattr("kdabench.sweep.runner.check_reachable", lambda url: None)
    result = CliRunner().invoke(cli, ["serve-sweep", *args], prog_name="kdabench")
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
