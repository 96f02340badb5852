"""The qualification matrix: loading (and its errors), expansion, coverage, sharding."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdabench.matrix import (
    AXES,
    FAULT_VARIANTS,
    INVALID_FOURTH_VARIANTS,
    SCENARIOS,
    MatrixError,
    load_matrix,
    parse_matrix,
    parse_shard,
    select_cases,
)

HEADER = 'schema = "kdabench.matrix.v1"\nname = "tiny"\n[layouts.R3]\nlengths = [5, 16, 17]\n'
GROUP = '[[group]]\nscenario = "accuracy"\ntiers = ["cpu"]\nlayout = "R3"\n'


def tiny(extra: str = "", group: str = GROUP) -> str:
    return HEADER + group + extra


@pytest.fixture(scope="module")
def default():
    return load_matrix()


@pytest.fixture(scope="module")
def gpu_cases(default):
    return default.expand("gpu")


@pytest.fixture(scope="module")
def cpu_cases(default):
    return default.expand("cpu")


# --------------------------------------------------------------------------- loading errors


@pytest.mark.parametrize(("text", "fragments"), [
    (HEADER + "[[group]\n", ["TOML syntax error", "line 5"]),
    ('name = "x"\n' + GROUP, ["no 'schema'", "kdabench.matrix.v1"]),
    (tiny("color = 3\n"), ["group 1 (accuracy)", "unknown axis 'color'", "capacity"]),
    (tiny(group=GROUP.replace("accuracy", "acuracy")), ["unknown scenario 'acuracy'", "accuracy"]),
    (tiny("capacity = [1, 3]\n"), ["capacity = 3 is not one of 1, 2, 4"]),
    (tiny("head_dim = 96\n"), ["head_dim = 96 is not one of 64, 128"]),
    (tiny("heads = 0\n"), ["heads = 0 is not an integer in 1..1024"]),
    (tiny("lower_bound = -6\n"), ["lower_bound = -6 is not a number in [-5, 0)"]),
    (tiny("gate = 'relu'\n"), ["gate = 'relu'", "precomputed, sigmoid, softplus"]),
    (tiny("offsets = 'middle'\n"), ["offsets = 'middle'", "aligned, unaligned, first, last"]),
    (tiny("qk_l2norm = 1\n"), ["qk_l2norm = 1 is not true or false"]),
    (tiny("capacity = []\n"), ["axis 'capacity' has an empty list"]),
    (tiny("heads = [2, 2]\n"), ["axis 'heads' repeats a value"]),
    (tiny(group=GROUP.replace('"R3"', '"R9"')), ["layout = 'R9'", "known: R3"]),
    (tiny(group=GROUP.replace('tiers = ["cpu"]', 'tiers = ["tpu"]')), ["tiers must be a list"]),
    (tiny(group=GROUP.replace('layout = "R3"\n', "")), ["needs a 'layout' axis"]),
    (tiny("variant = 'x'\n"), ["axis 'variant' does not apply to scenario 'accuracy'"]),
    (tiny("replays = 6\n"), ["unknown axis 'replays'"]),
    (tiny(group=GROUP.replace("accuracy", "graph")), ["runs on the GPU tier only"]),
    (tiny(group=GROUP.replace("accuracy", "fault") + 'variant = "offset-equal"\n'),
     ["fault 'offset-equal' needs capacity >= 2"]),
    (tiny(group=GROUP.replace("accuracy", "invalid-fourth") + 'variant = "negative"\n'),
     ["scenario 'invalid-fourth' takes capacity 4, got [1]"]),
    (HEADER.replace("[5, 16, 17]", "[5]") + GROUP.replace("accuracy", "fault")
     + 'variant = "duplicate-final"\n', ["needs a layout of two or more sequences"]),
    (tiny(GROUP), [("case 'accuracy-C1-H4-K64-R3-unaligned-precomputed-lb5' appears in "
                    "group 1 and again in group 2")]),
    (HEADER.replace("lengths = [5, 16, 17]", "lengths = [5, 0]") + GROUP,
     ["layout 'R3'", "lengths must be a list of integers >= 1"]),
    (HEADER.replace("lengths = [5, 16, 17]", "count = 4") + GROUP,
     ["layout 'R3'", "give random = [min, max]"]),
    (HEADER.replace("[layouts.R3]", "[layouts.R-3]") + GROUP, ["letters, digits and dots"]),
    ("colour = 1\n" + HEADER + GROUP, ["unknown top-level key(s) 'colour'"]),
    (HEADER, ["no [[group]] tables"]),
    (tiny("tolerances = { output = 2 }\n"), ["tolerance output must be a number in (0, 1)"]),
    (HEADER.replace('name = "tiny"', 'name = "tiny"\ntiming = { reps = 0 }') + GROUP,
     ["reps must be an integer in 1..1000"]),
])
def test_bad_matrices_get_one_clear_line(text: str, fragments: list[str]):
    with pytest.raises(MatrixError) as caught:
        parse_matrix(text, origin="mine.toml")
    message = str(caught.value)
    assert message.startswith("mine.toml: ")
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_missing_and_folder_paths(tmp_path):
    with pytest.raises(MatrixError, match="no such matrix file"):
        load_matrix(tmp_path / "absent.toml")
    with pytest.raises(MatrixError, match="is a folder"):
        load_matrix(tmp_path)


def test_a_user_file_loads_and_records_its_origin(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(tiny("capacity = [1, 2]\nheads = [1, 2]\n"))
    matrix = load_matrix(path)
    assert matrix.origin == str(path) and matrix.name == "tiny" and len(matrix.sha256) == 64
    cases = matrix.expand("cpu")
    assert [c.id for c in cases] == [
        "accuracy-C1-H1-K64-R3-unaligned-precomputed-lb5",
        "accuracy-C1-H2-K64-R3-unaligned-precomputed-lb5",
        "accuracy-C2-H1-K64-R3-unaligned-precomputed-lb5",
        "accuracy-C2-H2-K64-R3-unaligned-precomputed-lb5",
    ]
    assert [c.index for c in cases] == [0, 1, 2, 3]
    assert cases[0].lengths == (5, 16, 17)
    assert cases[0].options["tolerances"] == {"output": 5e-3, "state": 3e-3}
    assert matrix.expand("gpu") == []


def test_ids_carry_flags_and_group_tolerances():
    text = tiny('gate = "softplus"\nlower_bound = -1\nqk_l2norm = true\nbeta_sigmoid = true\n'
                'index_dtype = "int64"\nseed = 3\ntolerances = { state = 1e-3 }\n')
    (case,) = parse_matrix(text).expand("cpu")
    assert case.id == "accuracy-C1-H4-K64-R3-unaligned-softplus-lb1-l2-bsig-i64-s3"
    assert case.options["tolerances"] == {"output": 5e-3, "state": 1e-3}


def test_random_layout_fill_is_seeded():
    text = HEADER.replace("lengths = [5, 16, 17]",
                          "lengths = [1]\ncount = 20\nrandom = [3, 9]") + GROUP
    first, second = parse_matrix(text), parse_matrix(text)
    lengths = first.layouts["R3"]
    assert len(lengths) == 20 and lengths[0] == 1
    assert all(3 <= n <= 9 for n in lengths[1:])
    assert second.layouts["R3"] == lengths


# --------------------------------------------------------------------------- the default


def test_default_matrix_loads(default):
    assert default.origin == "default" and default.name == "default"
    assert default.backends == ("triton", "cute")
    assert default.tolerances == {"output": 5e-3, "state": 3e-3}


def test_gpu_tier_has_150_cases_covering_every_axis(default, gpu_cases):
    assert len(gpu_cases) >= 150
    kernel = [c for c in gpu_cases if "capacity" in c.params]
    assert {c.params["capacity"] for c in kernel} >= {1, 2, 4}
    assert {c.params["heads"] for c in kernel} >= {4, 8, 16, 32, 64}
    assert {c.params["head_dim"] for c in kernel} >= {64, 128}
    assert {c.params["offsets"] for c in kernel if "offsets" in c.params} >= {
        "aligned", "unaligned", "first", "last"}
    assert {c.params["gate"] for c in kernel} >= {"precomputed", "sigmoid", "softplus"}
    assert {c.params["lower_bound"] for c in kernel} >= {-5.0, -1.0}
    assert any(c.params["qk_l2norm"] for c in kernel)
    assert any(c.params["beta_sigmoid"] for c in kernel)
    assert {c.params.get("index_dtype") for c in kernel} >= {"int32", "int64"}
    # one long sequence up to 65536 tokens, ragged batches up to 64 sequences
    accuracy = [c for c in gpu_cases if c.scenario == "accuracy"]
    assert any(c.lengths == (65536,) for c in accuracy)
    ragged = max((c for c in accuracy), key=lambda c: len(c.lengths))
    assert len(ragged.lengths) == 64
    assert {15, 16, 17} <= set(ragged.lengths) and max(ragged.lengths) >= 1024
    # every scenario, every fault class and every bad fourth destination
    scenarios = Counter(c.scenario for c in gpu_cases)
    assert set(scenarios) == set(SCENARIOS) - {"mirror"}
    faults = {c.params["variant"] for c in gpu_cases if c.scenario == "fault"}
    assert faults == set(FAULT_VARIANTS)
    fourth = {c.params["variant"] for c in gpu_cases if c.scenario == "invalid-fourth"}
    assert fourth == set(INVALID_FOURTH_VARIANTS)
    assert all(c.params["capacity"] == 4 for c in gpu_cases if c.scenario == "invalid-fourth")
    graph = [c for c in gpu_cases if c.scenario == "graph"]
    assert {c.params["capacity"] for c in graph} == {1, 2, 4}
    assert all(c.options["replays"] >= 5 for c in graph)


def test_gpu_tier_keeps_the_float64_oracle_affordable(gpu_cases):
    """~60 us per token for the oracle: the GPU tier's tokens must stay near 2.5 M."""
    tokens = sum(sum(c.lengths) for c in gpu_cases if c.scenario != "graph")
    assert tokens < 3_000_000
    assert sum(1 for c in gpu_cases if sum(c.lengths) >= 32768) <= 2


def test_cpu_tier_uses_small_shapes(cpu_cases):
    assert 40 <= len(cpu_cases) <= 120
    kernel_calls = [c for c in cpu_cases if c.scenario not in ("mirror", "contract")]
    assert all(c.params.get("head_dim", 64) == 64 for c in cpu_cases)
    assert all(c.params.get("heads", 1) <= 2 for c in cpu_cases)
    assert all(sum(c.lengths) <= 100 for c in kernel_calls)
    assert {c.params["capacity"] for c in kernel_calls} == {1, 2, 4}
    assert {"accuracy", "prefix", "inactive", "fault", "invalid-fourth", "poisoned", "fuzz",
            "mirror", "contract"} <= {c.scenario for c in cpu_cases}


@pytest.mark.parametrize("tier", ["cpu", "gpu"])
def test_ids_are_unique_readable_and_indexed(default, tier):
    cases = default.expand(tier)
    assert len({c.id for c in cases}) == len(cases)
    assert [c.index for c in cases] == list(range(len(cases)))
    for case in cases:
        assert case.id.startswith(case.scenario)
        if "capacity" in case.params:
            assert re.search(rf"-C{case.params['capacity']}-H{case.params['heads']}-"
                             rf"K{case.params['head_dim']}(-|$)", case.id)
    assert "accuracy-C4-H8-K128-L65536x1-unaligned-precomputed-lb5" in {c.id for c in cases} \
        or tier == "cpu"


def test_expansion_is_deterministic(default):
    assert [c.id for c in load_matrix().expand("gpu")] == [c.id for c in default.expand("gpu")]


def test_every_axis_has_a_label():
    for name, axis in AXES.items():
        assert isinstance(axis.label(axis.default), str) or axis.default is None, name


# --------------------------------------------------------------------------- shards


@pytest.mark.parametrize(("text", "expected"), [("1/2", (1, 2)), (" 3 / 4 ", (3, 4)),
                                                ("1/1", (1, 1))])
def test_parse_shard(text, expected):
    assert parse_shard(text) == expected


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0", "", "-1/2"])
def test_parse_shard_refuses(text):
    with pytest.raises(MatrixError, match="shard"):
        parse_shard(text)


@pytest.mark.parametrize("shard", [(0, 2), (3, 2), (1, 0)])
def test_select_cases_refuses_a_shard_outside_1_to_n(gpu_cases, shard):
    """Python callers (Qualify, Bench) get the rule parse_shard applies to the CLI's text."""
    with pytest.raises(MatrixError, match=f"shard {shard[0]}/{shard[1]}: I must lie in 1..N"):
        select_cases(gpu_cases, shard=shard)


@given(count=st.integers(1, 9), size=st.integers(0, 60))
def test_shards_partition_the_cases(gpu_cases, count, size):
    cases = gpu_cases[:size]
    shards = [select_cases(cases, shard=(i, count)) for i in range(1, count + 1)]
    ids = [c.id for shard in shards for c in shard]
    assert sorted(ids) == sorted(c.id for c in cases)  # every case once
    sizes = [len(shard) for shard in shards]
    assert max(sizes) - min(sizes) <= 1
    for i, shard in enumerate(shards, start=1):
        assert all(c.index % count == i - 1 for c in shard)


def test_filter_keeps_matrix_indices(gpu_cases):
    chosen = select_cases(gpu_cases, contains="graph-")
    assert chosen and all("graph-" in c.id for c in chosen)
    assert [c.index for c in chosen] == [c.index for c in gpu_cases if "graph-" in c.id]
    both = select_cases(gpu_cases, shard=(2, 3), contains="fault")
    assert all(c.index % 3 == 1 and "fault" in c.id for c in both)
