"""The qualification runners and run loop: metadata, faults, a CPU-tier run, shards, receipts."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kdabench import kernels, qualify
from kdabench.inputs import make_inputs
from kdabench.matrix import FAULT_VARIANTS, OFFSET_MODES, MatrixError, load_matrix, parse_matrix
from kdabench.oracles.metadata import expected_error_code
from kdabench.qualify import (
    CHUNK,
    FAULT_BITS,
    FAULTS,
    Qualification,
    QualifyError,
    build_metadata,
    choose_offsets,
    summarize_by_scenario,
)
from kdabench.qualify.compile_clock import MEASURES, CompileClock, Reading
from kdabench.receipts import load_receipt, verify_file

TINY = """
schema = "kdabench.matrix.v1"
name = "tiny"
[layouts.R3]
lengths = [5, 16, 70]

[[group]]
scenario = "accuracy"
tiers = ["cpu"]
capacity = [1, 2]
heads = 1
layout = "R3"

[[group]]
scenario = "prefix"
tiers = ["cpu"]
capacity = 2
heads = 1
layout = "R3"
offsets = "aligned"

[[group]]
scenario = "fault"
tiers = ["cpu"]
variant = ["duplicate-final", "offset-zero", "live-count-zero"]
heads = 1
layout = "R3"

[[group]]
scenario = "contract"
tiers = ["cpu"]
variant = ["decode-names-every-bit", "plan-refuses-capacity-3"]
"""


@pytest.fixture
def tiny_matrix():
    return parse_matrix(TINY, origin="tiny.toml")


def run_tiny(tmp_path: Path, matrix, **kwargs):
    kwargs.setdefault("out_dir", tmp_path)
    return Qualification(matrix, tier="cpu", command_line=["kdabench", "qualify"],
                         **kwargs).run()


# --------------------------------------------------------------------------- metadata


@pytest.mark.parametrize("mode", OFFSET_MODES)
@pytest.mark.parametrize("capacity", [1, 2, 4])
def test_choose_offsets_places_them_as_asked(mode, capacity):
    rng = random.Random(0)
    for length in (1, 2, 5, 16, 17, 40, 100, 300):
        offsets = choose_offsets(length, capacity, mode, rng)
        assert offsets == sorted(set(offsets)) and len(offsets) <= capacity
        assert all(1 <= p <= length - 1 for p in offsets)
        if mode == "aligned":
            assert all(p % CHUNK == 0 for p in offsets)
            assert len(offsets) == min(capacity, (length - 1) // CHUNK)
        elif mode == "unaligned":
            assert all(p % CHUNK for p in offsets)
        elif length >= 2:
            assert (1 if mode == "first" else length - 1) in offsets


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 80), min_size=1, max_size=8),
       capacity=st.sampled_from([1, 2, 4]), mode=st.sampled_from(OFFSET_MODES),
       scatter=st.booleans(), seed=st.integers(0, 2**16))
def test_built_metadata_is_valid(lengths, capacity, mode, scatter, seed):
    meta = build_metadata(lengths, capacity, mode, random.Random(seed), scatter=scatter)
    assert meta.expected_code(sum(lengths)) == 0
    assert meta.lengths == lengths
    writes = [s for s in meta.final if s >= 0] + [s for _, _, _, s in meta.active_entries()]
    assert len(writes) == len(set(writes))
    assert all(0 <= s < meta.num_slots for s in writes)
    tensors = meta.tensors(torch.device("cpu"), torch.int32)
    expected_shape = (len(lengths),) if capacity == 1 else (len(lengths), capacity)
    assert tuple(tensors["checkpoint_offsets"].shape) == expected_shape


@pytest.mark.interpreter
def test_aligned_offsets_are_chunk_boundaries_of_the_kernel():
    from kdabench.kernels.config import KernelConfig

    assert CHUNK % KernelConfig().chunk_size == 0


@pytest.mark.parametrize(("variant", "capacity"), [
    (variant, capacity) for variant, needs in sorted(FAULT_VARIANTS.items())
    for capacity in (1, 2, 4) if capacity >= needs
])
@pytest.mark.parametrize("mode", OFFSET_MODES)
def test_each_fault_breaks_exactly_its_rule(variant, capacity, mode):
    """The fault table and the independent metadata oracle agree on every fault."""
    lengths = [5, 16, 70, 140]  # 140 holds two chunk-aligned offsets
    meta = build_metadata(lengths, capacity, mode, random.Random(7), initial_share=1.0)
    FAULTS[variant](meta, random.Random(7))
    assert meta.expected_code(sum(lengths)) == FAULT_BITS[variant]


def test_metadata_oracle_sees_vector_metadata_for_capacity_one():
    meta = build_metadata([20, 30], 1, "first", random.Random(1))
    offsets = [row[0] for row in meta.offsets]
    slots = [row[0] for row in meta.slots]
    assert expected_error_code(meta.cu_seqlens, 2, meta.initial, meta.final, offsets, slots,
                               meta.num_slots, 50) == 0


# --------------------------------------------------------------------------- a CPU-tier run


@pytest.mark.interpreter
def test_cpu_tier_run_writes_a_receipt_that_verifies(tmp_path, tiny_matrix):
    result = run_tiny(tmp_path, tiny_matrix)
    assert result.ok, [c.get("message") for c in result.cases]
    assert result.summary == {"total": 8, "pass": 8, "fail": 0, "error": 0, "skip": 0}
    check = verify_file(result.receipt_path)
    assert check.ok and check.sources_match and check.status == "complete"
    doc = load_receipt(result.receipt_path)
    assert doc["kind"] == "qualify" and doc["device"]["kind"] == "cpu"
    assert doc["config"]["tier"] == "cpu" and doc["config"]["backend"] == "triton"
    assert doc["config"]["matrix_origin"] == "file"
    assert doc["config"]["matrix"]["name"] == "tiny"
    assert "shard" not in doc["config"]
    assert result.receipt_path.name.startswith("qualify-")
    cases = {case["id"]: case for case in doc["cases"]}
    accuracy = cases["accuracy-C2-H1-K64-R3-unaligned-precomputed-lb5"]
    assert accuracy["tolerances"] == {"output": 5e-3, "state": 3e-3}
    assert 0 < accuracy["errors"]["output"] < 5e-3
    assert accuracy["errors"]["checkpoint"] < 3e-3
    assert accuracy["median_ms"] is None and accuracy["samples_ms"] == []
    assert accuracy["config_source"].startswith("heuristic (no profile entry for query v1 ")
    assert "block_v" in accuracy["kernel_config"] and accuracy["policy_mode"] == "AUTO"
    assert doc["config"]["policy_mode"] == "AUTO"
    contract = cases["contract-plan-refuses-capacity-3"]
    assert (contract["kernel_config"], contract["config_source"]) == (None, None)
    prefix = cases["prefix-C2-H1-K64-R3-aligned-precomputed-lb5"]
    assert prefix["checks"]["aligned_checkpoints"] > 0
    assert prefix["errors"]["prefix_aligned"] <= 1e-5  # interpreted: fp32 rounding, not bits
    fault = cases["fault-live-count-zero-C1-H1-K64-R3-unaligned-precomputed-lb5"]
    assert fault["checks"] == {"error_code": 2, "expected_error_code": 2,
                               "oracle_error_code": 2, "pool_unchanged": True,
                               "output_all_nan": True}
    assert [case["index"] for case in doc["cases"]] == list(range(8))
    for case in doc["cases"]:  # the interpreter compiles nothing: the wall time is run time
        assert case["compile_s"] == 0 and case["kernels_compiled"] == 0
        assert case["run_s"] == case["wall_s"] >= 0
    time = doc["config"]["time"]
    assert time["workers"] == 1 and time["compile_s"] == 0 and time["measures"] == MEASURES
    assert time["run_s"] == time["cases_wall_s"] == round(sum(c["wall_s"] for c in doc["cases"]),
                                                          3)
    assert time["wall_s"] >= time["cases_wall_s"] and time["backend_load_s"] is None


@pytest.mark.interpreter
def test_shards_merged_equal_one_unsharded_run(tmp_path, tiny_matrix):
    whole = run_tiny(tmp_path / "whole", tiny_matrix)
    shards = [run_tiny(tmp_path / f"s{i}", tiny_matrix, shard=(i, 2)) for i in (1, 2)]
    assert shards[0].receipt_path.name.endswith("-shard1of2.json")
    assert shards[1].receipt_path.name.endswith("-shard2of2.json")
    docs = [load_receipt(shard.receipt_path) for shard in shards]
    assert {doc["config"]["shard"] for doc in docs} == {"1/2", "2/2"}
    merged = qualify.merge_qualify_receipts(docs)
    assert merged["status"] == "complete"
    time = merged["config"]["time"]
    assert time["workers"] == 2 and time["wall_s"] is None  # shards run apart: no one wall
    assert time["cases_wall_s"] == round(sum(c["wall_s"] for c in merged["cases"]), 3)
    assert [entry["config"]["time"]["cases_wall_s"] for entry in merged["config"]["merged_from"]
            ] == [doc["config"]["time"]["cases_wall_s"] for doc in docs]
    whole_doc = load_receipt(whole.receipt_path)

    def ids_and_verdicts(doc):
        return [(c["id"], c["index"], c["verdict"]) for c in doc["cases"]]

    assert ids_and_verdicts(merged) == ids_and_verdicts(whole_doc)
    assert merged["summary"] == whole_doc["summary"]


@pytest.mark.interpreter
def test_a_wrong_kernel_output_fails_its_case(tmp_path, tiny_matrix, monkeypatch):
    real = kernels.kda_prefill

    def off_by_a_bit(*args, **kwargs):
        result = real(*args, **kwargs)
        result.o.mul_(1.02)
        return result

    monkeypatch.setattr(kernels, "kda_prefill", off_by_a_bit)
    result = run_tiny(tmp_path, tiny_matrix, contains="accuracy-C1")
    (case,) = result.cases
    assert case["verdict"] == "fail" and not result.ok
    assert "output error" in case["message"] and "exceeds tolerance 5.0e-03" in case["message"]


@pytest.mark.interpreter
def test_a_stray_pool_write_fails_its_case(tmp_path, tiny_matrix, monkeypatch):
    real = kernels.kda_prefill

    def scribbler(*args, state_pool, **kwargs):
        result = real(*args, state_pool=state_pool, **kwargs)
        named = {int(s) for name in ("initial_state_indices", "final_state_indices",
                                     "checkpoint_state_indices")
                 for s in kwargs[name].flatten().tolist()}
        spare = next(s for s in range(state_pool.shape[0]) if s not in named)
        state_pool[spare].add_(1.0)
        return result

    monkeypatch.setattr(kernels, "kda_prefill", scribbler)
    result = run_tiny(tmp_path, tiny_matrix, contains="accuracy-C2")
    (case,) = result.cases
    assert case["verdict"] == "fail"
    assert "a slot that no destination names was written" in case["message"]


@pytest.mark.interpreter
def test_accepting_bad_metadata_fails_the_fault_case(tmp_path, tiny_matrix, monkeypatch):
    real = kernels.kda_prefill

    def forgiving(*args, **kwargs):
        result = real(*args, **kwargs)
        result.error_code.zero_()
        return result

    monkeypatch.setattr(kernels, "kda_prefill", forgiving)
    result = run_tiny(tmp_path, tiny_matrix, contains="fault-offset-zero")
    (case,) = result.cases
    assert case["verdict"] == "fail" and "error code 0, expected 8" in case["message"]


@pytest.mark.interpreter
def test_a_crashing_case_is_an_error_and_the_run_goes_on(tmp_path, tiny_matrix, monkeypatch):
    def crash(ctx, case):
        raise RuntimeError("boom")

    monkeypatch.setitem(qualify.RUNNERS, "prefix", crash)
    result = run_tiny(tmp_path, tiny_matrix)
    verdicts = {case["scenario"]: case["verdict"] for case in result.cases}
    assert verdicts["prefix"] == "error" and verdicts["contract"] == "pass"
    crashed = next(case for case in result.cases if case["scenario"] == "prefix")
    assert crashed["message"] == "RuntimeError: boom"
    assert verify_file(result.receipt_path).ok


def test_an_interrupted_run_leaves_a_partial_receipt(tmp_path, tiny_matrix, monkeypatch):
    calls = []

    def fake(ctx, case):
        calls.append(case.id)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return {"id": case.id, "index": case.index, "scenario": case.scenario,
                "verdict": "pass"}

    monkeypatch.setattr(qualify.run, "run_case", fake)
    run = Qualification(tiny_matrix, tier="cpu", out_dir=tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run.run()
    check = verify_file(run.path)
    assert check.ok and check.status == "partial" and check.summary["total"] == 2


# --------------------------------------------------------------------------- policy


@pytest.mark.interpreter
def test_cases_record_the_profile_config_and_preplanned_refusals(tmp_path, tiny_matrix,
                                                                 monkeypatch):
    """A profile for this device ("cpu") in $KDABENCH_PROFILE_DIR: the accuracy case runs with
    its config and says so; under PREPLANNED_ONLY a query without an entry is an error case
    naming the query."""
    import dataclasses
    import json

    from kdabench.kernels.profiles import entry_document, profile_document

    caps = kernels.Caps(device="cpu", num_heads=1, head_dim=64, max_tokens=5 + 16 + 70,
                        max_seqs=3, max_state_slots=9, max_checkpoints=2)
    query = kernels.KdaQuery.from_caps(caps)
    tuned = kernels.KernelConfig(block_v=64, num_stages=1)
    folder = tmp_path / "profiles"
    folder.mkdir()
    document = profile_document("cpu", [entry_document(query, tuned)])
    (folder / "cpu.json").write_text(json.dumps(document))
    monkeypatch.setenv("KDABENCH_PROFILE_DIR", str(folder))
    monkeypatch.delenv("KDABENCH_POLICY_MODE", raising=False)
    result = run_tiny(tmp_path / "auto", tiny_matrix, contains="accuracy-C2")
    assert result.ok, result.cases
    case = result.cases[0]
    assert case["kernel_config"] == dataclasses.asdict(tuned)
    assert case["config_source"] == f"profile cpu.json ({query.describe()})"
    assert case["policy_mode"] == "AUTO"

    monkeypatch.setenv("KDABENCH_POLICY_MODE", "PREPLANNED_ONLY")
    result = run_tiny(tmp_path / "preplanned", tiny_matrix, contains="accuracy-C")
    verdicts = {case["id"].split("-")[1]: case for case in result.cases}
    assert verdicts["C2"]["verdict"] == "pass"
    assert verdicts["C2"]["policy_mode"] == "PREPLANNED_ONLY"
    refused = verdicts["C1"]
    assert refused["verdict"] == "error" and refused["message"].startswith(
        "KdaPolicyError: policy mode PREPLANNED_ONLY: no profile entry for query v1 heads=1 "
        "head_dim=64 dtype=bfloat16 capacity=1 gate=precomputed tokens<=128 seqs<=4 in cpu.json")
    assert refused["kernel_config"] is None
    assert load_receipt(result.receipt_path)["config"]["policy_mode"] == "PREPLANNED_ONLY"
    assert verify_file(result.receipt_path).ok
    contract = run_tiny(tmp_path / "contract", tiny_matrix, contains="contract-plan").cases[0]
    assert contract["verdict"] == "pass"  # a case that plans no kernel call records no config
    assert [contract[k] for k in ("kernel_config", "config_source", "policy_mode")] == [None] * 3


def test_a_bad_policy_mode_in_the_environment_is_refused(tmp_path, tiny_matrix, monkeypatch):
    monkeypatch.setenv("KDABENCH_POLICY_MODE", "sometimes")
    with pytest.raises(QualifyError, match=r"\$KDABENCH_POLICY_MODE 'sometimes' is not a "
                       "policy mode"):
        Qualification(tiny_matrix, tier="cpu", out_dir=tmp_path)


def test_receipts_from_before_the_policy_fields_still_verify():
    committed = sorted((Path(__file__).resolve().parents[1] / "results").glob("qualify-*.json"))
    if not committed:
        pytest.skip("no committed qualify receipt in results/")
    for path in committed:
        doc = load_receipt(path)
        assert verify_file(path).ok, path
        if not any("policy_mode" in case for case in doc["cases"]):
            return  # one receipt older than the fields verifies
    pytest.skip("every committed receipt has the policy fields")


# --------------------------------------------------------------------------- setup errors


def test_unknown_backend_and_empty_selection_are_refused(tmp_path, tiny_matrix):
    with pytest.raises(QualifyError, match="backend 'cute' is not in the matrix's backends"):
        Qualification(tiny_matrix, tier="cpu", backend="cute", out_dir=tmp_path)
    with pytest.raises(MatrixError, match=r"no cpu-tier case of tiny\.toml matches the filter"):
        Qualification(tiny_matrix, tier="cpu", contains="nothing-like-this", out_dir=tmp_path)


def test_a_backend_name_pins_the_config_it_names(tmp_path, tiny_matrix):
    """cute-s2 qualifies the cute backend with CuteConfig(key_split=2): refused where cute
    is not in the matrix, and on the CPU tier as cute is."""
    with pytest.raises(QualifyError, match="backend 'cute-s2' is not in the matrix's backends"):
        Qualification(tiny_matrix, tier="cpu", backend="cute-s2", out_dir=tmp_path)
    with pytest.raises(QualifyError, match="the cute backend runs on CUDA GPUs only"):
        Qualification(load_matrix(None), tier="cpu", backend="cute-s2", out_dir=tmp_path)


def test_a_pinned_config_reaches_the_call_and_the_record(monkeypatch):
    """A Context's pinned config is what kda_prefill plans with and what the case records
    (source "explicit", as plan() names a config it is given)."""
    from kdabench.kernels.config import KernelConfig
    from kdabench.qualify.harness import Context, kernel_record, prefill_call

    config = KernelConfig(chunk_size=16, block_v=16, prepare_warps=8)  # no policy's choice
    ctx = Context(torch.device("cpu"), "cpu", "triton", None, config=config)
    seen = {}
    monkeypatch.setattr(kernels, "kda_prefill", lambda *args, **kwargs: seen.update(kwargs))
    meta = build_metadata([5], 1, "first", random.Random(0))
    x = make_inputs([5], 1, 64)
    prefill_call(ctx, x, meta, torch.zeros(meta.num_slots, 1, 64, 64), torch.int32)()
    assert seen["config"] is config and seen["backend"] == "triton"
    record = kernel_record(ctx, caps=None)
    assert record["kernel_config"] == dataclasses.asdict(config)
    assert record["config_source"] == "explicit"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_gpu_tier_without_a_gpu_is_refused(tmp_path):
    matrix = parse_matrix(TINY.replace('tiers = ["cpu"]', 'tiers = ["gpu"]'))
    with pytest.raises(QualifyError, match="--tier gpu needs a CUDA GPU"):
        Qualification(matrix, tier="gpu", out_dir=tmp_path)


def test_summarize_by_scenario():
    cases = [
        {"scenario": "accuracy", "verdict": "pass", "errors": {"output": 1e-3, "checkpoint": 2e-4},
         "median_ms": 1.0},
        {"scenario": "accuracy", "verdict": "fail", "errors": {"output": 9e-3, "final_state": 1e-4},
         "median_ms": 3.0},
        {"scenario": "fault", "verdict": "pass", "errors": {}, "median_ms": None},
    ]
    table = summarize_by_scenario(cases)
    assert table["accuracy"] == {"cases": 2, "pass": 1, "fail": 1, "error": 0, "skip": 0,
                                 "worst_output_error": 9e-3, "worst_state_error": 2e-4,
                                 "median_ms": 2.0}
    assert table["fault"]["worst_output_error"] is None and table["fault"]["median_ms"] is None


# --------------------------------------------------------------------------- GPU tier


GPU_TINY = """
schema = "kdabench.matrix.v1"
name = "gpu-tiny"
timing = { warmup = 1, reps = 3 }
[layouts.R8]
lengths = [1, 15, 16, 17, 64, 100, 200, 33]

[[group]]
scenario = "accuracy"
tiers = ["gpu"]
capacity = [1, 4]
heads = 4
head_dim = 128
layout = "R8"

[[group]]
scenario = "graph"
tiers = ["gpu"]
capacity = 4
heads = 4
layout = "R8"

[[group]]
scenario = "fault"
tiers = ["gpu"]
variant = ["duplicate-final", "live-count-over-capacity"]
heads = 4
layout = "R8"

[[group]]
scenario = "fuzz"
tiers = ["gpu"]
capacity = 2
sets = 8
"""


@pytest.mark.gpu
def test_gpu_tier_tiny_matrix(tmp_path):
    result = Qualification(parse_matrix(GPU_TINY), tier="gpu", out_dir=tmp_path).run()
    assert result.ok, [c.get("message") for c in result.cases]
    timed = [c for c in result.cases if c["scenario"] in ("accuracy", "graph", "fault")]
    assert all(len(c["samples_ms"]) == 3 and c["median_ms"] > 0 for c in timed)
    assert verify_file(result.receipt_path).ok


def test_cpu_tier_bounds_checks_the_interpreted_kernels():
    """prepare_tier('cpu') installs kdabench.interp_memcheck in a fresh process (the test
    process has it from conftest, so the check runs in a subprocess)."""
    import subprocess
    import sys

    script = ("from kdabench.qualify.run import prepare_tier; prepare_tier('cpu'); "
              "from triton.runtime import interpreter; "
              "print(getattr(interpreter.InterpreterBuilder, '_kdabench_memcheck', False))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


class FakeTimes:
    """What triton's compilation listener is given: durations in microseconds."""

    def __init__(self, total_us: int) -> None:
        self.total = total_us


def test_the_compile_clock_sums_the_triton_listener_and_chains_the_previous_one(monkeypatch):
    from triton import knobs

    heard = []
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: heard.append(kw["cache_hit"]))
    clock = CompileClock()
    assert clock.install() and clock.install()  # a second install changes nothing
    listener = knobs.compilation.listener
    for total_us, hit in ((1_500_000, False), (250_000, True), (2_000_000, False)):
        listener(src=None, metadata={}, metadata_group={}, times=FakeTimes(total_us),
                 cache_hit=hit)
    assert clock.reading() == Reading(3.75, 2, 1)
    assert clock.reading() - Reading(1.5, 1, 0) == Reading(2.25, 1, 1)
    assert heard == [False, True, False]


def test_the_compile_clock_times_just_in_time_cute_compiles(monkeypatch):
    import time

    from kdabench.kernels.cute import runtime

    class Library:
        def __init__(self) -> None:
            self.compiled: dict[str, object] = {}

        def function(self, variant):
            if variant not in self.compiled:
                time.sleep(0.05)
                self.compiled[variant] = object()
            return self.compiled[variant]

    library = Library()
    monkeypatch.setattr(runtime, "library_for", lambda device: (library, []))
    clock = CompileClock()
    assert clock.load_backend("triton", "cpu") is None
    assert clock.load_backend("cute", "cpu") >= 0
    clock.load_backend("cute", "cpu")  # the same library is timed once
    for variant in ("validate", "validate", "state_pass"):
        library.function(variant)
    reading = clock.reading()
    assert reading.compiled == 2 and 0.1 <= reading.seconds < 1.0
