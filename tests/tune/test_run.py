"""The tuning run with a fake runner (deterministic times and oracle errors) and, once, with
the real kernels under the Triton interpreter and a fake timer: the profile it writes loads
in the catalog and AUTO resolves plans from it."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest
import torch
from fake_runner import H200, TINY_QUERIES, FakeRunner, best, fake_ms

from kdabench.kernels import KernelConfig, find_profile, load_profile, plan, resolve_config
from kdabench.kernels.catalog import config_from_dict
from kdabench.kernels.policy import heuristic_config
from kdabench.tune import KernelRunner, Tune, TuneError, candidates, parse_queries


@pytest.fixture
def tiny():
    return parse_queries(TINY_QUERIES, origin="tiny.toml")


def tune(tmp_path, queries, runner=None, **options):
    run = Tune(queries, runner=runner or FakeRunner(), out=options.pop("out", None)
               or tmp_path / "nvidia-h200.json", created_at="2026-12-02T12:00:00Z", **options)
    return run, run.run()


def test_tune_writes_a_profile_the_catalog_loads_and_auto_uses(tmp_path, tiny):
    runner = FakeRunner()
    _, result = tune(tmp_path, tiny, runner)
    assert result.ok and result.profile_path == tmp_path / "nvidia-h200.json"
    profile = find_profile(H200, tmp_path)
    assert profile.status == "complete" and len(profile.entries) == 4
    assert profile.tools["python"] and profile.tools["torch"] and profile.tools["triton"]
    assert "kernels/api.py" in profile.document["sources"]
    assert profile.device["name"] == H200 and profile.device["slug"] == "nvidia-h200"
    for query, record in zip(tiny.queries, result.records, strict=True):
        found = candidates(query, tiny.grid)
        winner = best(query, found.configs)
        entry = profile.lookup(query.catalog_query())
        assert entry.config == winner and winner != heuristic_config(query.caps("cpu"))
        rows = entry.measurements["candidates"]
        assert [config_from_dict(r["config"]) for r in rows] == found.configs
        assert rows[0]["heuristic"] and not any(r["heuristic"] for r in rows[1:])
        for row, config in zip(rows, found.configs, strict=True):
            assert row["median_ms"] == pytest.approx(fake_ms(query, config))
            assert row["samples"] == 9
        won = entry.measurements["winner"]
        assert rows[won["index"]]["config"] == record["config"]
        assert won["speedup_over_heuristic"] == pytest.approx(
            fake_ms(query, found.heuristic) / fake_ms(query, winner))
        assert entry.measurements["oracle"]["errors"]["output"] == 1e-3
        assert entry.measurements["oracle"]["ok"] is True
        assert len(entry.measurements["refused"]) == len(found.refused)
        # AUTO (and PREPLANNED_ONLY) resolve a plan of this query to the tuned config
        resolved = resolve_config(query.caps("cpu"), mode="AUTO", device_name=H200,
                                  directory=tmp_path)
        assert resolved.config == winner
        assert resolved.source.startswith("profile nvidia-h200.json (query v1 ")
    assert [m[3] for m in runner.measured] == [9] * 4
    assert len(runner.checked) == 4  # one oracle check per query: every winner passed


def test_the_heuristic_is_timed_even_when_the_grid_leaves_it_out(tmp_path, tiny):
    runner = FakeRunner()
    tune(tmp_path, tiny, runner)
    for _, configs, _, _ in runner.measured:
        assert configs[0] == heuristic_config(tiny.queries[0].caps("cpu"))


def test_a_winner_that_fails_the_oracle_gives_way(tmp_path, tiny):
    query = tiny.queries[0]
    configs = candidates(query, tiny.grid).configs
    fastest = best(query, configs)
    runner = FakeRunner(inaccurate=[fastest])
    _, result = tune(tmp_path, tiny, runner)
    assert result.ok
    runner_up = best(query, [c for c in configs if c != fastest])
    entry = find_profile(H200, tmp_path).lookup(query.catalog_query())
    assert entry.config == runner_up
    rejected = entry.measurements["oracle_rejected"]
    assert len(rejected) == 1 and rejected[0]["errors"]["output"] == 0.5
    assert config_from_dict(rejected[0]["config"]) == fastest


def test_candidates_that_fail_to_run_are_recorded(tmp_path, tiny):
    _, result = tune(tmp_path, tiny, FakeRunner(broken={64}))
    assert result.ok
    entry = find_profile(H200, tmp_path).lookup(tiny.queries[0].catalog_query())
    assert entry.config.block_v != 64
    broken = [r for r in entry.measurements["candidates"] if r["config"]["block_v"] == 64]
    assert broken and all(r["median_ms"] is None and "OutOfResources" in r["error"]
                          for r in broken)


def test_a_query_without_a_passing_candidate_fails_and_gets_no_entry(tmp_path, tiny):
    everything = {c for q in tiny.queries for c in candidates(q, tiny.grid).configs}
    _, result = tune(tmp_path, tiny, FakeRunner(inaccurate=everything))
    assert not result.ok and {r["verdict"] for r in result.records} == {"fail"}
    assert "fastest candidates failed the float64 check" in result.records[0]["message"]
    assert load_profile(result.profile_path).entries == {}
    _, result = tune(tmp_path, tiny, FakeRunner(broken={16, 32, 64}))
    assert {r["verdict"] for r in result.records} == {"error"}
    assert result.records[0]["message"].startswith("no candidate config ran: OutOfResources")


def test_entries_for_other_queries_are_kept(tmp_path, tiny):
    first = parse_queries(TINY_QUERIES.replace("capacities = [4, 1]", "capacities = [4]"))
    tune(tmp_path, first)
    second = parse_queries(TINY_QUERIES.replace("capacities = [4, 1]", "capacities = [1]"))
    run, result = tune(tmp_path, second)
    assert any("kept 2 entries" in note for note in run.notes)
    profile = load_profile(result.profile_path)
    assert {q.capacity for q in profile.entries} == {1, 4} and len(profile.entries) == 4


@pytest.mark.parametrize("version, lacking", [(1, ("segments", "solve", "checkpoints")),
                                              (2, ("solve", "checkpoints")), (3, ("checkpoints",))])
def test_entries_of_an_older_config_schema_are_kept_migrated(tmp_path, tiny, version, lacking):
    """A profile of config schema v1 (no `segments`, `solve` or `checkpoints`), v2 (no `solve`
    or `checkpoints`) or v3 (no `checkpoints`) loads; a run that tunes other queries keeps its
    entries with the migrated fields, so the profile it writes loads again."""
    from kdabench.kernels.catalog import CATALOG, KdaQuery
    from kdabench.kernels.profiles import profile_document

    first = parse_queries(TINY_QUERIES.replace("capacities = [4, 1]", "capacities = [4]"))
    old = KernelConfig(block_v=32, num_warps=8)
    older = {k: v for k, v in dataclasses.asdict(old).items() if k not in lacking}
    schema = CATALOG["kda_prefill"].schema()
    for name in lacking:
        del schema["config"]["fields"][name]
    schema["config"]["version"] = version
    document = profile_document(H200, [{"query": q.catalog_query().to_dict(), "config": older,
                                        "measurements": {}} for q in first.queries])
    document["schema"] = schema
    path = tmp_path / "nvidia-h200.json"
    path.write_text(json.dumps(document))
    second = parse_queries(TINY_QUERIES.replace("capacities = [4, 1]", "capacities = [1]"))
    run, result = tune(tmp_path, second)
    assert result.ok and any("kept 2 entries" in note for note in run.notes)
    profile = load_profile(path)
    assert len(profile.entries) == 4
    for query in first.queries:
        entry = profile.lookup(KdaQuery.from_dict(query.catalog_query().to_dict()))
        assert entry.config == old and entry.backend == "triton"


def test_a_stale_profile_is_replaced_with_a_note(tmp_path, tiny):
    path = tmp_path / "nvidia-h200.json"
    path.write_text(json.dumps({"format": "kdabench.profile.v1", "schema": {}}))
    run, _ = tune(tmp_path, tiny)
    assert any(note.startswith(f"replacing {path}: profile nvidia-h200.json") for note in
               run.notes)
    assert len(load_profile(path).entries) == 4


def test_the_profile_of_another_device_is_not_overwritten(tmp_path, tiny):
    path = tmp_path / "nvidia-h100.json"
    tune(tmp_path, tiny, FakeRunner(name="NVIDIA H100"), out=path)
    before = path.read_bytes()
    with pytest.raises(TuneError, match="is the profile of 'NVIDIA H100', not of this device "
                       "\\('NVIDIA H200'\\); choose another --out"):
        Tune(tiny, runner=FakeRunner(), out=path)
    assert path.read_bytes() == before


def test_a_profile_named_unlike_the_device_is_noted(tmp_path, tiny):
    run, result = tune(tmp_path, tiny, out=tmp_path / "mine.json")
    assert result.ok and run.notes == [
        "the catalog looks for nvidia-h200.json; this profile is named mine.json",
        "the cute backend was not timed for 64x1x(2x32)-C4-precomputed: no CuTe build here"]


def test_another_backend_wins_an_entry_only_faster_by_min_gain_and_checked(tmp_path, tiny):
    """The CuTe backend timed beside the Triton candidates, at each key split: the entry keeps
    the Triton winner as its config, names the backend "auto" plans run and, where that is
    the CuTe backend, its fastest key split."""
    from kdabench.kernels.config import CuteConfig

    splits = [CuteConfig(key_split=split) for split in (1, 2, 4)]

    cases = {0.5: "cute", 0.99: "triton", 2.0: "triton"}  # min_gain is 3%
    for factor, expected in cases.items():
        out = tmp_path / f"{factor}" / "nvidia-h200.json"
        runner = FakeRunner(cute_factor=factor)
        run, result = tune(tmp_path, tiny, runner, out=out)
        assert result.ok and not any("cute" in note for note in run.notes)
        profile = find_profile(H200, out.parent)
        for query, record in zip(tiny.queries, result.records, strict=True):
            entry = profile.lookup(query.catalog_query())
            triton_best = best(query, candidates(query, tiny.grid).configs)
            assert entry.config == triton_best and record["backend"] == entry.backend == expected
            rows = entry.measurements["backends"]
            assert [row["config"]["key_split"] for row in rows] == [1, 2, 4]
            assert {row["backend"] for row in rows} == {"cute"}
            fastest = rows[1]
            assert fastest["speedup_over_triton"] == pytest.approx(1 / factor)
            assert (fastest["oracle"] is not None) == (expected == "cute")
            assert runner.measured[-1][1][-3:] == splits  # timed in the same measure()
            assert entry.cute_config == (splits[1] if expected == "cute" else None)
            auto = resolve_config(query.caps("cpu"), device_name=H200, directory=out.parent)
            assert auto.backend == expected
            if expected == "cute":
                assert auto.config == CuteConfig(key_split=2)
            triton = resolve_config(dataclasses.replace(query.caps("cpu"), backend="triton"),
                                    device_name=H200, directory=out.parent)
            assert (triton.backend, triton.config) == ("triton", triton_best)

    # faster, but off the float64 recurrence: Triton keeps the query
    runner = FakeRunner(cute_factor=0.5, inaccurate=splits)
    _, result = tune(tmp_path, tiny, runner, out=tmp_path / "bad" / "nvidia-h200.json")
    profile = find_profile(H200, tmp_path / "bad")
    for query in tiny.queries:
        entry = profile.lookup(query.catalog_query())
        assert entry.backend == "triton"
        assert entry.measurements["backends"][0]["oracle"]["ok"] is False


@pytest.mark.parametrize(("index", "wgmma"), [(0, False), (1, True)])
def test_the_wgmma_candidate_follows_the_runners_device(tmp_path, tiny, monkeypatch, index,
                                                        wgmma):
    """Timed where the runner's device is sm_90 (cuda:1 here), whatever the current device."""
    from kdabench.kernels.config import CuteConfig

    capabilities = {0: (8, 0), 1: (9, 0)}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda device=None: capabilities[
                            torch.cuda.current_device() if device is None
                            else torch.device(device).index])
    runner = FakeRunner(cute_factor=2.0)
    monkeypatch.setattr(runner, "target", lambda: torch.device("cuda", index))
    run = Tune(tiny, runner=runner, out=tmp_path / "nvidia-h200.json")
    others = run._other_backend_configs(tiny.queries[0])
    assert CuteConfig(key_split=4) in others
    assert (CuteConfig(algorithm="wgmma") in others) == wgmma


@pytest.mark.parametrize("backends, fragment", [
    (("cute",), "--backends cute: give some of triton, cute, triton among them"),
    (("triton", "tpu"), "--backends triton,tpu: give some of triton, cute"),
])
def test_backends_must_include_triton_and_be_known(tmp_path, tiny, backends, fragment):
    with pytest.raises(TuneError, match=fragment):
        Tune(tiny, runner=FakeRunner(), out=tmp_path / "nvidia-h200.json", backends=backends)


def test_only_triton_when_asked(tmp_path, tiny):
    runner = FakeRunner(cute_factor=0.5)
    _, result = tune(tmp_path, tiny, runner, backends=["triton"])
    assert result.ok and all(r["backend"] == "triton" for r in result.records)
    assert all(len(m[1]) == len(candidates(q, tiny.grid).configs)
               for m, q in zip(runner.measured, tiny.queries, strict=True))


def test_an_interrupted_run_leaves_a_partial_profile(tmp_path, tiny):
    run = Tune(tiny, runner=FakeRunner(), out=tmp_path / "nvidia-h200.json")
    seen = []

    def stop_after_two(record):
        seen.append(record)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run.run(on_case=stop_after_two)
    profile = load_profile(tmp_path / "nvidia-h200.json")
    assert profile.status == "partial" and len(profile.entries) == 2


def test_without_a_gpu_tune_refuses_to_start(monkeypatch, tmp_path, tiny):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(TuneError, match="kdabench tune needs a CUDA GPU"):
        Tune(tiny, out=tmp_path / "x.json")
    assert not list(tmp_path.iterdir())
    with pytest.raises(TuneError, match="--reps must be >= 1"):
        Tune(tiny, runner=FakeRunner(), reps=0)
    with pytest.raises(TuneError, match="is a folder"):
        Tune(tiny, runner=FakeRunner(), out=tmp_path)


def test_reps_override_the_queries_file(tmp_path, tiny):
    runner = FakeRunner()
    _, result = tune(tmp_path, tiny, runner, reps=3)
    assert {m[3] for m in runner.measured} == {3}
    assert result.profile["tune"]["timing"] == {"reps": 3, "warmup": 1, "min_gain": 0.03}


def test_a_candidate_must_beat_the_heuristic_by_min_gain(tmp_path, tiny):
    query = tiny.queries[0]
    found = candidates(query, tiny.grid)
    gain = 1 - fake_ms(query, best(query, found.configs)) / fake_ms(query, found.heuristic)
    assert gain > 0.05
    for min_gain, expected in ((gain - 0.01, best(query, found.configs)),
                               (gain + 0.01, found.heuristic)):
        queries = parse_queries(TINY_QUERIES.replace("warmup = 1", f"warmup = 1\nmin_gain = "
                                                     f"{min_gain}"))
        tune(tmp_path, queries)
        entry = find_profile(H200, tmp_path).lookup(query.catalog_query())
        assert entry.config == expected and entry.measurements["min_gain"] == min_gain


def test_a_shortlist_narrows_the_later_queries_of_a_shape(tmp_path):
    queries = parse_queries(TINY_QUERIES.replace("capacities = [4, 1]",
                                                 "capacities = [4, 1]\nshortlist = 2"))
    runner = FakeRunner()
    _, result = tune(tmp_path, queries, runner)
    assert result.ok
    measured = {query_id: configs for query_id, configs, _, _ in runner.measured}
    first, later = queries.queries[0], queries.queries[1]
    assert later.shape == first.shape and later.capacity == 1
    full = candidates(first, queries.grid).configs
    fastest = sorted(full, key=lambda c: fake_ms(first, c))[:2]
    assert measured[first.id] == full
    assert measured[later.id][0] == candidates(later, queries.grid).heuristic
    assert set(measured[later.id][1:]) == set(fastest) - {measured[later.id][0]}
    refused = find_profile(H200, tmp_path).lookup(later.catalog_query()).measurements["refused"]
    assert sum("outside the shortlist" in r["reason"] for r in refused) == \
        len(full) - len(measured[later.id])


# --------------------------------------------------------------------------- real kernels


def config_of(call) -> KernelConfig:
    """The config of the plan a timed call runs (its binding is the lambda's default)."""
    return call.__defaults__[0].plan.config


@pytest.mark.interpreter
def test_kernel_runner_under_the_interpreter(tmp_path, monkeypatch):
    """Real kernels and the real float64 check on the CPU; the timer runs each candidate
    once and reports block_v 64 as the faster."""
    queries = parse_queries("""
schema = "kdabench.tune-queries.v1"
head_dim = 64
capacities = [4]
[timing]
reps = 5
warmup = 0
[check]
max_tokens = 64
max_seqs = 2
[grid]
block_v = [64]
num_stages = [1]
[[query]]
tokens = 64
heads = 1
seqs = 2
""", origin="tiny")
    timed = []

    def fake_timer(calls, warmup, reps):
        result = calls[0]()
        assert int(result.error_code.item()) == 0
        config = config_of(calls[0])
        timed.append(config)
        return [1.0 if config.block_v == 64 else 2.0] * reps

    runner = KernelRunner("cpu", timer=fake_timer, l2_bytes=0)  # the fewest input sets
    assert runner.unavailable() is None and runner.device_name() == "cpu"
    run = Tune(queries, runner=runner, out=tmp_path / "cpu.json")
    result = run.run()
    assert result.ok, result.records
    record = result.records[0]
    assert record["config"]["block_v"] == 64 and record["heuristic_median_ms"] == 2.0
    errors = record["oracle_errors"]
    assert 0 < errors["output"] < 5e-3 and errors["checkpoint"] < 3e-3
    assert errors["final_state"] < 3e-3
    assert [c.block_v for c in timed] == [16, 64]  # the heuristic first, then the grid
    entry = load_profile(tmp_path / "cpu.json").lookup(queries.queries[0].catalog_query())
    assert entry.measurements["timing"]["input_sets"] == 3
    assert statistics.median([1.0] * 5) == entry.measurements["candidates"][1]["median_ms"]
    # a plan on this device now takes the tuned config
    planned = plan(queries.queries[0].caps("cpu"), profile_dir=tmp_path, own_output=False,
                   policy_mode="PREPLANNED_ONLY")
    assert planned.config.block_v == 64 and planned.config_source.startswith("profile cpu.json")


@pytest.mark.gpu
def test_tune_on_the_gpu(tmp_path):
    """The real runner on the GPU: CUDA-event timing, the float64 check, and a plan on this
    device that takes the tuned config from the profile written."""
    queries = parse_queries("""
schema = "kdabench.tune-queries.v1"
head_dim = 64
capacities = [4]
[timing]
reps = 5
warmup = 1
[grid]
block_v = [32, 64]
num_stages = [1]
[[query]]
tokens = 256
heads = 2
seqs = 2
""", origin="tiny")
    result = Tune(queries, out=tmp_path / "profile.json").run()
    assert result.ok, result.records
    record = result.records[0]
    assert record["median_ms"] > 0 and record["timed"] == record["candidates"] == 3
    assert record["oracle_errors"]["output"] < 5e-3
    runner = KernelRunner()
    profile_file = tmp_path / f"{result.profile['device']['slug']}.json"
    profile_file.write_bytes((tmp_path / "profile.json").read_bytes())
    planned = plan(queries.queries[0].caps(runner.target()), profile_dir=tmp_path,
                   policy_mode="PREPLANNED_ONLY", own_output=False)
    assert planned.config == config_from_dict(record["config"])
