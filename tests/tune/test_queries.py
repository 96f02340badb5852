"""The queries file of `kdabench tune`: the packaged default covers the bench, and every
mistake is one line naming the file and the key."""

from __future__ import annotations

import dataclasses

import pytest

from kdabench.bench import load_shapes
from kdabench.kernels import KernelConfig
from kdabench.tune import QueriesError, load_queries, parse_queries

HEAD = 'schema = "kdabench.tune-queries.v1"\n'
ONE = "[[query]]\ntokens = 64\nheads = 1\n"


def test_default_queries_cover_the_bench_shapes_at_capacity_4_and_1():
    queries = load_queries(None)
    bench = load_shapes(None)
    found = {(q.shape, q.capacity) for q in queries.queries}
    assert found == {(shape, capacity) for shape in bench.shapes for capacity in (4, 1)}
    for query in queries.queries:
        assert (query.head_dim, query.dtype, query.gate, query.lower_bound) == \
            (128, "bfloat16", "precomputed", -5.0)
    assert queries.origin == "default" and queries.grid["chunk_size"] == [16, 32, 64]
    assert set(queries.grid) <= {f.name for f in dataclasses.fields(KernelConfig)}
    ids = [q.id for q in queries.queries]
    assert ids[:2] == ["8192x8x1-C4-precomputed", "8192x8x1-C1-precomputed"]
    assert len({q.catalog_query() for q in queries.queries}) == len(ids) == 18


def test_packaged_segments_queries_time_the_serial_walk_beside_segments_on_few_programs():
    from importlib.resources import files

    path = files("kdabench") / "data" / "tune-segments.toml"
    queries = load_queries(str(path))
    assert queries.grid["segments"][0] == 1 and max(queries.grid["segments"]) == 16
    assert set(queries.grid["block_v"]) == {16, 32}
    shapes = {(q.shape.tokens, q.shape.heads, q.shape.seqs) for q in queries.queries}
    assert (65536, 4, 1) in shapes  # Kimi Linear's KDA heads over TP8
    assert all(heads * seqs <= 32 for _, heads, seqs in shapes)  # few programs only


def test_packaged_checkpoints_queries_time_both_checkpoint_paths_on_many_sequences():
    from importlib.resources import files

    path = files("kdabench") / "data" / "tune-checkpoints.toml"
    queries = load_queries(str(path))
    assert queries.grid["checkpoints"] == ["kernel", "pass"]
    assert all(q.shape.seqs >= 4 for q in queries.queries)
    assert {q.capacity for q in queries.queries} == {1, 4}


def test_defaults_of_an_almost_empty_file():
    queries = parse_queries(HEAD + ONE, origin="mine.toml")
    assert queries.timing == {"reps": 50, "warmup": 5, "min_gain": 0.03}
    assert queries.shortlist == 0
    assert queries.check == {"max_tokens": 1024, "max_seqs": 4,
                             "tolerances": {"output": 5e-3, "state": 3e-3}}
    assert queries.grid == {}
    assert [q.id for q in queries.queries] == ["64x1x1-C4-precomputed", "64x1x1-C1-precomputed"]


def test_expansion_over_gates_and_capacities():
    text = HEAD + 'gates = ["sigmoid", "softplus"]\ncapacities = [2]\ndtype = "float16"\n' + ONE
    queries = parse_queries(text)
    assert [q.id for q in queries.queries] == ["64x1x1-C2-sigmoid", "64x1x1-C2-softplus"]
    query = queries.queries[0].catalog_query()
    assert (query.dtype, query.capacity, query.token_bucket) == ("float16", 2, 64)


def test_check_instance_is_smaller():
    query = load_queries(None).queries[-1]  # 32768 tokens, 64 sequences of 512
    shape = query.check_shape(1024, 4)
    assert (shape.seqs, shape.seq_len, shape.heads) == (4, 256, 8)


@pytest.mark.parametrize("text, fragment", [
    ('schema = "other"\n' + ONE, "schema must be"),
    (HEAD + "colour = 1\n" + ONE, "unknown key(s) colour"),
    (HEAD, "no [[query]] entries"),
    (HEAD + "[[query]]\nheads = 1\n", "query 1: missing 'tokens'"),
    (HEAD + "[[query]]\ntokens = 100\nheads = 1\nseqs = 3\n", "seqs 3 does not divide"),
    (HEAD + "[[query]]\ntokens = 64\nheads = 1\nseqs = 4\n", "sequences of 16 tokens"),
    (HEAD + ONE + ONE, "64x1x1 is listed twice"),
    (HEAD + "[[query]]\ntokens = 60\nheads = 1\n" + ONE, "fall into the same catalog query"),
    (HEAD + "head_dim = 96\n" + ONE, "head_dim must be one of"),
    (HEAD + 'dtype = "int8"\n' + ONE, "dtype must be one of"),
    (HEAD + 'gates = ["relu"]\n' + ONE, "gates: ['relu'] not among"),
    (HEAD + "capacities = [3]\n" + ONE, "capacities: [3] not among"),
    (HEAD + "capacities = []\n" + ONE, "capacities must be a non-empty list"),
    (HEAD + "lower_bound = -6\n" + ONE, "lower_bound must be"),
    (HEAD + "[timing]\nreps = 0\n" + ONE, "timing.reps must be an integer >= 1"),
    (HEAD + "[timing]\nrepeats = 3\n" + ONE, "[timing]: unknown key(s) repeats"),
    (HEAD + "[timing]\nmin_gain = 1.5\n" + ONE, "timing.min_gain must be a number in [0, 1)"),
    (HEAD + "shortlist = -1\n" + ONE, "shortlist must be an integer >= 0"),
    (HEAD + "[check]\nmax_tokens = 8\n" + ONE, "check.max_tokens must be an integer >= 32"),
    (HEAD + "[check]\ntolerances = { output = -1 }\n" + ONE, "check.tolerances.output must"),
    (HEAD + "[grid]\nblock_size = [32]\n" + ONE, "[grid]: unknown key(s) block_size"),
    (HEAD + '[grid]\nnum_warps = ["4"]\n' + ONE, "grid.num_warps: ['4'] are not of"),
    (HEAD + "[grid]\nnum_warps = []\n" + ONE, "grid.num_warps must be a non-empty list"),
    (HEAD + "[[query]\n", "TOML syntax error"),
], ids=["schema", "unknown-top", "no-queries", "missing-tokens", "seqs-divide", "short",
        "duplicate", "same-bucket", "head-dim", "dtype", "gate", "capacity", "no-capacity",
        "lower-bound", "reps", "timing-key", "min-gain", "shortlist", "check-tokens", "tolerance", "grid-field",
        "grid-type", "grid-empty", "syntax"])
def test_queries_file_errors(text, fragment):
    with pytest.raises(QueriesError) as caught:
        parse_queries(text, origin="mine.toml")
    message = str(caught.value)
    assert fragment in message and message.startswith("mine.toml: ") and "\n" not in message


def test_missing_queries_file(tmp_path):
    with pytest.raises(QueriesError, match="no such queries file"):
        load_queries(tmp_path / "absent.toml")
