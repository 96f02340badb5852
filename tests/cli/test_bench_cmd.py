"""`kdabench bench` through click's CliRunner, with the fake backend of tests/test_bench.py
standing in for the CUDA one (deterministic timings on the CPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from kdabench.bench import cuda as bench_cuda
from kdabench.receipts import load_receipt, verify_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cli_helpers import assert_one_line_error, invoke
from test_bench import CUTE, CUTE_SOURCE, TINY_SHAPES, FakeBackend


@pytest.fixture
def shapes_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_SHAPES)
    return path


def use_backend(monkeypatch, **options) -> None:
    monkeypatch.setattr(bench_cuda, "CudaBackend", lambda: FakeBackend(**options))


def bench_json(folder: Path, shapes_file: Path, *args: str):
    """`kdabench bench --shapes FILE --out FOLDER ARGS --json` (exit 0 asserted): the result and
    its parsed JSON."""
    result = invoke("bench", "--shapes", shapes_file, "--out", folder, *args, "--json")
    assert result.exit_code == 0, result.output
    return result, json.loads(result.stdout)


def test_exit_2_without_a_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = invoke("bench", "--out", tmp_path)
    assert_one_line_error(result, 2, "needs a CUDA GPU")
    assert not list(tmp_path.iterdir())


def test_json_output(monkeypatch, tmp_path, shapes_file):
    use_backend(monkeypatch)
    _, found = bench_json(tmp_path / "out", shapes_file, "--reps", "7")
    assert found["ok"] and found["modes"] == ["eager", "graph"] and found["fla_skipped"] is None
    assert verify_file(found["receipt"]).ok
    assert found["gates"] == ["long-memory", "fast-decay"] and found["shape_set"] == "file"
    assert [s["id"] for s in found["shapes"]] == [
        "64x1x(2x32)/long-memory", "64x1x(2x32)/fast-decay", "128x2x1/long-memory",
        "128x2x1/fast-decay"]
    assert found["shapes"][1]["graph_checks"]["fla"]["problem"] is None
    graph = found["summary"]["per_mode"]["graph"]
    assert graph["median_ratio_fla_over_kdabench"] == pytest.approx(2.5)
    assert len(found["plots"]) == 4 and all(Path(p).exists() for p in found["plots"])


def test_table_output(monkeypatch, tmp_path, shapes_file):
    use_backend(monkeypatch)
    result = invoke("bench", "--shapes", shapes_file, "--out", tmp_path, "--no-plot")
    assert result.exit_code == 0, result.output
    assert "fla/kdabench" in result.stdout and "64x1x(2x32)" in result.stdout
    assert "graph: median fla/kdabench 2.50x" in result.stdout
    assert "graph · fast-decay: median fla/kdabench 2.50x" in result.stdout
    assert "long-memory" in result.stdout and "gates" in result.stdout
    assert "policy gain" not in result.stdout and "baseline" not in result.stdout
    assert not list(tmp_path.glob("*.png"))


def test_without_out_the_receipt_and_plots_go_to_the_working_folder(monkeypatch, tmp_path,
                                                                    shapes_file):
    use_backend(monkeypatch)
    monkeypatch.setenv("KDABENCH_OUT", str(tmp_path / "from-env"))
    monkeypatch.chdir(tmp_path)
    assert invoke("bench", "--shapes", shapes_file).exit_code == 0
    monkeypatch.delenv("KDABENCH_OUT")
    result = invoke("bench", "--shapes", shapes_file)
    assert result.exit_code == 0, result.output
    for folder in (tmp_path / "from-env", tmp_path / ".kdabench"):
        assert len(list(folder.glob("bench-*.json"))) == 1
        assert len(list(folder.glob("bench-*.png"))) == 4  # per mode and gate regime


def test_fla_absent_message(monkeypatch, tmp_path, shapes_file):
    use_backend(monkeypatch, fla_reason="fla is not installed (No module named 'fla')")
    result, found = bench_json(tmp_path, shapes_file)
    assert "fla comparison skipped: fla is not installed" in result.stderr
    assert found["fla_skipped"].startswith("fla is not installed")
    assert "fla" not in found["shapes"][0]["median_ms"]["graph"]


def test_sanity_failure_exits_1(monkeypatch, tmp_path, shapes_file):
    use_backend(monkeypatch, output_error=0.3)
    result = invoke("bench", "--shapes", shapes_file, "--out", tmp_path, "--no-plot")
    assert result.exit_code == 1, result.output
    assert "4 of 4 cases did not pass" in result.stderr
    assert list(tmp_path.glob("bench-*.json"))  # the receipt is still written


@pytest.mark.parametrize("args, fragment", [
    (["--modes", "eager,fast"], "--modes"),
    (["--reps", "0"], "--reps"),
    (["--against", "flash"], "flash"),
], ids=["modes", "reps", "against"])
def test_bad_options_exit_2(monkeypatch, tmp_path, shapes_file, args, fragment):
    use_backend(monkeypatch)
    result = invoke("bench", "--shapes", shapes_file, "--out", tmp_path, *args)
    assert_one_line_error(result, 2, fragment)


def test_bad_shapes_file_exits_2(monkeypatch, tmp_path):
    use_backend(monkeypatch)
    bad = tmp_path / "bad.toml"
    bad.write_text('schema = "kdabench.bench-shapes.v1"\n[[shape]]\ntokens = 100\nheads = 1\n'
                   'seqs = 3\n')
    assert_one_line_error(invoke("bench", "--shapes", bad), 2, "does not divide")
    assert_one_line_error(invoke("bench", "--shapes", tmp_path / "absent.toml"), 2,
                          "no such shapes file")


def test_help_documents_exit_codes():
    result = invoke("bench", "--help")
    assert result.exit_code == 0 and "Exit codes" in result.output and "--against" in result.output
    assert "--baseline-policy" in result.output and "policy gain" in result.output
    assert "--backends" in result.output and "triton,cute" in result.output
    assert "$KDABENCH_OUT" in result.output and "KDABENCH_RESULTS" not in result.output


def test_policy_mode_option(monkeypatch, tmp_path, shapes_file):
    use_backend(monkeypatch)
    _, found = bench_json(tmp_path, shapes_file, "--no-plot", "--policy-mode", "HEURISTIC_ONLY")
    assert found["policy_mode"] == "HEURISTIC_ONLY"
    assert found["shapes"][0]["config_sources"] == {"kdabench": "fake (HEURISTIC_ONLY)",
                                                    "kdabench-c1": "fake (HEURISTIC_ONLY)"}
    table = invoke("bench", "--shapes", shapes_file, "--out", tmp_path, "--no-plot",
                   "--policy-mode", "auto")
    assert table.exit_code == 0, table.output
    assert "policy AUTO: kernel configs 8 from fake" in table.stdout
    assert "policy AUTO" in table.stderr  # the header line


def test_bad_policy_mode_exits_2(monkeypatch, tmp_path, shapes_file):
    use_backend(monkeypatch)
    result = invoke("bench", "--shapes", shapes_file, "--out", tmp_path, "--policy-mode", "best")
    assert_one_line_error(result, 2, "--policy-mode", "'best' is not a policy mode")
    assert not list(tmp_path.glob("bench-*.json"))


def test_baseline_policy_option(monkeypatch, tmp_path, shapes_file):
    monkeypatch.delenv("KDABENCH_POLICY_MODE", raising=False)
    use_backend(monkeypatch)
    _, found = bench_json(tmp_path, shapes_file, "--no-plot", "--baseline-policy",
                          "heuristic_only")
    assert (found["policy_mode"], found["baseline_policy"]) == ("AUTO", "HEURISTIC_ONLY")
    assert found["shapes"][0]["policy_gain"]["graph"] == pytest.approx(0.10 / 0.08)
    assert found["shapes"][0]["median_ms"]["graph"]["kdabench-baseline"] > 0
    assert found["summary"]["per_mode"]["eager"]["median_policy_gain"] == pytest.approx(1.2)
    assert found["summary"]["same_config_shapes"] == 2  # 64x1x(2x32) under both regimes
    table = invoke("bench", "--shapes", shapes_file, "--out", tmp_path, "--no-plot",
                   "--baseline-policy", "HEURISTIC_ONLY")
    assert table.exit_code == 0, table.output
    assert "policy gain" in table.stdout and "1.25x*" in table.stdout
    assert ("graph: policy AUTO vs HEURISTIC_ONLY: median 1.25x, min 1.25x, 2 of 4 cases "
            "share a config") in table.stdout
    assert "policy AUTO: kernel configs 8 from fake" in table.stdout
    assert "baseline HEURISTIC_ONLY: kernel configs 4 from fake" in table.stdout
    assert "policy AUTO (baseline HEURISTIC_ONLY)" in table.stderr  # the header line


@pytest.mark.parametrize("args, env, fragments", [
    (["--baseline-policy", "auto"], None, ["--baseline-policy AUTO is the run's policy mode"]),
    (["--policy-mode", "heuristic_only", "--baseline-policy", "HEURISTIC-ONLY"], None,
     ["--baseline-policy HEURISTIC_ONLY is the run's policy mode"]),
    (["--baseline-policy", "Preplanned_Only"], "PREPLANNED_ONLY",
     ["--baseline-policy PREPLANNED_ONLY", "$KDABENCH_POLICY_MODE"]),
    (["--baseline-policy", "best"], None, ["--baseline-policy", "'best' is not a policy mode"]),
], ids=["default-auto", "same-as-option", "same-as-env", "unknown"])
def test_bad_baseline_policy_exits_2(monkeypatch, tmp_path, shapes_file, args, env, fragments):
    if env is None:
        monkeypatch.delenv("KDABENCH_POLICY_MODE", raising=False)
    else:
        monkeypatch.setenv("KDABENCH_POLICY_MODE", env)
    use_backend(monkeypatch)
    result = invoke("bench", "--shapes", shapes_file, "--out", tmp_path, *args)
    assert_one_line_error(result, 2, *fragments)
    assert not list(tmp_path.glob("bench-*.json"))


def test_backends_option_json(monkeypatch, tmp_path, shapes_file):
    use_backend(monkeypatch)
    result, found = bench_json(tmp_path, shapes_file, "--no-plot", "--backends", "triton, cute")
    assert found["ok"] and found["backends"] == ["triton", "cute"]
    shape = found["shapes"][0]
    assert shape["median_ms"]["graph"][CUTE] > 0
    assert shape["backend_ratios"][CUTE]["ratio_kdabench_over"]["graph"] == pytest.approx(1.6)
    assert shape["config_sources"][CUTE] == CUTE_SOURCE
    graph = found["summary"]["per_mode"]["graph"]["backends"][CUTE]
    assert graph["median_ratio_fla_over"] == pytest.approx(4.0)
    assert "backends triton, cute" in result.stderr  # the header line


def test_backends_option_table(monkeypatch, tmp_path, shapes_file):
    use_backend(monkeypatch)
    result = invoke("bench", "--shapes", shapes_file, "--out", tmp_path, "--no-plot",
                    "--backends", "triton,cute")
    assert result.exit_code == 0, result.output
    for column in ("fla/kdabench", "cute ms", "fla/cute", "triton/cute", "cute err"):
        assert column in result.stdout
    assert "graph: median fla/kdabench 2.50x" in result.stdout
    assert ("graph: cute backend: median fla/cute 4.00x (min 4.00x) · median triton/cute "
            "1.60x (min 1.60x)") in result.stdout
    assert "policy AUTO: kernel configs 8 from fake" in result.stdout
    assert "backend cute: kernel configs 4 from cute backend, aot fake/sm_90a" in result.stdout


def test_default_backend_adds_no_column(monkeypatch, tmp_path, shapes_file):
    use_backend(monkeypatch)
    result = invoke("bench", "--shapes", shapes_file, "--out", tmp_path, "--no-plot")
    assert result.exit_code == 0, result.output
    assert "kdabench-cute" not in result.stdout and "backends auto ·" in result.stderr
    # "auto" picks per shape (the fake profile: the CuTe backend at 64 tokens, else Triton)
    rows = [line.split() for line in result.stdout.splitlines() if line.lstrip()[:2] in
            ("64", "12")]
    assert [row[3] for row in rows if row[2] == "eager"] == ["cute", "cute", "triton", "triton"]
    assert "policy AUTO: kernel configs 8 from fake (4 on cute, 4 on triton)" in result.stdout


@pytest.mark.parametrize("text, fragment", [
    ("triton,metal", "'metal'"), (",", "got nothing"),
], ids=["unknown", "empty"])
def test_bad_backends_exit_2(monkeypatch, tmp_path, shapes_file, text, fragment):
    use_backend(monkeypatch)
    result = invoke("bench", "--shapes", shapes_file, "--out", tmp_path, "--backends", text)
    assert_one_line_error(result, 2, "--backends takes a comma-separated list of auto, triton, cute",
                          fragment)
    assert not list(tmp_path.glob("bench-*.json"))


def test_a_backend_that_cannot_run_exits_2_before_any_shape(monkeypatch, tmp_path, shapes_file):
    reason = "cannot plan this KDA prefill: the CuTe DSL is not installed"
    use_backend(monkeypatch, backend_reasons={"cute": reason})
    result = invoke("bench", "--shapes", shapes_file, "--out", tmp_path, "--backends",
                    "triton,cute")
    assert_one_line_error(result, 2, f"--backends cute: {reason}")
    assert not list(tmp_path.glob("bench-*.json"))


def test_breakdown_option(monkeypatch, tmp_path, shapes_file):
    use_backend(monkeypatch)
    result = invoke("bench", "--shapes", shapes_file, "--out", tmp_path, "--no-plot",
                    "--breakdown", "4")
    assert result.exit_code == 0, result.output
    assert "where the GPU time goes (microseconds per call, mean of 4 eager calls" in \
        result.stdout
    assert "64x1x(2x32)/fast-decay kdabench: 12 us: kda_state_pass_kernel 9, cast_kernel 4" in \
        result.stdout
    _, found = bench_json(tmp_path, shapes_file, "--no-plot", "--breakdown", "2")
    assert found["shapes"][0]["breakdown"]["kdabench"]["calls"] == 2
    refused = invoke("bench", "--shapes", shapes_file, "--out", tmp_path, "--breakdown", "-1")
    assert refused.exit_code == 2 and "--breakdown" in refused.output


def test_shard_option(monkeypatch, tmp_path, shapes_file):
    use_backend(monkeypatch)
    result, found = bench_json(tmp_path, shapes_file, "--no-plot", "--shard", "1/2")
    assert [s["shape"] for s in found["shapes"]] == ["64x1x(2x32)"] * 2
    receipt = load_receipt(found["receipt"])
    assert receipt["config"]["shard"] == "1/2"
    assert [c["index"] for c in receipt["cases"]] == [0, 1]
    assert "1 shapes (shard 1/2) x gates long-memory, fast-decay ·" in result.stderr


@pytest.mark.parametrize("text, fragment", [
    ("3/2", "I must lie in 1..N"), ("half", "is not I/N"),
    ("3/3", "selects no shape"),
], ids=["past-n", "not-a-shard", "empty"])
def test_bad_shard_exits_2(monkeypatch, tmp_path, shapes_file, text, fragment):
    use_backend(monkeypatch)
    result = invoke("bench", "--shapes", shapes_file, "--out", tmp_path, "--shard", text)
    assert_one_line_error(result, 2, fragment)
    assert not list(tmp_path.glob("bench-*.json"))


def bench_shards(monkeypatch, folder: Path, shapes_file: Path) -> list[Path]:
    """The receipts of `kdabench bench --shard 1/2` and `--shard 2/2`."""
    use_backend(monkeypatch)
    paths = []
    for shard in ("1/2", "2/2"):
        _, found = bench_json(folder, shapes_file, "--no-plot", "--reps", "5", "--shard", shard)
        paths.append(Path(found["receipt"]))
    return paths


def test_merge_joins_bench_shards_and_draws_the_plots(monkeypatch, tmp_path, shapes_file):
    shards = bench_shards(monkeypatch, tmp_path / "shards", shapes_file)
    out = tmp_path / "merged.json"
    result = invoke("merge", out, *reversed(shards))
    assert result.exit_code == 0, result.output
    assert "merged 2 bench shard receipt(s)" in result.stdout
    merged = load_receipt(out)
    assert verify_file(out).ok and merged["status"] == "complete"
    assert [c["index"] for c in merged["cases"]] == [0, 1, 2, 3]
    assert merged["config"]["bench_summary"]["shapes"] == 2
    assert merged["config"]["bench_summary"]["cases"] == 4
    plots = [tmp_path / f"merged-{mode}-{regime}.png" for mode in ("eager", "graph")
             for regime in ("long-memory", "fast-decay")]
    assert all(path.exists() for path in plots)
    assert f"plot {plots[0]}" in result.stdout
    found = json.loads(invoke("merge", "--force", "--json", out, *shards).stdout)
    assert found["plots"] == [str(path) for path in plots]


def test_merge_no_plot_draws_none(monkeypatch, tmp_path, shapes_file):
    shards = bench_shards(monkeypatch, tmp_path / "shards", shapes_file)
    result = invoke("merge", "--no-plot", "--json", tmp_path / "merged.json", *shards)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plots"] == []
    assert not list(tmp_path.rglob("*.png"))


def test_merge_a_plot_failure_keeps_the_receipt(monkeypatch, tmp_path, shapes_file):
    shards = bench_shards(monkeypatch, tmp_path / "shards", shapes_file)

    def broken(receipt, path):
        raise RuntimeError("no backend for matplotlib")

    monkeypatch.setattr("kdabench.bench.plots.plot_receipt", broken)
    out = tmp_path / "merged.json"
    result = invoke("merge", out, *shards)
    assert result.exit_code == 0, result.output
    assert "the plots were not drawn: RuntimeError: no backend for matplotlib" in result.stderr
    assert verify_file(out).ok


def quick_stand_in(monkeypatch, tmp_path: Path) -> list:
    """`load_shapes` answering every spec with the tiny shapes (named as the packaged set
    asked for), so --quick runs in a test; the specs asked for."""
    import dataclasses

    from kdabench import bench
    from kdabench.bench import SHAPE_SETS, parse_shapes

    asked = []

    def load_shapes(spec):
        asked.append(spec)
        tiny = parse_shapes(TINY_SHAPES, origin="tiny.toml")
        return dataclasses.replace(tiny, set_name=spec if spec in SHAPE_SETS else None)

    monkeypatch.setattr(bench, "load_shapes", load_shapes)
    return asked


def test_quick_is_graph_replay_20_reps_the_quick_set_and_both_regimes(monkeypatch, tmp_path):
    use_backend(monkeypatch)
    asked = quick_stand_in(monkeypatch, tmp_path)
    result = invoke("bench", "--quick", "--out", tmp_path, "--no-plot", "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert asked == ["quick"] and found["shape_set"] == "quick"
    assert found["modes"] == ["graph"] and found["gates"] == ["long-memory", "fast-decay"]
    receipt = load_receipt(found["receipt"])
    assert receipt["kind"] == "bench" and receipt["config"]["reps"] == 20
    assert receipt["config"]["kernels"][0] == "fla"
    assert all(len(c["modes"]["graph"]["kdabench"]["samples_ms"]) == 20
               for c in receipt["cases"])
    assert "bench · quick: 2 shapes x gates long-memory, fast-decay" in result.stderr
    mine = invoke("bench", "--quick", "--shapes", "mine.toml", "--modes", "eager,graph",
                  "--reps", "5", "--out", tmp_path, "--no-plot", "--json")
    assert mine.exit_code == 0, mine.output
    found = json.loads(mine.stdout)
    assert asked[-1] == "mine.toml" and found["shape_set"] == "file"
    assert found["modes"] == ["eager", "graph"]
    assert load_receipt(found["receipt"])["config"]["reps"] == 5


def test_shapes_takes_a_packaged_set_by_name(monkeypatch, tmp_path):
    use_backend(monkeypatch)
    asked = quick_stand_in(monkeypatch, tmp_path)
    result = invoke("bench", "--shapes", "quick", "--out", tmp_path, "--no-plot", "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert asked == ["quick"] and found["shape_set"] == "quick"
    assert found["modes"] == ["eager", "graph"]  # --shapes quick alone is not --quick
    assert load_receipt(found["receipt"])["config"]["reps"] == 100


def test_an_unknown_shape_set_exits_2(monkeypatch, tmp_path):
    use_backend(monkeypatch)
    assert_one_line_error(invoke("bench", "--shapes", "quik", "--out", tmp_path), 2,
                          "quik: no such shapes file, nor a packaged set (default, quick)")


def test_gates_option(monkeypatch, tmp_path, shapes_file):
    use_backend(monkeypatch)
    stats = tmp_path / "layer.json"
    stats.write_text(json.dumps({"schema": "kdabench.gate-stats.v1", "mean": [-0.2] * 64,
                                 "std": [0.1] * 64}))
    _, found = bench_json(tmp_path / "out", shapes_file, "--no-plot", "--gates",
                          f"fast-decay, {stats}")
    assert found["gates"] == ["fast-decay", "layer"]
    assert [s["id"] for s in found["shapes"]][:2] == ["64x1x(2x32)/fast-decay",
                                                      "64x1x(2x32)/layer"]
    config = load_receipt(found["receipt"])["config"]
    assert config["gates"][1]["file"] == "layer.json" and str(tmp_path) not in \
        json.dumps(config["gates"])
    table = invoke("bench", "--shapes", shapes_file, "--out", tmp_path / "out", "--no-plot",
                   "--gates", "fast-decay")
    assert table.exit_code == 0, table.output
    assert "fast-decay" in table.stdout and "long-memory" not in table.stdout
    assert "graph · fast-decay" not in table.stdout  # one regime: no per-regime lines


STATS = 'schema = "kdabench.gate-stats.v1"\nmean = [{mean}]\nstd = [1.0]\n'


@pytest.mark.parametrize("gates, text, fragment", [
    ("slow", None, "'slow' is neither a regime"),
    (",", None, "--gates takes a comma-separated list"),
    ("absent.toml", None, "no such gate-stats file"),
    ("bad.toml", STATS.format(mean="0.5"), "mean must be <= 0"),
    ("short.toml", STATS.format(mean="-0.5"), "1 channels, but the shapes have head_dim 64"),
], ids=["unknown", "empty", "absent", "positive-mean", "channels"])
def test_bad_gates_exit_2(monkeypatch, tmp_path, shapes_file, gates, text, fragment):
    use_backend(monkeypatch)
    if text is not None:
        (tmp_path / gates).write_text(text)
    if gates.endswith(".toml"):
        gates = str(tmp_path / gates)
    result = invoke("bench", "--shapes", shapes_file, "--out", tmp_path / "out", "--gates",
                    gates)
    assert_one_line_error(result, 2, fragment)
    assert not (tmp_path / "out").exists()


def test_help_explains_quick_and_gates():
    result = invoke("bench", "--help")
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for fragment in ("--quick", "under a minute on an H200",
                     "--shapes quick --modes graph --reps 20", "--gates", "fast-decay", "kdabench.gate-stats.v1",
                     "NAME|FILE", "replayed once per input set"):
        assert fragment in text, fragment
