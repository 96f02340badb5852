"""Arms against the sweep's baseline arm (kdabench.sweep.contrasts)."""

from __future__ import annotations

import pytest

from kdabench.stats import bootstrap_ratio_ci
from kdabench.sweep.arms import ArmsError, parse_arms
from kdabench.sweep.contrasts import contrasts
from kdabench.sweep.options import SweepError, SweepOptions


def cold(arm: str, tokens: int, samples: list[float], valid: bool = True) -> dict:
    return {"id": f"cold/{arm}/{tokens}", "kind": "cold-ttft", "arm": arm,
            "prompt_tokens_requested": tokens, "samples_ms": samples, "valid": valid}


def shared(arm: str, total: int, shared_tokens: int, p2: list[float | None]) -> dict:
    return {"id": f"shared-prefix/{arm}/{total}", "kind": "shared-prefix", "arm": arm,
            "total_tokens": total, "shared_tokens": shared_tokens, "p2_ttft_ms": p2,
            "valid": True}


def test_each_arm_is_read_against_the_baseline_per_size_and_shared_prefix_case():
    base, head = [100.0, 104.0, 98.0, 101.0, 99.0], [102.0, 103.0, 101.0, 100.0, 104.0]
    cases = [cold("final-only", 8192, base), cold("checkpoints", 8192, head),
             cold("no-cache", 8192, [100.0] * 5),
             shared("final-only", 65536, 57344, [400.0, 410.0, None, 390.0]),
             shared("checkpoints", 65536, 57344, [50.0, 55.0, 45.0]),
             {"id": "decode/checkpoints", "kind": "decode", "arm": "checkpoints"}]
    rows = contrasts(cases, "final-only", seed=3)
    assert [(r.kind, r.arm, r.tokens) for r in rows] == [
        ("cold-ttft", "checkpoints", 8192), ("cold-ttft", "no-cache", 8192),
        ("shared-prefix", "checkpoints", 65536)]
    export = rows[0]
    assert export.baseline == "final-only" and export.label == "8192 tokens"
    assert export.arm_median_ms == 102.0 and export.baseline_median_ms == 100.0
    assert export.ratio == pytest.approx(1.02)
    assert export.ci95 == bootstrap_ratio_ci(base, head, seed=3 + 8192)
    assert export.ci95[0] <= export.ratio <= export.ci95[1]
    prefix = rows[2]
    assert prefix.label == "P2 of 65536 sharing 57344"
    assert prefix.ratio == pytest.approx(50.0 / 400.0)  # the None sample is left out
    assert prefix.to_dict()["ci95"] == list(prefix.ci95)


def test_invalid_cases_and_sizes_without_the_baseline_are_left_out():
    cases = [cold("final-only", 1024, [10.0, 11.0]), cold("checkpoints", 1024, [9.0, 9.5],
                                                           valid=False),
             cold("checkpoints", 4096, [30.0, 31.0])]
    assert contrasts(cases, "final-only") == []
    assert contrasts(cases, "no-such-arm") == []


ARMS = """
schema = "kdabench.arms.v1"
[sweep]
baseline = {baseline}
[[arms]]
name = "a"
[[arms]]
name = "b"
"""


def test_the_baseline_must_be_one_of_the_arms():
    arms = parse_arms(ARMS.format(baseline='"b"'))
    options = SweepOptions.resolve(arms.sweep, {})
    assert options.baseline == "b"
    options.check_arms(["a", "b"])
    with pytest.raises(SweepError, match="baseline 'c' is not an arm \\(arms: a, b\\)"):
        SweepOptions.resolve(arms.sweep, {"baseline": "c"}).check_arms(["a", "b"])
    with pytest.raises(ArmsError, match="baseline = 3 has the wrong type"):
        parse_arms(ARMS.format(baseline="3"))
