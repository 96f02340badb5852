"""Fuzzing in worker processes: the split of counts and seeds, the merge, a dead worker as a
finding, and a real two-worker campaign under the interpreter."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter

import pytest
import torch

from kdabench.environment import cpu_quota
from kdabench.fuzz import CPU_LIMITS, Campaign, parallel
from kdabench.fuzz.run import GPU_LIMITS, BackendRun, merge_runs, warm_up_plan, warm_up_runs


def test_counts_split_evenly_and_add_up():
    assert parallel.worker_counts(10, 4) == [3, 3, 3, 1]
    assert parallel.worker_counts(3, 4) == [1, 1, 1, 0]
    assert sum(parallel.worker_counts(10_000, 8)) == 10_000
    assert parallel.worker_counts(None, 2) == [None, None]


def test_worker_zero_keeps_the_campaign_seed():
    assert parallel.worker_seeds(7, 3) == [7, 7 + parallel.SEED_STRIDE,
                                           7 + 2 * parallel.SEED_STRIDE]


def test_the_workers_warm_up_parts_cover_every_specialisation_once():
    whole = warm_up_runs((0, 2**31))
    assert len(whole) == len(set(whole)) == 3 * 2 * 3 * 3 * 2 * 2
    parts = [warm_up_runs((0, 2**31), (i, 8)) for i in range(8)]
    assert sorted(run for part in parts for run in part) == sorted(whole)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_only_worker_zero_draws_high_slot_sets():
    assert parallel.worker_limits(GPU_LIMITS, 0) == GPU_LIMITS
    other = parallel.worker_limits(GPU_LIMITS, 3)
    assert other.high_share == 0.0 and GPU_LIMITS.high_share > 0
    assert dataclasses.replace(other, high_share=GPU_LIMITS.high_share) == GPU_LIMITS


def test_the_workers_warm_up_plans_cover_every_specialisation_once():
    base, workers = 2**31, 8
    whole = warm_up_runs((0, base))
    plans = [warm_up_plan(parallel.worker_limits(GPU_LIMITS, i), base, (i, workers))
             for i in range(workers)]
    assert sorted(run for plan in plans for run in plan) == sorted(whole)
    assert all(run[1] == 0 for plan in plans[1:] for run in plan)  # no high rig but worker 0's
    assert sorted(warm_up_plan(GPU_LIMITS, base)) == sorted(whole)  # one process: all of it


def test_merge_sums_counts_and_spans_the_wall_time():
    a = BackendRun("triton", sets=5, valid=2, faulty=3, failed=1, seconds=2.0, started_at=100.0,
                   seeds=[0], per_class=Counter({"duplicate-final": 2}),
                   findings=[{"file": "a"}])
    b = BackendRun("triton", sets=4, valid=4, seconds=3.0, started_at=101.5, seeds=[9],
                   per_class=Counter({"duplicate-final": 1, "offset-zero": 1}),
                   warmup_seconds=7.0)
    merged = merge_runs([a, b])
    assert (merged.sets, merged.valid, merged.faulty, merged.failed) == (9, 6, 3, 1)
    assert merged.per_class == Counter({"duplicate-final": 3, "offset-zero": 1})
    assert merged.seeds == [0, 9] and merged.findings == [{"file": "a"}]
    assert merged.seconds == pytest.approx(4.5)  # 100.0 .. 104.5
    assert merged.warmup_seconds == 7.0


def test_a_result_survives_the_trip_through_json():
    run = BackendRun("cute", sets=3, per_capacity=Counter({4: 3}), seeds=[1], started_at=5.0)
    again = BackendRun.from_json(json.loads(json.dumps(run.to_json())))
    assert again == run


def test_a_worker_that_dies_is_a_failed_set_with_its_log(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "_command", lambda *args: [
        sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"])
    campaign = Campaign(["triton"], 0, 4, None, torch.device("cpu"), CPU_LIMITS,
                        tmp_path / "findings", warm=False, workers=2)
    run = parallel.run_backend_parallel(campaign, "triton")
    assert run.failed == 2 and not run.ok
    assert all(f["check"] == "worker" and "boom" in f["log_tail"] for f in run.findings)


@pytest.mark.interpreter
def test_two_workers_fuzz_apart_and_merge(tmp_path):
    campaign = Campaign(["triton"], 0, 30, None, torch.device("cpu"), CPU_LIMITS,
                        tmp_path / "findings", warm=False, workers=2)
    seen = []
    run = parallel.run_backend_parallel(campaign, "triton",
                                        lambda _backend, done: seen.append(done))
    assert run.ok, run.findings
    assert run.sets == 30 and run.seeds == [0, parallel.SEED_STRIDE]
    assert run.valid + run.faulty == 30
    assert seen and seen[-1] == 30
    alone = Campaign(["triton"], 0, 15, None, torch.device("cpu"), CPU_LIMITS,
                     tmp_path / "alone", warm=False).run_backend("triton")
    # worker 0 drew what a one-process run with the campaign's seed draws
    assert alone.per_class <= run.per_class and alone.per_capacity <= run.per_capacity


def test_the_cpu_takes_a_worker_per_core_up_to_eight():
    assert [parallel.cpu_workers(n) for n in (1, 2, 7, 64)] == [1, 2, 7, 8]
    assert 1 <= parallel.cpu_workers() <= parallel.MAX_CPU_WORKERS


@pytest.mark.parametrize(("text", "cpus"), [("max 100000\n", None), ("200000 100000\n", 2),
                                            ("150000 100000\n", 2), ("50000 100000\n", 1),
                                            ("garbage\n", None)])
def test_a_cgroup_quota_caps_the_cpus(tmp_path, text, cpus):
    path = tmp_path / "cpu.max"
    path.write_text(text)
    assert cpu_quota(path) == cpus
    assert cpu_quota(tmp_path / "absent") is None
