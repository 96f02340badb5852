"""kdabench.bench on the CPU: the shapes file, the two numbers, the metrics, the whole
pipeline with a fake backend (deterministic timings), the receipt as kdabench.report reads
it, and the CUDA backend's device-agnostic parts (kdabench under the Triton interpreter,
fla's call through a stand-in), a further kernel backend (``--backends triton,cute``) through
the fake."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import statistics
from pathlib import Path

import matplotlib.image
import pytest
import torch

from kdabench.bench import (
    CUDNN,
    FAST_DECAY,
    FLA,
    KDABENCH,
    KDABENCH_BASELINE,
    KDABENCH_C1,
    LONG_MEMORY,
    PEERS,
    SANITY_TOLERANCE,
    Bench,
    BenchError,
    BenchShape,
    Ceilings,
    GateRegime,
    KernelCalls,
    Outputs,
    Prepared,
    ShapesError,
    backend_kernel,
    backend_metrics,
    breakdown_record,
    count_bytes,
    count_flops,
    draw_inputs,
    floor,
    load_gate_stats,
    load_shapes,
    merge_bench_receipts,
    parse_gates,
    parse_shapes,
    policy_metrics,
    relative_error,
    shape_metrics,
    summarize,
    summarize_by_gates,
)
from kdabench.bench import cuda as bench_cuda
from kdabench.bench import options as bench_options
from kdabench.bench import replay as bench_replay
from kdabench.compare import compare_paths
from kdabench.kernel_records import plan_record
from kdabench.receipts import (
    ReceiptError,
    load_receipt,
    render_receipt,
    sanitize,
    seal,
    verify_file,
    verify_receipt,
)
from kdabench.report import bench_points, breakdown_line, build_report, short_kernel_name

TINY_SHAPES = """
schema = "kdabench.bench-shapes.v1"
name = "tiny"
head_dim = 64
[[shape]]
tokens = 64
heads = 1
seqs = 2
[[shape]]
tokens = 128
heads = 2
"""

# --------------------------------------------------------------------------- fake backend

CUTE = backend_kernel("cute")
CUTE_SOURCE = "cute backend, aot fake/sm_90a (nvidia-cutlass-dsl 4.8, built today)"

# Nominal milliseconds per 1024 tokens and head, per kernel and mode.
FAKE_MS = {("eager", FLA): 0.40, ("eager", KDABENCH): 0.20, ("eager", KDABENCH_C1): 0.19,
           ("eager", KDABENCH_BASELINE): 0.24, ("eager", CUTE): 0.16, ("eager", CUDNN): 0.10,
           ("graph", FLA): 0.20, ("graph", KDABENCH): 0.08, ("graph", KDABENCH_C1): 0.078,
           ("graph", KDABENCH_BASELINE): 0.10, ("graph", CUTE): 0.05, ("graph", CUDNN): 0.04}


def fake_timer(calls, warmup, reps):
    """Sample i is calls[i % n]() scaled by a fixed pattern: median = the nominal time."""
    pattern = (1.0, 0.98, 1.02, 0.99, 1.01)
    return [calls[i % len(calls)]() * pattern[i % len(pattern)] for i in range(reps)]


def fake_profiler(calls, runs):
    """Two GPU kernels per call, 30% and 70% of the call's nominal time (microseconds)."""
    us = calls[0]() * 1000
    return {"void at::native::cast_kernel<4, float>(int)": 0.3 * us,
            "kda_state_pass_kernel": 0.7 * us}


class FakeBackend:
    """Deterministic timings; kdabench's output is fla's plus `output_error` (relative), the
    baseline's and kdabench-cute's are kdabench's plus `baseline_error` and `backend_error`.
    Every kdabench plan resolves block_v 32 but the baseline's at T = 64 (block_v 16): the
    configs differ at that shape only; kdabench-cute's is the CuteConfig. `backend_reasons`:
    {backend: why it cannot run here}; `peer_reasons`: {peer: why it cannot run here} (fla's
    also from `fla_reason`; cudnn absent unless `cudnn` is True); cudnn's output is fla's
    plus `cudnn_error`."""

    def __init__(self, *, fla_reason: str | None = None, output_error: float = 1e-3,
                 fla_graph: bool = True, fail_prepare: bool = False, unavailable=None,
                 baseline_error: float = 0.0, backend_error: float = 0.0,
                 backend_reasons: dict[str, str] | None = None,
                 stale_replays: dict[str, str] | None = None, draw: bool = True,
                 cudnn: bool = False, cudnn_error: float = 0.0,
                 peer_reasons: dict[str, str] | None = None):
        self.timer = fake_timer
        self.profiler = fake_profiler
        self.output_error, self.cudnn_error = output_error, cudnn_error
        self.peer_reasons = {FLA: fla_reason, **({} if cudnn else {
            CUDNN: "nvidia-cudnn-frontend is not installed (fake)"}), **(peer_reasons or {})}
        self.fla_graph, self.fail_prepare, self._unavailable = fla_graph, fail_prepare, unavailable
        self.baseline_error, self.backend_error = baseline_error, backend_error
        self.backend_reasons = backend_reasons or {}
        self.stale_replays = stale_replays or {}
        self.draw = draw  # False: no CPU draw of the inputs (shapes too large for a test)
        self.released = 0
        self.policy_modes = []
        self.baseline_policies = []
        self.backends = []
        self.gates = []

    def unavailable(self):
        return self._unavailable

    def identity(self):
        return {"kind": "fake", "device": "fake:0", "name": "Fake GPU"}

    def peer_unavailable(self, peer):
        return self.peer_reasons.get(peer)

    def backend_unavailable(self, backend, shapes):
        return self.backend_reasons.get(backend)

    def ceilings(self):
        return Ceilings(4.0e12, 7.0e14, {"copy": {"samples_ms": [1.0]}})

    def prepare(self, shape, shapes, kernels, modes, gates, policy_mode=None,
                baseline_policy=None, backends=("auto",)):
        self.policy_modes.append(policy_mode)
        self.baseline_policies.append(baseline_policy)
        self.backends.append(list(backends))
        self.gates.append(gates.name)
        if self.fail_prepare:
            raise RuntimeError("out of fake memory")
        gate_stats = draw_inputs(shape, shapes, gates, "cpu")[1] if self.draw else {}
        scale = shape.tokens * shape.heads / 1024

        def calls(kernel):
            timed_as = CUTE if kernel.startswith(CUTE) else kernel  # kdabench-cute-s<N> too
            eager = [lambda k=timed_as: FAKE_MS["eager", k] * scale] * 3
            graph = [lambda k=timed_as: FAKE_MS["graph", k] * scale] * 3
            if kernel == FLA and not self.fla_graph:
                return KernelCalls(eager=eager, graph=None, graph_note="capture failed: sync")
            if "graph" not in modes:
                return KernelCalls(eager=eager)
            problem = self.stale_replays.get(kernel)
            check = {"sets": 3, "errors": [0.0, 1.0, 1.0] if problem else [0.0] * 3,
                     "max_error": 1.0 if problem else 0.0, "tolerance": 5e-2,
                     "problem": problem}
            return KernelCalls(eager=eager, graph=None if problem else graph,
                               graph_note=problem or "fake", replay_check=check)

        gen = torch.Generator().manual_seed(shape.tokens)
        reference = torch.randn(shape.tokens, shape.heads, shapes.head_dim, generator=gen)
        state = torch.randn(shape.seqs, shape.heads, shapes.head_dim, shapes.head_dim,
                            generator=gen)

        def noisy(tensor, error):
            noise = torch.randn(tensor.shape, generator=gen)
            return tensor + noise * error * tensor.norm() / noise.norm()

        def outputs():
            found = Outputs()
            ours = noisy(reference, self.output_error)
            baseline = noisy(ours, self.baseline_error)
            cute = noisy(ours, self.backend_error)
            cudnn = noisy(reference, self.cudnn_error)
            for kernel in kernels:
                found.output[kernel] = {FLA: reference, KDABENCH_BASELINE: baseline,
                                        CUTE: cute, CUDNN: cudnn}.get(kernel, ours)
                found.final_state[kernel] = state
            return found

        def record(kernel):
            mode = baseline_policy if kernel == KDABENCH_BASELINE else policy_mode
            if kernel == CUTE:
                return {"kernel_config": {"backend": "cute", "threads": 128,
                                          "rows_per_thread": 16},
                        "config_source": CUTE_SOURCE, "policy_mode": mode, "backend": "cute"}
            block_v = 16 if kernel == KDABENCH_BASELINE and shape.tokens == 64 else 32
            ran = backends[0] if backends[0] != "auto" else (  # a fake profile's per-shape pick
                "cute" if shape.tokens == 64 and kernel != KDABENCH_BASELINE else "triton")
            return {"kernel_config": {"block_v": block_v}, "config_source": f"fake ({mode})",
                    "policy_mode": mode, "backend": ran}

        def release():
            self.released += 1

        return Prepared(input_sets=3, input_set_bytes=count_bytes(
            shape.tokens, shape.heads, shapes.head_dim, shape.seqs),
            calls={k: calls(k) for k in kernels}, outputs=outputs, check=list,
            release=release, details={"kernel_configs": {
                k: record(k) for k in kernels if k not in PEERS}}, gate_stats=gate_stats)


@pytest.fixture
def tiny() -> object:
    return parse_shapes(TINY_SHAPES, origin="tiny.toml")


def run_fake(tmp_path: Path, shapes, **options):
    """A run on the fake backend; one gate regime (long-memory) unless ``gates`` says."""
    backend = options.pop("backend", None) or FakeBackend()
    options = {"reps": 11, "warmup": 1, "gates": [LONG_MEMORY], **options}
    bench = Bench(shapes, backend=backend, out_dir=tmp_path,
                  command_line=["kdabench", "bench"], created_at="2026-12-02T12:00:00Z",
                  **options)
    return bench.run()


# --------------------------------------------------------------------------- shapes file


def test_default_shapes_are_the_nine_bench_shapes():
    shapes = load_shapes(None)
    assert [s.label for s in shapes.shapes] == [
        "8192x8x1", "8192x8x(4x2048)", "8192x32x1", "8192x64x1", "16384x16x1", "32768x8x1",
        "65536x8x1", "65536x32x1", "32768x8x(64x512)"]
    assert (shapes.head_dim, shapes.lower_bound, shapes.origin) == (128, -5.0, "default")
    assert shapes.set_name == "default" and load_shapes("default") == shapes


def test_the_quick_set_is_three_of_the_default_shapes(tmp_path):
    quick, default = load_shapes("quick"), load_shapes(None)
    assert [s.label for s in quick.shapes] == ["8192x8x1", "65536x8x1", "32768x8x(64x512)"]
    assert set(quick.shapes) <= set(default.shapes) and quick.set_name == "quick"
    assert (quick.head_dim, quick.lower_bound, quick.seed) == (default.head_dim,
                                                               default.lower_bound, default.seed)
    mine = tmp_path / "mine.toml"
    mine.write_text(TINY_SHAPES)
    assert load_shapes(mine).set_name is None and load_shapes(str(mine)).name == "tiny"
    with pytest.raises(ShapesError, match="quik: no such shapes file, nor a packaged set "
                       r"\(default, quick\)"):
        load_shapes("quik")


@pytest.mark.parametrize("text, fragment", [
    ('schema = "other"\n[[shape]]\ntokens = 64\nheads = 1', "schema must be"),
    ('schema = "kdabench.bench-shapes.v1"\ncolour = 1\n[[shape]]\ntokens = 64\nheads = 1',
     "unknown key(s) colour"),
    ('schema = "kdabench.bench-shapes.v1"', "no [[shape]] entries"),
    ('schema = "kdabench.bench-shapes.v1"\n[[shape]]\nheads = 1', "shape 1: missing 'tokens'"),
    ('schema = "kdabench.bench-shapes.v1"\n[[shape]]\ntokens = 100\nheads = 1\nseqs = 3',
     "seqs 3 does not divide tokens 100"),
    ('schema = "kdabench.bench-shapes.v1"\n[[shape]]\ntokens = 64\nheads = 1\nseqs = 8',
     "sequences of 8 tokens"),
    ('schema = "kdabench.bench-shapes.v1"\n[[shape]]\ntokens = 0\nheads = 1', "tokens must be"),
    ('schema = "kdabench.bench-shapes.v1"\n[[shape]]\ntokens = 64\nheads = 1\nlen = 2',
     "shape 1: unknown key(s) len"),
    ('schema = "kdabench.bench-shapes.v1"\nhead_dim = 96\n[[shape]]\ntokens = 64\nheads = 1',
     "head_dim must be one of"),
    ('schema = "kdabench.bench-shapes.v1"\nlower_bound = -6\n[[shape]]\ntokens = 64\nheads = 1',
     "lower_bound must be"),
    ('schema = "kdabench.bench-shapes.v1"\n' + '[[shape]]\ntokens = 64\nheads = 1\n' * 2,
     "64x1x1 is listed twice"),
    ('schema = "kdabench.bench-shapes.v1"\n[[shape]\n', "TOML syntax error"),
], ids=["schema", "unknown-top", "no-shapes", "missing-tokens", "seqs-divide", "short",
        "zero-tokens",
        "unknown-shape-key", "head-dim", "lower-bound", "duplicate", "syntax"])
def test_shapes_file_errors(text, fragment):
    with pytest.raises(ShapesError) as caught:
        parse_shapes(text, origin="mine.toml")
    assert fragment in str(caught.value) and str(caught.value).startswith("mine.toml: ")


def test_missing_shapes_file(tmp_path):
    with pytest.raises(ShapesError, match="no such shapes file"):
        load_shapes(tmp_path / "absent.toml")
    with pytest.raises(ShapesError, match="is a folder"):
        load_shapes(tmp_path)


# --------------------------------------------------------------------------- gate regimes

STATS_TOML = """
schema = "kdabench.gate-stats.v1"
name = "layer-3"
mean = [-0.01, -1.0, -3.0, -8.0]
std = [0.0, 0.5, 1.0, 2.0]
"""


def test_the_regimes_draw_g_and_nothing_else():
    from kdabench.inputs import make_inputs

    shapes = parse_shapes(TINY_SHAPES.replace("head_dim = 64", "head_dim = 64\nseed = 7"))
    shape = BenchShape(4096, 2, 4)
    usual = make_inputs(shape.lengths, 2, 64, seed=7)
    slow, slow_stats = draw_inputs(shape, shapes, GateRegime(LONG_MEMORY, LONG_MEMORY), "cpu")
    fast, fast_stats = draw_inputs(shape, shapes, GateRegime(FAST_DECAY, FAST_DECAY), "cpu")
    for name in ("q", "k", "v", "beta", "initial_state", "cu_seqlens"):
        assert torch.equal(getattr(fast, name), getattr(usual, name)), name
    assert torch.equal(slow.g, usual.g) and not torch.equal(fast.g, usual.g)
    assert fast.gate == "precomputed" and fast.g.dtype == torch.float32
    assert fast_stats["mean"] == pytest.approx(-2.5, abs=0.02)  # -5 * E[sigmoid(z)] = -2.5
    assert -5.0 < fast_stats["min"] < fast_stats["max"] < 0
    assert fast_stats == pytest.approx({"mean": float(fast.g.double().mean()),
                                        "min": float(fast.g.min()), "max": float(fast.g.max())})
    assert slow_stats["mean"] > -1.5  # half the channels slow
    slow_channels = (usual.g.mean(0) > -0.5).float().mean()
    assert 0.4 < slow_channels < 0.75


def test_a_gate_stats_file_draws_per_channel_and_clips(tmp_path):
    path = tmp_path / "model.toml"
    path.write_text(STATS_TOML)
    regime = load_gate_stats(path)
    assert (regime.name, regime.kind, regime.file) == ("layer-3", "file", "model.toml")
    assert regime.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    g = regime.draw(20000, 1, 4, -5.0, seed=1)
    assert float(g.max()) <= 0 and float(g.min()) >= -5.0
    assert torch.all(g[:, 0, 0] == -0.01)  # std 0: the mean itself
    assert float(g[:, 0, 1].mean()) == pytest.approx(-1.0, abs=0.02)
    assert float(g[:, 0, 1].std()) == pytest.approx(0.5, abs=0.02)
    assert float((g[:, 0, 3] == -5.0).float().mean()) > 0.9  # N(-8, 2) clipped to the bound
    record = regime.record(3, statistics=True)
    assert record == {"name": "layer-3", "kind": "file", "formula": record["formula"],
                      "seed": 3, "file": "model.toml", "sha256": regime.sha256,
                      "mean": [-0.01, -1.0, -3.0, -8.0], "std": [0.0, 0.5, 1.0, 2.0]}
    assert "mean" not in regime.record(3) and str(tmp_path) not in str(record)
    as_json = tmp_path / "model.json"
    as_json.write_text(json.dumps({"schema": "kdabench.gate-stats.v1", "mean": [-1.0],
                                   "std": [0.1]}))
    from_json = load_gate_stats(as_json)
    assert (from_json.name, from_json.mean, from_json.std) == ("model", (-1.0,), (0.1,))


@pytest.mark.parametrize("text, fragment", [
    (STATS_TOML.replace("gate-stats.v1", "gate-stats.v0"), "schema must be"),
    (STATS_TOML + "bias = 1\n", "unknown key(s) bias"),
    (STATS_TOML.replace("std = [0.0, 0.5, 1.0, 2.0]", "std = [0.5]"),
     "mean has 4 channels and std 1"),
    (STATS_TOML.replace("-0.01,", "0.2,"), "mean must be <= 0"),
    (STATS_TOML.replace("0.0, 0.5", "-0.1, 0.5"), "std must be >= 0"),
    (STATS_TOML.replace("std = [0.0, 0.5, 1.0, 2.0]", 'std = "wide"'),
     "std must be a non-empty list of finite numbers"),
    (STATS_TOML.replace("std = [0.0, 0.5, 1.0, 2.0]", "std = [nan, 1.0, 1.0, 1.0]"),
     "std must be a non-empty list of finite numbers"),
    (STATS_TOML.replace('"layer-3"', '"fast-decay"'), "name must be"),
    (STATS_TOML.replace('"layer-3"', '"a b"'), "name must be"),
    ("mean = [", "TOML syntax error"),
], ids=["schema", "unknown", "lengths", "positive-mean", "negative-std", "not-a-list", "nan",
        "builtin-name", "bad-name", "syntax"])
def test_bad_gate_stats_files_are_refused(tmp_path, text, fragment):
    path = tmp_path / "stats.toml"
    path.write_text(text)
    with pytest.raises(BenchError) as caught:
        load_gate_stats(path)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"--gates {path}: ")


def test_gate_names_and_files_parse_in_order(tmp_path):
    path = tmp_path / "model.toml"
    path.write_text(STATS_TOML)
    assert [r.name for r in parse_gates([FAST_DECAY, str(path), FAST_DECAY])] == [
        FAST_DECAY, "layer-3"]
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{")
    copy = tmp_path / "copy.toml"
    copy.write_text(STATS_TOML)  # the same name inside
    for items, fragment in (([], "got nothing"), (["slow"], "'slow' is neither a regime"),
                            ([str(tmp_path / "absent.toml")], "no such gate-stats file"),
                            ([str(bad_json)], "not JSON"),
                            ([str(path), str(copy)], "two regimes are named 'layer-3'")):
        with pytest.raises(BenchError, match=re.escape(fragment)):
            parse_gates(items)


def test_a_gate_stats_file_must_have_head_dim_channels(tmp_path, tiny):
    path = tmp_path / "model.toml"
    path.write_text(STATS_TOML)
    with pytest.raises(BenchError, match="--gates model.toml: 4 channels, but the shapes have "
                       "head_dim 64"):
        Bench(tiny, backend=FakeBackend(), gates=[str(path)])


def test_every_shape_runs_under_every_regime(tmp_path, tiny):
    path = tmp_path / "model.toml"
    channels = ", ".join(["-0.5"] * 64)
    path.write_text(f'schema = "kdabench.gate-stats.v1"\nmean = [{channels}]\n'
                    f'std = [{", ".join(["0.25"] * 64)}]\n')
    backend = FakeBackend()
    result = run_fake(tmp_path / "out", tiny, backend=backend,
                      gates=[LONG_MEMORY, FAST_DECAY, str(path)])
    assert result.ok and verify_file(result.receipt_path).ok
    assert backend.gates == [LONG_MEMORY, FAST_DECAY, "model"] * 2
    assert [(c["id"], c["index"]) for c in result.cases] == [
        ("64x1x(2x32)/long-memory", 0), ("64x1x(2x32)/fast-decay", 1), ("64x1x(2x32)/model", 2),
        ("128x2x1/long-memory", 3), ("128x2x1/fast-decay", 4), ("128x2x1/model", 5)]
    receipt = load_receipt(result.receipt_path)
    config = receipt["config"]
    assert [r["name"] for r in config["gates"]] == [LONG_MEMORY, FAST_DECAY, "model"]
    assert config["gates"][1]["formula"] == "g = lower_bound * sigmoid(z), z ~ N(0, 1) per element"
    assert config["gates"][2]["file"] == "model.toml" and config["gates"][2]["mean"][0] == -0.5
    assert config["gates"][2]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert all(r["seed"] == 0 for r in config["gates"]) and config["shape_set"] == "file"
    fast = receipt["cases"][1]
    assert fast["shape"] == "64x1x(2x32)" and fast["gates"]["name"] == FAST_DECAY
    assert -5 < fast["gates"]["measured"]["min"] < fast["gates"]["measured"]["mean"] < \
        fast["gates"]["measured"]["max"] < 0
    model = receipt["cases"][2]["gates"]
    assert model["measured"]["mean"] == pytest.approx(-0.5, abs=0.05) and "mean" not in model
    summary = config["bench_summary"]
    assert (summary["cases"], summary["shapes"]) == (6, 2)
    assert list(result.summary["per_gates"]) == [LONG_MEMORY, FAST_DECAY, "model"]
    assert summary == sanitize(result.summary)
    assert summary["per_gates"][FAST_DECAY]["cases"] == 2
    assert set(summary["per_gates"][FAST_DECAY]["per_mode"]["graph"]["ratio_by_shape"]) == {
        "64x1x(2x32)/fast-decay", "128x2x1/fast-decay"}
    assert len(summary["per_mode"]["graph"]["ratio_by_shape"]) == 6
    assert [p.name.removeprefix(result.receipt_path.stem) for p in result.plots] == [
        f"-{mode}-{regime}.png" for mode in ("eager", "graph")
        for regime in (LONG_MEMORY, FAST_DECAY, "model")]
    shown = result.to_dict()
    assert shown["gates"] == [LONG_MEMORY, FAST_DECAY, "model"]
    assert shown["shapes"][1]["id"] == "64x1x(2x32)/fast-decay"
    assert shown["shapes"][1]["gates"] == FAST_DECAY


def test_the_default_runs_both_built_in_regimes(tmp_path, tiny):
    bench = Bench(tiny, backend=FakeBackend(), out_dir=tmp_path)
    assert [r.name for r in bench.gates] == [LONG_MEMORY, FAST_DECAY]
    assert [c.id for c in bench.cases][:2] == ["64x1x(2x32)/long-memory",
                                               "64x1x(2x32)/fast-decay"]


def test_compare_pairs_a_receipt_without_regimes_with_long_memory_cases(tmp_path, tiny):
    """A bench receipt made before gate regimes ran long-memory's inputs under case ids
    without a regime: compare pairs them with the long-memory cases of a newer one."""
    new = run_fake(tmp_path / "new", tiny, plot=False, gates=[LONG_MEMORY, FAST_DECAY])
    doc = load_receipt(new.receipt_path)
    cases = [{k: v for k, v in c.items() if k != "gates"} | {"id": c["shape"]}
             for c in doc["cases"] if c["gates"]["name"] == LONG_MEMORY]
    old_path = tmp_path / "old.json"
    old_path.write_bytes(render_receipt(seal({**doc, "cases": cases,
                                              "config": {k: v for k, v in doc["config"].items()
                                                         if k != "gates"}})))
    comparison = compare_paths(old_path, new.receipt_path)
    verdicts = {c.id: c.verdict for c in comparison.cases}  # BASE's ids where it has the case
    assert verdicts["64x1x(2x32)"] == verdicts["128x2x1"] == "unchanged"
    assert verdicts["64x1x(2x32)/fast-decay"] != "unchanged"  # only in the newer receipt
    assert len(verdicts) == 4
    again = run_fake(tmp_path / "again", tiny, plot=False, gates=[LONG_MEMORY, FAST_DECAY])
    assert {c.verdict for c in compare_paths(new.receipt_path, again.receipt_path).cases} == {
        "unchanged"}


# --------------------------------------------------------------------------- the two numbers


def test_bytes_and_flops_by_hand():
    # T = 16, H = 1, D = 64, N = 1; chunk 16.
    # bytes: q,k,v 3*16*64*2 = 6144; g 16*64*4 = 4096; beta 16*4 = 64; o 16*64*2 = 2048;
    # states (1 + 1 + 4) * 64*64*4 = 98304.
    assert count_bytes(16, 1, 64, 1) == 6144 + 4096 + 64 + 2048 + 98304
    # per token: 6*64*64 = 24576; 2*16*(3*64 + 2*64) = 10240; 2*16^2/3 = 170.67.
    assert count_flops(16, 1, 64, 16) == pytest.approx(16 * (24576 + 10240 + 512 / 3))
    work = floor(16, 1, 64, 1, 16, Ceilings(1e12, 1e15, {}))
    assert work["bytes_ms"] == pytest.approx(110656 / 1e12 * 1e3)
    assert work["flops_ms"] == pytest.approx(16 * (24576 + 10240 + 512 / 3) / 1e15 * 1e3)
    assert work["bound"] == "bytes" and work["ms"] == work["bytes_ms"]


def test_floor_of_the_anchor_shape_matches_the_notes():
    # kernels/NOTES.md: ~100 MB and ~10 GFLOP for 8192 x 8 heads, K = V = 128.
    assert 100e6 < count_bytes(8192, 8, 128, 1) < 110e6
    assert 7e9 < count_flops(8192, 8, 128, 16) < 13e9


# --------------------------------------------------------------------------- metrics


def test_ratio_overhead_and_summary_math():
    modes = {"graph": {FLA: {"median_ms": 3.0}, KDABENCH: {"median_ms": 1.0},
                       KDABENCH_C1: {"median_ms": 0.8}},
             "eager": {KDABENCH: {"median_ms": 2.0}, KDABENCH_C1: {"median_ms": 2.0}}}
    metrics = shape_metrics(modes, 8192, 0.5)
    assert metrics["ratio_fla_over_kdabench"] == {"graph": 3.0, "eager": None}
    assert metrics["export_overhead"]["graph"] == pytest.approx(0.25)
    assert metrics["export_overhead"]["eager"] == 0.0
    assert modes["graph"][KDABENCH]["tokens_per_s"] == pytest.approx(8192 / 1e-3)
    assert modes["graph"][KDABENCH]["to_floor"] == 2.0
    cases = [{"id": "a", "shape": "a", **metrics, "modes": modes},
             {"id": "b", "shape": "b", "ratio_fla_over_kdabench": {"graph": 1.0},
              "export_overhead": {"graph": 0.05}, "modes": {"graph": {KDABENCH: {"to_floor": 4}}}},
             {"id": "c", "shape": "c", "ratio_fla_over_kdabench": {"graph": 2.0},
              "export_overhead": {"graph": "nan"}, "modes": {}}]
    summary = summarize(cases, ["graph", "eager"])["per_mode"]
    assert summary["graph"]["median_ratio_fla_over_kdabench"] == 2.0
    assert summary["graph"]["min_ratio_fla_over_kdabench"] == 1.0
    assert summary["graph"]["median_export_overhead"] == pytest.approx(0.15)
    assert summary["graph"]["median_kdabench_to_floor"] == 3.0
    assert summary["eager"]["median_ratio_fla_over_kdabench"] is None


def test_policy_gain_is_the_baseline_over_kdabench():
    modes = {"graph": {KDABENCH: {"median_ms": 1.0}, KDABENCH_BASELINE: {"median_ms": 1.2}},
             "eager": {KDABENCH: {"median_ms": 2.0}}}
    configs = {KDABENCH: {"kernel_config": {"block_v": 32}},
               KDABENCH_BASELINE: {"kernel_config": {"block_v": 16}}}
    metrics = policy_metrics(modes, configs)
    assert metrics["policy_gain"]["graph"] == pytest.approx(1.2)  # slower baseline: above 1
    assert metrics["policy_gain"]["eager"] is None
    assert metrics["same_config"] is False
    assert policy_metrics(modes, {**configs, KDABENCH_BASELINE: configs[KDABENCH]})[
        "same_config"] is True
    assert policy_metrics(modes, None)["same_config"] is None
    cases = [{"id": "a", "shape": "a", **metrics},
             {"id": "b", "shape": "b", "policy_gain": {"graph": 0.9}, "same_config": True},
             {"id": "c", "shape": "c", "policy_gain": {"graph": 1.5}, "same_config": False},
             {"id": "d", "shape": "d", "verdict": "error"}]
    summary = summarize(cases, ["graph", "eager"], baseline=True)
    graph = summary["per_mode"]["graph"]
    assert graph["median_policy_gain"] == pytest.approx(1.2)
    assert graph["min_policy_gain"] == pytest.approx(0.9)
    assert graph["policy_gain_by_shape"] == {"a": pytest.approx(1.2), "b": 0.9, "c": 1.5}
    assert summary["per_mode"]["eager"]["median_policy_gain"] is None
    assert (summary["same_config_shapes"], summary["config_compared_shapes"]) == (1, 3)
    plain = summarize(cases, ["graph"])
    assert "same_config_shapes" not in plain and "median_policy_gain" not in \
        plain["per_mode"]["graph"]


def test_relative_error():
    reference = torch.ones(4, 4)
    assert relative_error(reference * 1.01, reference) == pytest.approx(0.01)
    assert relative_error(reference * float("nan"), reference) == math.inf
    with pytest.raises(ValueError, match="shapes differ"):
        relative_error(torch.ones(2), reference)


# --------------------------------------------------------------------------- the pipeline


def test_pipeline_writes_a_receipt_report_reads(tmp_path, tiny):
    result = run_fake(tmp_path, tiny)
    assert result.ok and verify_file(result.receipt_path).ok
    receipt = load_receipt(result.receipt_path)
    assert receipt["kind"] == "bench" and receipt["status"] == "complete"
    config = receipt["config"]
    assert config["modes"] == ["eager", "graph"] and config["kernels"] == [FLA, KDABENCH,
                                                                             KDABENCH_C1]
    assert config["ceilings"]["copy_bytes_per_s"] == 4.0e12
    assert config["bench_summary"]["per_mode"]["graph"]["median_ratio_fla_over_kdabench"] == \
        pytest.approx(0.20 / 0.08)
    case = receipt["cases"][0]
    assert (case["shape"], case["T"], case["H"], case["seqs"]) == ("64x1x(2x32)", 64, 1, 2)
    assert case["floor_ms"] == pytest.approx(case["floor"]["ms"]) and case["floor_ms"] > 0
    scale = 64 / 1024
    graph = case["modes"]["graph"]
    assert graph[KDABENCH]["median_ms"] == pytest.approx(0.08 * scale)
    assert len(graph[KDABENCH]["samples_ms"]) == 11
    assert case["kernels"] == graph  # the primary mode, for kdabench.report
    assert case["ratio_fla_over_kdabench"]["eager"] == pytest.approx(2.0)
    assert case["export_overhead"]["graph"] == pytest.approx(0.08 / 0.078 - 1)
    assert graph[KDABENCH]["tokens_per_s"] == pytest.approx(64 / (0.08 * scale / 1e3))
    assert case["sanity"]["output"] == pytest.approx(1e-3, rel=1e-3)
    points = {p.kernel: p for p in bench_points(case)}
    assert set(points) == {FLA, KDABENCH, KDABENCH_C1}
    assert points[KDABENCH].tokens == 64 and points[KDABENCH].floor_ms == case["floor_ms"]
    assert [p.name for p in result.plots] == [
        f"{result.receipt_path.stem}-eager-long-memory.png",
        f"{result.receipt_path.stem}-graph-long-memory.png"]
    for path in result.plots:
        assert matplotlib.image.imread(path).shape[0] > 100
    report = build_report([result.receipt_path], tmp_path / "report")
    assert report.plots and all(p.exists() for p in report.plots)
    text = report.markdown_path.read_text()
    assert "64x1x(2x32)" in text and f"{0.20 / 0.08:.2f}x" in text


def test_sanity_failure_fails_the_case(tmp_path, tiny):
    result = run_fake(tmp_path, tiny, backend=FakeBackend(output_error=0.2))
    assert not result.ok
    assert {c["verdict"] for c in result.cases} == {"fail"}
    assert "differs from fla's by 0.2" in result.cases[0]["message"]


def test_fla_absent_runs_kdabench_alone(tmp_path, tiny):
    result = run_fake(tmp_path, tiny, backend=FakeBackend(fla_reason="fla is not installed"))
    assert result.ok and result.fla_skipped == "fla is not installed"
    case = result.cases[0]
    assert set(case["kernels"]) == {KDABENCH, KDABENCH_C1}
    assert case["sanity"]["output"] is None
    assert case["ratio_fla_over_kdabench"] == {"eager": None, "graph": None}
    assert result.receipt["config"]["fla_skipped"] == "fla is not installed"


def test_against_none_and_eager_only(tmp_path, tiny):
    result = run_fake(tmp_path, tiny, against="none", modes=["eager"], plot=False)
    assert result.ok and result.plots == [] and result.fla_skipped is None
    case = result.cases[0]
    assert case["primary_mode"] == "eager" and set(case["modes"]) == {"eager"}
    assert FLA not in case["kernels"]


def test_cudnn_peer_runs_beside_fla(tmp_path, tiny):
    result = run_fake(tmp_path, tiny, backend=FakeBackend(cudnn=True), against="fla,cudnn")
    assert result.ok and result.peers_skipped == {}
    config = result.receipt["config"]
    assert config["against"] == "fla,cudnn" and config["peers"] == [FLA, CUDNN]
    assert config["kernels"][:2] == [FLA, CUDNN]
    case = result.cases[0]
    # fake graph: cudnn 0.04, kdabench 0.08 per 1024 tokens and head
    assert case["ratio_cudnn_over_kdabench"]["graph"] == pytest.approx(0.5)
    assert case["ratio_fla_over_kdabench"]["graph"] == pytest.approx(2.5)
    assert case["sanity"]["cudnn_output"] == pytest.approx(1e-3, rel=0.05)
    row = result.summary["per_mode"]["graph"]
    assert row["median_ratio_cudnn_over_kdabench"] == pytest.approx(0.5)
    assert set(row["cudnn_ratio_by_shape"]) == {c["id"] for c in result.cases}
    assert verify_file(result.receipt_path).ok


def test_absent_cudnn_is_skipped_with_its_reason(tmp_path, tiny):
    result = run_fake(tmp_path, tiny, against="cudnn,fla")
    assert result.ok and result.fla_skipped is None
    assert result.peers_skipped == {CUDNN: "nvidia-cudnn-frontend is not installed (fake)"}
    assert result.receipt["config"]["peers_skipped"] == result.peers_skipped
    case = result.cases[0]
    assert CUDNN not in case["kernels"] and FLA in case["kernels"]
    assert "ratio_cudnn_over_kdabench" not in case
    assert "median_ratio_cudnn_over_kdabench" not in result.summary["per_mode"]["graph"]


def test_a_cudnn_output_that_differs_fails_the_case(tmp_path, tiny):
    result = run_fake(tmp_path, tiny, backend=FakeBackend(cudnn=True, cudnn_error=0.2),
                      against="cudnn")
    assert not result.ok and FLA not in result.cases[0]["kernels"]
    assert re.search(r"kdabench output differs from cudnn's by 0\.[12]\d* \(relative\), over 0.05",
                     result.cases[0]["message"])


@pytest.mark.parametrize(("against", "peers"), [
    ("fla", (FLA,)), ("cudnn,fla", (FLA, CUDNN)), (" cudnn ", (CUDNN,)), ("none", ()),
    (["fla", "cudnn"], (FLA, CUDNN))])
def test_against_names_the_peers(against, peers):
    assert bench_options.peers(against) == peers


@pytest.mark.parametrize("against", ["flash", "none,fla", "", "fla,,triton"])
def test_against_refuses_what_is_no_peer(against):
    with pytest.raises(BenchError, match="--against takes a comma-separated subset of "
                       "fla,cudnn, or none"):
        bench_options.peers(against)


def test_fla_graph_capture_failure_leaves_its_column_empty(tmp_path, tiny):
    result = run_fake(tmp_path, tiny, backend=FakeBackend(fla_graph=False))
    case = result.cases[0]
    assert case["verdict"] == "pass" and FLA not in case["modes"]["graph"]
    assert FLA in case["modes"]["eager"]
    assert "fla has no graph column: capture failed: sync" in case["message"]
    assert case["ratio_fla_over_kdabench"]["graph"] is None


def test_a_crashing_shape_is_an_error_case(tmp_path, tiny):
    backend = FakeBackend(fail_prepare=True)
    result = run_fake(tmp_path, tiny, backend=backend)
    assert [c["verdict"] for c in result.cases] == ["error", "error"]
    assert "out of fake memory" in result.cases[0]["message"]
    assert verify_file(result.receipt_path).ok


def test_release_after_every_shape(tmp_path, tiny):
    backend = FakeBackend()
    run_fake(tmp_path, tiny, backend=backend, plot=False)
    assert backend.released == 2


@pytest.mark.parametrize("options, fragment", [
    ({"modes": ["fast"]}, "--modes"), ({"modes": []}, "--modes"),
    ({"against": "flash"}, "--against"), ({"reps": 0}, "--reps"),
    ({"backend": FakeBackend(unavailable="needs a CUDA GPU")}, "needs a CUDA GPU"),
], ids=["mode", "no-mode", "against", "reps", "no-device"])
def test_bad_options(tiny, options, fragment):
    options.setdefault("backend", FakeBackend())
    with pytest.raises(BenchError, match=fragment):
        Bench(tiny, **options)


# --------------------------------------------------------------------------- CUDA backend parts


def test_cuda_backend_refuses_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "needs a CUDA GPU" in bench_cuda.CudaBackend().unavailable()


def test_fla_import_reason_names_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_fla(name, *args, **kwargs):
        if name == "fla" or name.startswith("fla."):
            raise ModuleNotFoundError("No module named 'fla'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_fla)
    chunk_kda, reason = bench_cuda.import_fla()
    assert chunk_kda is None and "kdabench[bench]" in reason and "fla" in reason


def test_input_sets_cover_the_cache():
    assert bench_cuda.input_set_count(100 << 20, 50 << 20) == 3
    assert bench_cuda.input_set_count(10 << 20, 50 << 20) == 10
    assert bench_cuda.input_set_count(1, 50 << 20) == bench_cuda.MAX_INPUT_SETS


def test_rotated_sets_are_distinct_valid_inputs():
    from kdabench.inputs import make_inputs

    base = make_inputs([16, 16], 1, 64, seed=3)
    sets = bench_cuda.rotated_sets(base, 3)
    assert len(sets) == 3
    for x in sets[1:]:
        assert not torch.equal(x.q, base.q) and x.q.data_ptr() != base.q.data_ptr()
        assert torch.equal(x.cu_seqlens, base.cu_seqlens)
        assert float(x.g.min()) >= -5.0 and float(x.g.max()) < 0
        assert sorted(x.q.flatten().tolist()) == sorted(base.q.flatten().tolist())
    assert torch.equal(sets[1].initial_state, -torch.roll(base.initial_state, 1, 0))


def test_checkpoint_offsets():
    assert bench_cuda.checkpoint_offsets(2048, 4) == [409, 819, 1231, 1641]
    assert bench_cuda.checkpoint_offsets(2048, 1) == [1024]
    assert bench_cuda.checkpoint_offsets(32, 4) == [6, 12, 22, 28]
    with pytest.raises(ValueError, match="too short"):
        bench_cuda.checkpoint_offsets(8, 4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="runs the kernels under the interpreter")
def test_kdabench_bindings_run_under_the_interpreter():
    from kdabench import kernels
    from kdabench.inputs import make_inputs

    shape = BenchShape(64, 1, 2)
    base = make_inputs(shape.lengths, 1, 64, seed=5)
    sets = bench_cuda.rotated_sets(base, 2)
    device = torch.device("cpu")
    outputs = {}
    for capacity in (4, 1):
        _, runs = bench_cuda.kdabench_runs(kernels, sets, shape, capacity, device)
        for run in runs:
            result = kernels.run(run.binding)
            result.raise_for_error()
            assert torch.isfinite(result.o.float()).all()
        outputs[capacity] = runs[0].binding.out.float()
        pool = runs[0].pool
        assert torch.equal(pool[:2], sets[0].initial_state)  # initial slots are read only
        written = pool[2:2 + 2 + 4 * 2].flatten(1).abs().sum(1)
        assert (written[:2] > 0).all()  # final states
        assert ((written[2:] > 0).sum() == (8 if capacity == 4 else 2))  # checkpoints
    assert relative_error(outputs[1], outputs[4]) < 1e-6


def test_fla_call_passes_the_documented_arguments():
    from kdabench.inputs import make_inputs

    x = make_inputs([16, 32], 2, 64, seed=1)
    seen = {}

    def chunk_kda(q, k, v, g, beta, **kwargs):
        seen.update(q=q, g=g, beta=beta, inference=torch.is_inference_mode_enabled(), **kwargs)
        return v[..., :].clone(), kwargs["initial_state"]

    (fla_set,) = bench_cuda.fla_sets([x])
    bench_cuda.fla_call(chunk_kda, fla_set)()
    assert seen["q"].shape == (1, 48, 2, 64) and seen["beta"].shape == (1, 48, 2)
    assert seen["inference"] and seen["safe_gate"] and seen["lower_bound"] == -5.0
    assert seen["output_final_state"] and seen["cu_seqlens"].dtype == torch.int64
    assert torch.equal(seen["initial_state"], x.initial_state.transpose(-1, -2))
    assert "use_graph" not in seen
    bench_cuda.fla_call(chunk_kda, fla_set, graph_mode=True)()
    assert seen["use_graph"] and seen["max_num_seqs"] == 2


def test_every_fla_call_passes_tensors_its_set_holds():
    # A captured graph reads its inputs by address: a tensor made inside a call's closure is
    # freed once the capture is done, and the replays then read whatever took its memory (seen
    # on an H100: fla's replays of input sets 1 and 2 off by 0.05 to 0.94). fla also caches what
    # it derives from cu_seqlens by object identity, so the sets share one cu_seqlens object.
    from kdabench.inputs import make_inputs

    sets = bench_cuda.rotated_sets(make_inputs([16, 32], 2, 64, seed=1), 3)
    fla_inputs = bench_cuda.fla_sets(sets)
    assert fla_inputs[0].cu_seqlens.dtype == torch.int64
    assert fla_inputs[0].cu_seqlens.tolist() == [0, 16, 48]
    passed = []

    def chunk_kda(q, k, v, g, beta, **kwargs):
        passed.append((q, k, v, g, beta, kwargs["initial_state"], kwargs["cu_seqlens"]))
        return v.clone(), kwargs["initial_state"]

    for fla_set in fla_inputs:
        bench_cuda.fla_call(chunk_kda, fla_set)()
        bench_cuda.fla_call(chunk_kda, fla_set, graph_mode=True)()
    assert len(passed) == 6
    for index, arguments in enumerate(passed):
        fla_set = fla_inputs[index // 2]
        held = (fla_set.q, fla_set.k, fla_set.v, fla_set.g, fla_set.beta,
                fla_set.initial_state, fla_inputs[0].cu_seqlens)
        assert all(a is b for a, b in zip(arguments, held, strict=True))
    assert torch.equal(fla_inputs[1].initial_state, sets[1].initial_state.transpose(-1, -2))
    other = make_inputs([24, 24], 2, 64, seed=1)
    with pytest.raises(ValueError, match="share their cu_seqlens"):
        bench_cuda.fla_sets([sets[0], other])


def test_fake_timer_median_is_nominal():
    samples = fake_timer([lambda: 2.0] * 3, 0, 11)
    assert statistics.median(samples) == 2.0


# --------------------------------------------------------------------------- policy modes


def test_the_policy_mode_reaches_the_plans_and_the_receipt(tmp_path, tiny):
    backend = FakeBackend()
    result = run_fake(tmp_path, tiny, backend=backend, plot=False, policy_mode="heuristic-only")
    assert backend.policy_modes == ["HEURISTIC_ONLY", "HEURISTIC_ONLY"]
    receipt = load_receipt(result.receipt_path)
    assert receipt["config"]["policy_mode"] == "HEURISTIC_ONLY"
    resolved = receipt["cases"][0]["kernel_configs"]
    assert set(resolved) == {KDABENCH, KDABENCH_C1}
    assert resolved[KDABENCH]["config_source"] == "fake (HEURISTIC_ONLY)"
    assert result.to_dict()["policy_mode"] == "HEURISTIC_ONLY"
    assert result.to_dict()["shapes"][0]["config_sources"][KDABENCH_C1] == \
        "fake (HEURISTIC_ONLY)"


def test_the_policy_mode_defaults_to_the_environment_then_auto(tmp_path, tiny, monkeypatch):
    monkeypatch.delenv("KDABENCH_POLICY_MODE", raising=False)
    assert Bench(tiny, backend=FakeBackend(), out_dir=tmp_path).policy_mode == "AUTO"
    monkeypatch.setenv("KDABENCH_POLICY_MODE", "PREPLANNED_ONLY")
    assert Bench(tiny, backend=FakeBackend(), out_dir=tmp_path).policy_mode == \
        "PREPLANNED_ONLY"
    assert Bench(tiny, backend=FakeBackend(), out_dir=tmp_path,
                 policy_mode="AUTO").policy_mode == "AUTO"
    with pytest.raises(BenchError, match="--policy-mode: policy_mode 'fast' is not a policy "
                       "mode"):
        Bench(tiny, backend=FakeBackend(), policy_mode="fast")


def test_a_baseline_policy_is_timed_and_recorded_beside_kdabench(tmp_path, tiny):
    backend = FakeBackend()
    result = run_fake(tmp_path, tiny, backend=backend, policy_mode="auto",
                      baseline_policy="heuristic-only")
    assert result.ok and verify_file(result.receipt_path).ok
    assert backend.policy_modes == ["AUTO", "AUTO"]
    assert backend.baseline_policies == ["HEURISTIC_ONLY", "HEURISTIC_ONLY"]
    receipt = load_receipt(result.receipt_path)
    config = receipt["config"]
    assert (config["policy_mode"], config["baseline_policy"]) == ("AUTO", "HEURISTIC_ONLY")
    assert config["kernels"] == [FLA, KDABENCH, KDABENCH_C1, KDABENCH_BASELINE]
    first, second = receipt["cases"]
    scale = 64 / 1024
    for mode, ms in (("eager", 0.24), ("graph", 0.10)):
        entry = first["modes"][mode][KDABENCH_BASELINE]
        assert entry["median_ms"] == pytest.approx(ms * scale) and len(entry["samples_ms"]) == 11
    # baseline 0.10 / kdabench 0.08 in graph mode, 0.24 / 0.20 eager: the profile is faster
    assert first["policy_gain"] == {"eager": pytest.approx(1.2), "graph": pytest.approx(1.25)}
    assert first["kernel_configs"][KDABENCH_BASELINE] == {
        "kernel_config": {"block_v": 16}, "config_source": "fake (HEURISTIC_ONLY)",
        "policy_mode": "HEURISTIC_ONLY", "backend": "triton"}
    assert first["kernel_configs"][KDABENCH]["policy_mode"] == "AUTO"
    assert (first["same_config"], second["same_config"]) == (False, True)
    assert first["sanity"]["baseline_output"] == 0.0
    summary = config["bench_summary"]
    assert summary["per_mode"]["graph"]["median_policy_gain"] == pytest.approx(1.25)
    assert summary["per_mode"]["eager"]["min_policy_gain"] == pytest.approx(1.2)
    assert (summary["same_config_shapes"], summary["config_compared_shapes"]) == (1, 2)
    shown = result.to_dict()
    assert shown["baseline_policy"] == "HEURISTIC_ONLY"
    assert shown["shapes"][0]["policy_gain"]["graph"] == pytest.approx(1.25)
    assert shown["shapes"][1]["same_config"] is True
    assert KDABENCH_BASELINE in {p.kernel for p in bench_points(first)}
    assert len(result.plots) == 2
    # kdabench report and kdabench compare read a receipt with the extra kernel
    report = build_report([result.receipt_path], tmp_path / "report")
    assert f"{KDABENCH_BASELINE} (ms)" in report.markdown_path.read_text()
    again = run_fake(tmp_path / "again", tiny, policy_mode="AUTO", plot=False,
                     baseline_policy="HEURISTIC_ONLY")
    comparison = compare_paths(result.receipt_path, again.receipt_path)
    assert {c.verdict for c in comparison.cases} == {"unchanged"}
    assert not comparison.has_regression


def test_without_a_baseline_there_is_no_baseline_kernel_nor_policy_gain(tmp_path, tiny):
    backend = FakeBackend()
    result = run_fake(tmp_path, tiny, backend=backend, plot=False)
    assert backend.baseline_policies == [None, None]
    receipt = load_receipt(result.receipt_path)
    assert receipt["config"]["baseline_policy"] is None
    assert KDABENCH_BASELINE not in receipt["config"]["kernels"]
    case = receipt["cases"][0]
    assert KDABENCH_BASELINE not in case["kernels"] and KDABENCH_BASELINE not in \
        case["kernel_configs"]
    assert "policy_gain" not in case and "same_config" not in case
    assert case["sanity"]["baseline_output"] is None
    assert "median_policy_gain" not in receipt["config"]["bench_summary"]["per_mode"]["graph"]
    assert "same_config_shapes" not in receipt["config"]["bench_summary"]
    shown = result.to_dict()
    assert shown["baseline_policy"] is None and shown["shapes"][0]["policy_gain"] is None


def test_a_baseline_whose_output_differs_fails_the_case(tmp_path, tiny):
    result = run_fake(tmp_path, tiny, backend=FakeBackend(baseline_error=0.2), plot=False,
                      baseline_policy="HEURISTIC_ONLY")
    assert {c["verdict"] for c in result.cases} == {"fail"}
    assert result.cases[0]["sanity"]["baseline_output"] == pytest.approx(0.2, rel=1e-3)
    assert "kdabench-baseline output differs from kdabench's by 0.2" in \
        result.cases[0]["message"]


def test_the_baseline_policy_must_be_another_mode(tmp_path, tiny, monkeypatch):
    monkeypatch.delenv("KDABENCH_POLICY_MODE", raising=False)
    with pytest.raises(BenchError, match="--baseline-policy AUTO is the run's policy mode"):
        Bench(tiny, backend=FakeBackend(), out_dir=tmp_path, baseline_policy="auto")
    with pytest.raises(BenchError, match="--baseline-policy HEURISTIC_ONLY is the run's"):
        Bench(tiny, backend=FakeBackend(), out_dir=tmp_path, policy_mode="heuristic_only",
              baseline_policy="Heuristic-Only")
    monkeypatch.setenv("KDABENCH_POLICY_MODE", "PREPLANNED_ONLY")
    with pytest.raises(BenchError, match="--baseline-policy PREPLANNED_ONLY is the run's"):
        Bench(tiny, backend=FakeBackend(), out_dir=tmp_path, baseline_policy="preplanned_only")
    with pytest.raises(BenchError, match="--baseline-policy: policy_mode 'best' is not a "
                       "policy mode"):
        Bench(tiny, backend=FakeBackend(), out_dir=tmp_path, baseline_policy="best")
    bench = Bench(tiny, backend=FakeBackend(), out_dir=tmp_path, baseline_policy="auto")
    assert (bench.policy_mode, bench.baseline_policy) == ("PREPLANNED_ONLY", "AUTO")


@pytest.mark.skipif(torch.cuda.is_available(), reason="plans on the CPU under the interpreter")
def test_kdabench_runs_plan_under_the_policy_mode():
    from kdabench import kernels
    from kdabench.inputs import make_inputs

    shape = BenchShape(64, 1, 2)
    sets = [make_inputs(shape.lengths, 1, 64, seed=5)]
    device = torch.device("cpu")
    plan, _ = bench_cuda.kdabench_runs(kernels, sets, shape, 4, device,
                                       policy_mode="HEURISTIC_ONLY")
    assert plan_record(plan) == {
        "kernel_config": dataclasses.asdict(plan.config),
        "config_source": "heuristic (policy mode HEURISTIC_ONLY)",
        "policy_mode": "HEURISTIC_ONLY", "backend": "triton"}
    # "auto" (the bench's default, kda_prefill's) resolves at plan time, and the record says to
    # what: here no profile names another backend, so Triton
    auto, _ = bench_cuda.kdabench_runs(kernels, sets, shape, 4, device, backend="auto")
    assert plan_record(auto)["backend"] == "triton"
    with pytest.raises(kernels.KdaPolicyError, match="no profile entry for query v1 heads=1 "
                       "head_dim=64 dtype=bfloat16 capacity=4"):
        bench_cuda.kdabench_runs(kernels, sets, shape, 4, device, policy_mode="PREPLANNED_ONLY")
    tuned = kernels.KernelConfig(block_v=64)
    plan, _ = bench_cuda.kdabench_runs(kernels, sets, shape, 2, device, config=tuned)
    assert (plan.config, plan.config_source) == (tuned, "explicit")
    assert bench_cuda.checkpoint_offsets(30, 2) == [10, 20]


@pytest.mark.gpu
def test_cuda_backend_records_what_its_plans_resolved(tiny):
    backend = bench_cuda.CudaBackend()
    prepared = backend.prepare(tiny.shapes[0], tiny, [KDABENCH, KDABENCH_C1], ["eager"],
                               gates=GateRegime(LONG_MEMORY, LONG_MEMORY),
                               policy_mode="HEURISTIC_ONLY")
    try:
        resolved = prepared.details["kernel_configs"]
        assert set(resolved) == {KDABENCH, KDABENCH_C1}
        for entry in resolved.values():
            assert entry["config_source"] == "heuristic (policy mode HEURISTIC_ONLY)"
            assert entry["policy_mode"] == "HEURISTIC_ONLY" and "block_v" in entry["kernel_config"]
    finally:
        prepared.release()


@pytest.mark.gpu
def test_cuda_backend_plans_the_baseline_under_its_own_mode(tiny):
    backend = bench_cuda.CudaBackend()
    prepared = backend.prepare(tiny.shapes[0], tiny, [KDABENCH, KDABENCH_BASELINE],
                               ["eager", "graph"], gates=GateRegime(FAST_DECAY, FAST_DECAY),
                               policy_mode="AUTO",
                               baseline_policy="HEURISTIC_ONLY")
    try:
        resolved = prepared.details["kernel_configs"]
        assert resolved[KDABENCH]["policy_mode"] == "AUTO"
        assert resolved[KDABENCH_BASELINE]["config_source"] == \
            "heuristic (policy mode HEURISTIC_ONLY)"
        calls = prepared.calls[KDABENCH_BASELINE]
        assert calls.graph is not None and "replay checked" in calls.graph_note
        outputs = prepared.outputs()
        assert relative_error(outputs.output[KDABENCH_BASELINE],
                              outputs.output[KDABENCH]) < 1e-2
    finally:
        prepared.release()


class FakeGraph:
    """A graph whose replay writes `values` into the captured tensors (as a real replay
    would); a None value leaves its tensor as it is."""

    def __init__(self, written, values):
        self.written, self.values = written, values

    def replay(self) -> None:
        with torch.inference_mode():  # a real replay bypasses autograd altogether
            for tensor, value in zip(self.written, self.values, strict=True):
                if value is not None:
                    tensor.copy_(value)


@pytest.mark.parametrize(("replayed", "ok"), [("same", True), ("nothing", False),
                                              ("other", False), ("no-final", False)])
@pytest.mark.parametrize("inference", [False, True], ids=["normal", "inference-tensor"])
def test_a_graph_replay_must_reproduce_the_eager_output(replayed, ok, inference):
    output, final = torch.randn(8, 4), torch.randn(2, 3)
    with torch.inference_mode(inference):  # fla's outputs are inference tensors
        captured = (torch.randn(8, 4), torch.randn(2, 3))  # (o, final) as fla returns them
    values = {"same": (output, final), "nothing": (None, None),
              "other": (output * 1.1, final), "no-final": (output, None)}[replayed]
    error = bench_replay.replay_error(FakeGraph(captured, values), captured,
                                      lambda: (output.clone(), final.clone()))
    assert (error <= SANITY_TOLERANCE) == ok
    assert error == (0.0 if ok else pytest.approx(0.1) if replayed == "other" else 1.0)


def test_every_input_sets_replay_is_checked():
    """A stale graph (one that replays set 0's work) is caught on the set it stands for."""
    gen = torch.Generator().manual_seed(0)
    first, second = torch.randn(6, 2, generator=gen), torch.randn(6, 2, generator=gen)
    sets = [first, second, -first]  # set 0's result for set 2: a relative error of exactly 2
    captured = [(torch.zeros(6, 2),) for _ in sets]
    graphs = [FakeGraph(captured[0], (sets[0],)), FakeGraph(captured[1], (sets[1],)),
              FakeGraph(captured[2], (sets[0],))]  # set 2's graph replays set 0's result
    eager = [(lambda x=x: (x.clone(),)) for x in sets]
    check = bench_replay.check_replays(list(zip(graphs, captured, strict=True)), eager)
    assert check["sets"] == 3 and check["errors"][:2] == [0.0, 0.0]
    assert check["errors"][2] == pytest.approx(2.0) and check["max_error"] == check["errors"][2]
    assert check["tolerance"] == SANITY_TOLERANCE
    assert check["problem"].startswith("graph replay of input set(s) 2 of 3 differs from an "
                                       "eager call on the same set")
    good = bench_replay.check_replays(list(zip(graphs[:2], captured[:2], strict=True)),
                                      eager[:2])
    assert good["problem"] is None and good["max_error"] == 0.0


def test_a_stale_graph_replay_fails_the_case(tmp_path, tiny):
    problem = "graph replay of input set(s) 1, 2 of 3 differs from an eager call"
    result = run_fake(tmp_path, tiny, backend=FakeBackend(stale_replays={FLA: problem}),
                      plot=False)
    assert {c["verdict"] for c in result.cases} == {"fail"}
    case = result.cases[0]
    assert f"fla: {problem}" in case["message"] and "no graph column" not in case["message"]
    assert FLA not in case["modes"]["graph"] and FLA in case["modes"]["eager"]
    assert case["graph_checks"][FLA]["problem"] == problem
    assert case["graph_checks"][KDABENCH] == {"sets": 3, "errors": [0.0] * 3, "max_error": 0.0,
                                              "tolerance": 5e-2, "problem": None}
    assert "graph_checks" in result.receipt["config"]["definitions"]
    eager_only = run_fake(tmp_path / "eager", tiny, modes=["eager"], plot=False,
                          backend=FakeBackend(stale_replays={FLA: problem}))
    assert eager_only.ok and "graph_checks" not in eager_only.cases[0]


class RunGraph:
    """A stand-in for a captured kdabench run: its replay runs ``binding`` eagerly."""

    def __init__(self, kernels, binding):
        self.kernels, self.binding = kernels, binding

    def replay(self) -> None:
        self.kernels.run(self.binding)


@pytest.mark.skipif(torch.cuda.is_available(), reason="runs the kernels under the interpreter")
def test_kdabench_replays_are_checked_on_output_and_written_pool_slots():
    """What the CUDA backend checks per input set: the output and the pool slots a run writes
    (final states, checkpoints); a graph standing in for another set's run is caught."""
    from kdabench import kernels
    from kdabench.inputs import make_inputs

    shape = BenchShape(64, 1, 2)
    sets = bench_cuda.rotated_sets(make_inputs(shape.lengths, 1, 64, seed=5), 3)
    _, runs = bench_cuda.kdabench_runs(kernels, sets, shape, 4, torch.device("cpu"))
    first = runs[0]
    assert kernels.run(first.binding).o.data_ptr() == first.binding.out.data_ptr()
    assert first.written.data_ptr() == first.pool[2].data_ptr()  # slots N.. of N = 2
    assert first.written.shape[0] == 2 + 4 * 2 and first.written.abs().sum() > 0
    eager = [(lambda run=run: (kernels.run(run.binding).o, run.written)) for run in runs]
    written = [(run.binding.out, run.written) for run in runs]
    good = bench_replay.check_replays(
        [(RunGraph(kernels, run.binding), out) for run, out in zip(runs, written, strict=True)],
        eager)
    assert good["problem"] is None and good["max_error"] < 1e-6
    stale = bench_replay.check_replays(
        [(RunGraph(kernels, runs[0].binding), out) for out in written], eager)
    assert stale["errors"][0] < 1e-6 and min(stale["errors"][1:]) == 1.0  # left zeroed
    assert stale["problem"].startswith("graph replay of input set(s) 1, 2 of 3")
    assert torch.equal(first.pool[:2], sets[0].initial_state)  # the initial states untouched


@pytest.mark.gpu
def test_real_graphs_pass_the_replay_check_and_an_empty_one_does_not(tiny):
    """On the GPU: kdabench's captured runs (and fla's, when installed) reproduce an eager call
    on every input set, under both built-in gate regimes; a graph that captured no work is
    refused."""
    modes = ["eager", "graph"]
    backend = bench_cuda.CudaBackend()
    kernels = [KDABENCH] if backend.fla_unavailable() else [KDABENCH, FLA]
    for name in (LONG_MEMORY, FAST_DECAY):
        prepared = backend.prepare(tiny.shapes[0], tiny, kernels, modes,
                                   gates=GateRegime(name, name))
        try:
            for kernel in kernels:
                calls = prepared.calls[kernel]
                assert calls.graph is not None, calls.graph_note
                assert "every replay checked" in calls.graph_note
                check = calls.replay_check
                assert check["problem"] is None and check["sets"] == prepared.input_sets
                assert len(check["errors"]) == prepared.input_sets
            eager = prepared.calls[KDABENCH].eager[0]
            output = eager().o
            empty = torch.cuda.CUDAGraph()
            with torch.cuda.graph(empty):
                pass
            assert bench_replay.replay_error(empty, (output,),
                                             lambda call=eager: (call().o,)) == 1.0
        finally:
            prepared.release()


# --------------------------------------------------------------------------- kernel backends


def test_backend_ratios_are_fla_and_kdabench_over_the_backend():
    modes = {"graph": {FLA: {"median_ms": 3.0}, KDABENCH: {"median_ms": 1.5},
                       CUTE: {"median_ms": 1.0}},
             "eager": {KDABENCH: {"median_ms": 2.0}}}
    ratios = backend_metrics(modes, [CUTE])["backend_ratios"][CUTE]
    assert ratios["ratio_fla_over"] == {"graph": 3.0, "eager": None}
    assert ratios["ratio_kdabench_over"] == {"graph": 1.5, "eager": None}
    cases = [{"id": "a", "shape": "a", "backend_ratios": {CUTE: ratios},
              "modes": {"graph": {CUTE: {"to_floor": 2.0}}}},
             {"id": "b", "shape": "b", "backend_ratios": {CUTE: {"ratio_fla_over": {"graph": 1.0},
                                                      "ratio_kdabench_over": {"graph": 0.5}}}},
             {"id": "c", "shape": "c", "verdict": "error"}]
    summary = summarize(cases, ["graph", "eager"], backend_kernels=[CUTE])["per_mode"]
    graph = summary["graph"]["backends"][CUTE]
    assert (graph["median_ratio_fla_over"], graph["min_ratio_fla_over"]) == (2.0, 1.0)
    assert (graph["median_ratio_kdabench_over"], graph["min_ratio_kdabench_over"]) == (1.0, 0.5)
    assert graph["ratio_kdabench_over_by_shape"] == {"a": 1.5, "b": 0.5}
    assert graph["median_to_floor"] == 2.0
    assert summary["eager"]["backends"][CUTE]["median_ratio_fla_over"] is None
    assert "backends" not in summarize(cases, ["graph"])["per_mode"]["graph"]


def test_a_second_backend_is_timed_on_the_same_inputs(tmp_path, tiny):
    backend = FakeBackend()
    result = run_fake(tmp_path, tiny, backend=backend, backends=["triton", "cute"])
    assert result.ok and verify_file(result.receipt_path).ok
    assert backend.backends == [["triton", "cute"]] * 2
    receipt = load_receipt(result.receipt_path)
    config = receipt["config"]
    assert config["backends"] == ["triton", "cute"]
    assert config["backend_kernels"] == {"triton": KDABENCH, "cute": CUTE}
    assert config["kernels"] == [FLA, KDABENCH, KDABENCH_C1, CUTE]
    first, _ = receipt["cases"]
    scale = 64 / 1024
    for mode, ms in (("eager", 0.16), ("graph", 0.05)):
        entry = first["modes"][mode][CUTE]
        assert entry["median_ms"] == pytest.approx(ms * scale) and len(entry["samples_ms"]) == 11
        assert entry["to_floor"] == pytest.approx(ms * scale / first["floor_ms"])
    assert first["backend_ratios"] == {CUTE: {
        "ratio_fla_over": {"eager": pytest.approx(2.5), "graph": pytest.approx(4.0)},
        "ratio_kdabench_over": {"eager": pytest.approx(1.25), "graph": pytest.approx(1.6)}}}
    assert first["ratio_fla_over_kdabench"]["graph"] == pytest.approx(2.5)  # unchanged
    assert first["kernel_configs"][CUTE]["config_source"] == CUTE_SOURCE
    assert first["kernel_configs"][CUTE]["kernel_config"]["backend"] == "cute"
    assert first["sanity"]["backend_output"] == {CUTE: 0.0}
    assert first["sanity"]["backend_final_state"] == {CUTE: 0.0}
    graph = config["bench_summary"]["per_mode"]["graph"]["backends"][CUTE]
    assert graph["median_ratio_fla_over"] == pytest.approx(4.0)
    assert graph["median_ratio_kdabench_over"] == pytest.approx(1.6)
    assert set(graph["ratio_fla_over_by_shape"]) == {"64x1x(2x32)/long-memory",
                                                      "128x2x1/long-memory"}
    shown = result.to_dict()
    assert shown["backends"] == ["triton", "cute"]
    assert shown["shapes"][0]["backend_ratios"][CUTE]["ratio_fla_over"]["graph"] == \
        pytest.approx(4.0)
    assert shown["shapes"][0]["config_sources"][CUTE] == CUTE_SOURCE
    assert CUTE in {p.kernel for p in bench_points(first)} and len(result.plots) == 2
    report = build_report([result.receipt_path], tmp_path / "report")
    assert f"{CUTE} (ms)" in report.markdown_path.read_text()


def test_one_backend_has_no_backend_columns(tmp_path, tiny):
    backend = FakeBackend()
    result = run_fake(tmp_path, tiny, backend=backend, plot=False)
    assert backend.backends == [["auto"]] * 2  # the default: what kda_prefill runs
    receipt = load_receipt(result.receipt_path)
    assert receipt["config"]["backends"] == ["auto"]
    assert receipt["config"]["backend_kernels"] == {"auto": KDABENCH}
    # each case says which backend "auto" resolved to for its shape
    assert [case["kernel_configs"][KDABENCH]["backend"] for case in receipt["cases"]] == \
        ["cute", "triton"]
    case = receipt["cases"][0]
    assert "backend_ratios" not in case and case["sanity"]["backend_output"] == {}
    assert "backends" not in receipt["config"]["bench_summary"]["per_mode"]["graph"]


def test_the_first_backend_listed_owns_the_kdabench_columns(tmp_path, tiny):
    bench = Bench(tiny, backend=FakeBackend(), out_dir=tmp_path, backends=["cute", "triton",
                                                                          "cute"])
    assert bench.backends == ["cute", "triton"]
    assert bench.kernels == [FLA, KDABENCH, KDABENCH_C1, "kdabench-triton"]


def test_a_backend_whose_output_differs_fails_the_case(tmp_path, tiny):
    result = run_fake(tmp_path, tiny, backend=FakeBackend(backend_error=0.2), plot=False,
                      backends=["triton", "cute"])
    assert {c["verdict"] for c in result.cases} == {"fail"}
    assert result.cases[0]["sanity"]["backend_output"][CUTE] == pytest.approx(0.2, rel=1e-3)
    assert f"{CUTE} output differs from kdabench's by 0.2" in result.cases[0]["message"]


def test_a_cute_key_split_is_a_backend_of_its_own(tmp_path, tiny):
    """--backends cute-s<N>: the cute backend with its key split pinned, a column of its own."""
    from kdabench.kernel_records import backend_and_config
    from kdabench.kernels.config import CuteConfig

    assert backend_and_config("cute-s2") == ("cute", CuteConfig(key_split=2))
    assert backend_and_config("cute-wgmma") == ("cute", CuteConfig(algorithm="wgmma"))
    assert backend_and_config("cute") == ("cute", None)
    assert backend_and_config("triton") == ("triton", None)
    backend = FakeBackend()
    result = run_fake(tmp_path, tiny, backend=backend, backends=["triton", "cute-s1", "cute-s4"])
    assert result.ok and backend.backends == [["triton", "cute-s1", "cute-s4"]] * 2
    config = load_receipt(result.receipt_path)["config"]
    assert config["backend_kernels"] == {"triton": KDABENCH, "cute-s1": "kdabench-cute-s1",
                                         "cute-s4": "kdabench-cute-s4"}


@pytest.mark.parametrize("backends, fragment", [
    (["triton", "metal"], "'metal'"), (["Cute"], "'Cute'"), ([], "got nothing"),
    (["cute-s3"], "'cute-s3'"),
], ids=["unknown", "case", "none", "split"])
def test_an_unknown_backend_is_refused(tiny, backends, fragment):
    with pytest.raises(BenchError, match="--backends takes a comma-separated list of auto, triton, "
                       "cute") as caught:
        Bench(tiny, backend=FakeBackend(), backends=backends)
    assert fragment in str(caught.value)


def test_a_backend_that_cannot_run_is_refused_before_any_shape(tmp_path, tiny):
    reason = "cannot plan this KDA prefill: no ahead-of-time build for sm_90a"
    backend = FakeBackend(backend_reasons={"cute": reason})
    with pytest.raises(BenchError, match=f"--backends cute: {reason}"):
        Bench(tiny, backend=backend, out_dir=tmp_path, backends=["triton", "cute"])
    assert backend.backends == [] and not list(tmp_path.iterdir())
    assert Bench(tiny, backend=backend, out_dir=tmp_path).backends == ["auto"]


def test_cuda_backend_asks_the_kernels_whether_a_backend_can_plan(monkeypatch, tiny):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    reason = bench_cuda.CudaBackend().backend_unavailable("cute", tiny)
    assert reason == "cannot plan this KDA prefill: no CUDA device is available"


@pytest.mark.skipif(torch.cuda.is_available(), reason="plans on the CPU")
def test_kdabench_runs_plan_on_the_backend_asked_for():
    from kdabench import kernels
    from kdabench.inputs import make_inputs

    shape = BenchShape(64, 1, 2)
    sets = [make_inputs(shape.lengths, 1, 64, seed=5)]
    with pytest.raises(kernels.KdaConfigError, match="cute backend runs on CUDA devices only"):
        bench_cuda.kdabench_runs(kernels, sets, shape, 4, torch.device("cpu"), backend="cute")


@pytest.mark.gpu
def test_cuda_backend_binds_a_further_backend_on_the_same_inputs(tiny):
    backend = bench_cuda.CudaBackend()
    reason = backend.backend_unavailable("cute", tiny)
    if reason:
        pytest.skip(reason)
    prepared = backend.prepare(tiny.shapes[0], tiny, [KDABENCH, CUTE], ["eager", "graph"],
                               gates=GateRegime(LONG_MEMORY, LONG_MEMORY), policy_mode="AUTO",
                               backends=["triton", "cute"])
    try:
        resolved = prepared.details["kernel_configs"]
        assert resolved[CUTE]["config_source"].startswith("cute backend, ")
        assert resolved[CUTE]["kernel_config"]["backend"] == "cute"
        calls = prepared.calls[CUTE]
        assert calls.graph is not None and "replay checked" in calls.graph_note
        outputs = prepared.outputs()
        assert relative_error(outputs.output[CUTE], outputs.output[KDABENCH]) < 1e-2
        assert not prepared.check()
    finally:
        prepared.release()


# --------------------------------------------------------------------------- breakdown


def test_each_kernel_of_each_shape_gets_its_breakdown(tmp_path, tiny):
    result = run_fake(tmp_path, tiny, breakdown=5, plot=False)
    assert result.ok and verify_file(result.receipt_path).ok
    assert result.receipt["config"]["breakdown_calls"] == 5
    assert "breakdown" in result.receipt["config"]["definitions"]
    case = result.cases[0]
    assert set(case["breakdown"]) == {FLA, KDABENCH, KDABENCH_C1}
    found = case["breakdown"][KDABENCH]
    nominal_us = 0.20 * 64 / 1024 * 1000  # the fake's eager kdabench call at 64 x 1
    assert found["calls"] == 5
    assert found["gpu_us"] == pytest.approx(nominal_us, abs=1e-3)
    assert list(found["kernels_us"]) == ["kda_state_pass_kernel",
                                         "void at::native::cast_kernel<4, float>(int)"]
    assert found["kernels_us"]["kda_state_pass_kernel"] == pytest.approx(0.7 * nominal_us,
                                                                          abs=1e-3)
    shapes = result.to_dict()["shapes"]
    assert shapes[0]["breakdown"][KDABENCH] == found


def test_no_breakdown_by_default(tmp_path, tiny):
    result = run_fake(tmp_path, tiny, plot=False)
    assert result.receipt["config"]["breakdown_calls"] == 0
    assert all("breakdown" not in case for case in result.cases)


def test_a_breakdown_needs_a_profiler_and_a_count(tiny):
    backend = FakeBackend()
    backend.profiler = None
    with pytest.raises(BenchError, match="--breakdown needs a backend with a kernel profiler"):
        Bench(tiny, backend=backend, breakdown=3)
    with pytest.raises(BenchError, match="--breakdown must be >= 0"):
        Bench(tiny, backend=FakeBackend(), breakdown=-1)


def test_record_orders_kernels_and_sums_them():
    record = breakdown_record({"small": 1.0, "large": 3.0004, "middle": 2.0}, 10)
    assert record == {"calls": 10, "gpu_us": 6.0,
                      "kernels_us": {"large": 3.0, "middle": 2.0, "small": 1.0}}


@pytest.mark.parametrize("name, short", [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::Cast>(int, float*)",
     "vectorized_elementwise_kernel"),
    ("kda_chunk_prepare_kernel", "kda_chunk_prepare_kernel"),
    ("chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
     "chunk_gated_delta_rule_fwd_kernel_h_blockdim64"),
    ("void cutlass::Kernel2<cutlass_80_tensorop>(Params)", "Kernel2"),
])
def test_short_kernel_names(name, short):
    assert short_kernel_name(name) == short


def test_line_names_the_largest_kernels_and_sums_the_rest():
    record = breakdown_record({f"k{i}": float(10 - i) for i in range(8)}, 3)
    assert breakdown_line(record, shown=2) == "52 us: k0 10, k1 9, 6 more 33"
    # a receipt read back has its keys in canonical (alphabetical) order: still largest first
    reordered = {**record, "kernels_us": dict(sorted(record["kernels_us"].items(),
                                                     key=lambda item: item[1]))}
    assert breakdown_line(reordered, shown=2) == "52 us: k0 10, k1 9, 6 more 33"


@pytest.mark.gpu
def test_cuda_profiler_names_the_gpu_kernels_of_a_call():
    from kdabench.bench import cuda_kernel_profiler

    a = torch.randn(512, 512, device="cuda")
    found = cuda_kernel_profiler([lambda: a @ a, lambda: a + a], 4)
    assert len(found) >= 2 and all(us > 0 for us in found.values())  # a matmul, an add
    assert any("elementwise" in name for name in found)
    with pytest.raises(ValueError, match="nothing to profile"):
        cuda_kernel_profiler([], 4)


# --------------------------------------------------------------------------- shards and merging

THREE_SHAPES = TINY_SHAPES + """
[[shape]]
tokens = 256
heads = 1
"""


class SlowCopyBackend(FakeBackend):
    """The fake with a copy bandwidth of its own, as a second shard's run would measure."""

    def ceilings(self):
        return Ceilings(3.0e12, 6.0e14, {"copy": {"samples_ms": [1.3]}})


@pytest.fixture
def three() -> object:
    return parse_shapes(THREE_SHAPES, origin="three.toml")


def without_wall_time(cases):
    return [{k: v for k, v in case.items() if k != "wall_s"} for case in cases]


def test_a_shard_runs_its_shapes_with_their_positions(tmp_path, three):
    first = run_fake(tmp_path, three, shard=(1, 2), plot=False)
    second = run_fake(tmp_path, three, shard=(2, 2), plot=False)
    assert [(c["index"], c["shape"]) for c in first.cases] == [(0, "64x1x(2x32)"),
                                                                (2, "256x1x1")]
    assert [(c["index"], c["shape"]) for c in second.cases] == [(1, "128x2x1")]
    assert first.receipt["config"]["shard"] == "1/2"
    assert second.receipt["config"]["bench_summary"]["shapes"] == 1
    assert first.receipt_path.name.endswith("-shard1of2.json")
    whole = run_fake(tmp_path, three, plot=False)
    assert [c["index"] for c in whole.cases] == [0, 1, 2]
    assert "shard" not in whole.receipt["config"]


@pytest.mark.parametrize("shard, fragment", [
    ((0, 2), "I must lie in 1..N"), ((3, 2), "I must lie in 1..N"),
    ((3, 3), "selects no shape: the shapes file has 2"),
], ids=["zero", "past-n", "empty"])
def test_bad_shards_are_refused(tiny, shard, fragment):
    with pytest.raises(BenchError, match=fragment):
        Bench(tiny, backend=FakeBackend(), shard=shard)


def test_merged_shards_equal_one_unsharded_run(tmp_path, three):
    options = {"plot": False, "backends": ["triton", "cute"], "policy_mode": "AUTO",
               "baseline_policy": "HEURISTIC_ONLY"}
    whole = run_fake(tmp_path, three, **options).receipt
    first = run_fake(tmp_path, three, shard=(1, 2), **options).receipt
    second = run_fake(tmp_path, three, shard=(2, 2), **options).receipt
    merged = merge_bench_receipts([second, first], labels=["s2", "s1"],
                                  command_line=["kdabench", "merge"])
    assert merged["status"] == "complete" and merged["kind"] == "bench"
    assert verify_receipt(merged, current_sources=merged["sources"]).ok
    assert [c["index"] for c in merged["cases"]] == [0, 1, 2]
    assert without_wall_time(merged["cases"]) == without_wall_time(whole["cases"])
    assert merged["config"]["bench_summary"] == whole["config"]["bench_summary"]
    assert merged["config"]["bench_summary"]["per_mode"]["graph"]["backends"][CUTE]
    assert merged["summary"] == whole["summary"] and "shard" not in merged["config"]


def test_merge_keeps_each_shards_ceilings_and_summarizes_all_shapes(tmp_path, three):
    first = run_fake(tmp_path, three, shard=(1, 2), plot=False).receipt
    second = run_fake(tmp_path, three, shard=(2, 2), plot=False,
                      backend=SlowCopyBackend()).receipt
    merged = merge_bench_receipts([first, second])
    config = merged["config"]
    entries = config["merged_from"]
    assert [e["shard"] for e in entries] == ["1/2", "2/2"]
    assert [e["config"]["ceilings"]["copy_bytes_per_s"] for e in entries] == [4.0e12, 3.0e12]
    assert entries[1]["config"]["bench_summary"] == second["config"]["bench_summary"]
    assert config["ceilings"] == first["config"]["ceilings"]
    expected = summarize_by_gates(merged["cases"], ["eager", "graph"], [LONG_MEMORY])
    assert config["bench_summary"] == sanitize(expected)
    assert config["bench_summary"]["shapes"] == 3
    assert config["bench_summary"] != first["config"]["bench_summary"]


def test_shards_of_different_runs_do_not_merge(tmp_path, three):
    first = run_fake(tmp_path, three, shard=(1, 2), plot=False).receipt
    second = run_fake(tmp_path, three, shard=(2, 2), plot=False, reps=7).receipt
    with pytest.raises(ReceiptError, match="differing config keys: reps"):
        merge_bench_receipts([first, second])


def test_a_partial_shard_does_not_merge(tmp_path, three):
    first = run_fake(tmp_path, three, shard=(1, 2), plot=False).receipt
    bench = Bench(three, backend=FakeBackend(), out_dir=tmp_path / "cut", reps=3, warmup=0,
                  plot=False, shard=(2, 2))

    def interrupt(record):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bench.run(on_case=interrupt)
    [path] = (tmp_path / "cut").glob("*.json")
    with pytest.raises(ReceiptError, match="partial receipt"):
        merge_bench_receipts([first, load_receipt(path)])


def test_only_bench_receipts_merge_as_a_bench_run(tmp_path, three):
    shard = run_fake(tmp_path, three, shard=(1, 2), plot=False).receipt
    qualify = seal({**shard, "kind": "qualify"})
    with pytest.raises(ReceiptError, match="only bench receipts"):
        merge_bench_receipts([qualify])
