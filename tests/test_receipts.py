"""Receipts: canonical hashing, verification, atomic and partial writes, shard merging."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from kdabench import receipts
from kdabench.receipts import (
    SCHEMA,
    ReceiptError,
    canonical_json,
    compute_hash,
    load_receipt,
    merge_receipts,
    missing_shards,
    new_receipt,
    receipt_filename,
    render_receipt,
    sanitize,
    summarize,
    verify_bytes,
    verify_file,
    verify_receipt,
)
from kdabench.receipts.write import portable_command_line
from kdabench.sources import source_hashes

H200 = {
    "kind": "cuda", "device": "cuda:0", "name": "NVIDIA H200", "compute_capability": "9.0",
    "sm_count": 132, "total_memory_bytes": 150_000_000_000, "uuid": "GPU-0",
    "driver_version": "580.159.04", "cuda_runtime_version": "13.0",
    "cpu_model": "Intel Xeon", "cpu_count": 16,
}
SOURCES = {"kernels/triton/prefill.py": "a" * 64, "oracles/recurrent.py": "b" * 64}
MATRIX = {"capacity": [1, 2, 4], "heads": [4, 8], "layout": "ragged — GB10 naïve"}
CREATED = "2026-12-02T16:24:05Z"


def make_builder(kind="qualify", *, config=None, sources=SOURCES, device=H200, **extra):
    return new_receipt(
        kind,
        config={"matrix": MATRIX} if config is None else config,
        command_line=["kdabench", "qualify", "--tier", "gpu"],
        device=device,
        sources=sources,
        created_at=CREATED,
        **extra,
    )


def matrix_cases(count=6):
    verdicts = ["pass", "pass", "fail", "skip", "error", "pass"]
    return [
        {
            "id": f"cap{1 << (i % 3)}-h{4 + 4 * (i % 2)}-n{i}",
            "index": i,
            "verdict": verdicts[i % len(verdicts)],
            "errors": {"o": 1.5e-3 * (i + 1), "state": 2.0e-3},
            "tolerances": {"o": 5e-3, "state": 5e-3},
            "samples_ms": [0.25 + 0.01 * j for j in range(5)],
            "median_ms": 0.27,
        }
        for i in range(count)
    ]


def sealed(cases=None, **kwargs):
    builder = make_builder(**kwargs)
    for case in matrix_cases() if cases is None else cases:
        builder.add_case(case)
    return builder.document()


# --------------------------------------------------------------------------- hashing


def test_document_has_every_field_and_a_hash_that_verifies():
    doc = sealed()
    assert set(doc) == {
        "schema", "kind", "tool_version", "created_at", "git", "sources", "device",
        "toolchain", "command_line", "config", "cases", "summary", "status", "sha256",
    }
    assert doc["schema"] == SCHEMA
    assert doc["status"] == "complete"
    assert doc["summary"] == {"total": 6, "pass": 3, "fail": 1, "error": 1, "skip": 1}
    assert doc["sha256"] == compute_hash(doc)
    check = verify_receipt(doc, current_sources=SOURCES)
    assert check.ok and check.hash_ok and check.sources_match and not check.partial
    assert check.problems == [] and check.warnings == []


def test_hash_does_not_depend_on_key_order():
    doc = sealed()
    reordered = {key: doc[key] for key in reversed(list(doc))}
    reordered["cases"] = [{k: case[k] for k in reversed(list(case))} for case in doc["cases"]]
    assert compute_hash(reordered) == doc["sha256"]
    assert canonical_json(reordered) == canonical_json(doc)
    assert verify_receipt(reordered, current_sources=SOURCES).ok


def test_hash_is_sha256_of_canonical_json():
    import hashlib

    doc = sealed()
    body = {key: value for key, value in doc.items() if key != "sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)
    assert doc["sha256"] == hashlib.sha256(text.encode("utf-8")).hexdigest()


EDITS = {
    "verdict": lambda d: d["cases"][2].__setitem__("verdict", "pass"),
    "sample": lambda d: d["cases"][0]["samples_ms"].__setitem__(1, 0.26000001),
    "error": lambda d: d["cases"][1]["errors"].__setitem__("o", 1e-9),
    "drop-case": lambda d: d["cases"].pop(),
    "add-field": lambda d: d["cases"][0].__setitem__("note", "x"),
    "config": lambda d: d["config"]["matrix"]["heads"].append(16),
    "source-hash": lambda d: d["sources"].__setitem__("oracles/recurrent.py", "c" * 64),
    "device": lambda d: d["device"].__setitem__("name", "NVIDIA H100"),
    "status": lambda d: d.__setitem__("status", "partial"),
    "created_at": lambda d: d.__setitem__("created_at", "2026-12-03T00:00:00Z"),
    "sha256": lambda d: d.__setitem__("sha256", "0" * 64),
}


@pytest.mark.parametrize("edit", list(EDITS), ids=list(EDITS))
def test_any_edited_value_fails_verify(edit):
    doc = sealed()
    tampered = copy.deepcopy(doc)
    EDITS[edit](tampered)
    check = verify_receipt(tampered, current_sources=SOURCES)
    assert not check.hash_ok
    assert not check.ok
    assert any("sha256 mismatch" in problem for problem in check.problems)


def test_flipping_any_single_byte_of_the_file_fails(tmp_path: Path):
    builder = make_builder()
    for case in matrix_cases():
        builder.add_case(case)
    raw = builder.write(tmp_path / "r.json").read_bytes()
    assert verify_bytes(raw, SOURCES).ok
    for position in range(len(raw)):
        flipped = bytearray(raw)
        flipped[position] ^= 0x01
        try:
            check = verify_bytes(bytes(flipped), SOURCES)
        except ReceiptError:
            continue  # no longer JSON or no longer a receipt: unreadable, which also fails
        assert not check.ok, f"byte {position} ({chr(raw[position])!r}) flipped, still verifies"


def test_whitespace_edit_keeps_the_hash_but_fails_the_file_check(tmp_path: Path):
    builder = make_builder()
    for case in matrix_cases():
        builder.add_case(case)
    path = builder.write(tmp_path / "r.json")
    raw = path.read_bytes()
    relaid = raw.replace(b'\n  "cases"', b'\n   "cases"', 1)
    assert relaid != raw
    check = verify_bytes(relaid, SOURCES)
    assert check.hash_ok
    assert check.bytes_ok is False
    assert not check.ok


def test_summary_must_match_cases():
    doc = sealed()
    doc["summary"]["pass"] += 1
    doc["sha256"] = compute_hash(doc)  # a consistent hash over an inconsistent summary
    check = verify_receipt(doc, current_sources=SOURCES)
    assert check.hash_ok and not check.summary_ok and not check.ok


def test_verify_reports_sources_that_differ_from_the_tree_in_hand():
    doc = sealed()
    current = dict(SOURCES)
    current["kernels/triton/prefill.py"] = "f" * 64
    current["kernels/cute/prefill.py"] = "e" * 64
    del current["oracles/recurrent.py"]
    check = verify_receipt(doc, current_sources=current)
    assert check.ok  # integrity holds; the source mismatch is reported, not a failure
    assert not check.sources_match
    assert check.sources.changed == ["kernels/triton/prefill.py"]
    assert check.sources.added == ["kernels/cute/prefill.py"]
    assert check.sources.missing == ["oracles/recurrent.py"]


# --------------------------------------------------------------------------- NaN


def test_sanitize_turns_non_finite_floats_into_strings():
    value = {"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": (1, "x", None, True)}
    assert sanitize(value) == {"a": "nan", "b": ["inf", "-inf", 1.5], "c": [1, "x", None, True]}


def test_sanitize_unwraps_numpy_scalars_and_paths():
    assert sanitize({"x": np.float32("nan"), "y": np.int64(3), "p": Path("/a/b")}) == {
        "x": "nan", "y": 3, "p": "/a/b",
    }


def test_sanitize_refuses_what_json_cannot_hold():
    with pytest.raises(TypeError, match="keys must be strings"):
        sanitize({1: "x"})
    with pytest.raises(TypeError, match="cannot store object"):
        sanitize({"x": object()})


def test_canonical_json_refuses_raw_nan():
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})


def test_nan_measurements_are_stored_as_strings_and_verify(tmp_path: Path):
    builder = make_builder()
    builder.add_case({
        "id": "poisoned-output", "verdict": "pass", "median_ms": math.nan,
        "errors": {"o": math.inf, "state": -math.inf}, "samples_ms": [1.0, math.nan],
    })
    path = builder.write(tmp_path / "r.json")
    text = path.read_text(encoding="utf-8")
    assert "NaN" not in text and "Infinity" not in text
    case = load_receipt(path)["cases"][0]
    assert case["median_ms"] == "nan"
    assert case["errors"] == {"o": "inf", "state": "-inf"}
    assert case["samples_ms"] == [1.0, "nan"]
    assert verify_file(path, SOURCES).ok


# --------------------------------------------------------------------------- building


def test_add_case_refuses_bad_cases():
    builder = make_builder()
    builder.add_case({"id": "a", "verdict": "pass"})
    with pytest.raises(ReceiptError, match="added twice"):
        builder.add_case({"id": "a", "verdict": "fail"})
    with pytest.raises(ReceiptError, match="verdict 'ok'"):
        builder.add_case({"id": "b", "verdict": "ok"})
    with pytest.raises(ReceiptError, match="'id'"):
        builder.add_case({"verdict": "pass"})
    assert [case["id"] for case in builder.cases] == ["a"]


def test_unknown_kind_and_status_are_refused():
    with pytest.raises(ReceiptError, match="unknown receipt kind 'benchmark'"):
        make_builder("benchmark")
    with pytest.raises(ReceiptError, match="status 'done'"):
        make_builder().document("done")


def test_summarize_counts_every_verdict():
    cases = [{"verdict": v} for v in ["pass", "pass", "skip"]]
    assert summarize(cases) == {"total": 3, "pass": 2, "fail": 0, "error": 0, "skip": 1}


def test_new_receipt_collects_the_environment():
    builder = new_receipt("bench", config={"shapes": [1]}, command_line=["kdabench"],
                          device="cpu")
    doc = builder.document()
    assert doc["kind"] == "bench"
    assert doc["tool_version"]
    assert doc["sources"] == source_hashes()
    assert doc["device"]["kind"] == "cpu"
    assert doc["toolchain"]["python"]
    assert set(doc["git"]) >= {"commit", "dirty"}
    assert doc["created_at"].endswith("Z")
    assert doc["command_line"] == ["kdabench"]


def test_receipt_file_name_convention():
    name = receipt_filename("qualify", H200, "2026-12-02T16:24:05Z")
    assert name == "qualify-nvidia-h200-20261202T162405.json"
    assert receipt_filename("serve-sweep", {"name": "NVIDIA GB10"}, "2026-01-02T03:04:05+00:00") \
        == "serve-sweep-nvidia-gb10-20260102T030405.json"
    assert receipt_filename("bench", {"name": "Intel(R) Xeon(R) 8480+"}, CREATED) \
        == "bench-intel-xeon-8480-20261202T162405.json"
    assert make_builder().filename() == "qualify-nvidia-h200-20261202T162405.json"


# --------------------------------------------------------------------------- writing


def test_atomic_write_leaves_only_the_receipt(tmp_path: Path):
    builder = make_builder()
    target = tmp_path / "deep" / "r.json"
    for case in matrix_cases():
        builder.add_case(case)
        builder.write(target, status="partial")
    builder.write(target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["r.json"]
    assert load_receipt(target)["status"] == "complete"
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_failed_replace_keeps_the_old_receipt_and_no_temp_file(tmp_path, monkeypatch):
    builder = make_builder()
    target = builder.write(tmp_path / "r.json", status="partial")
    before = target.read_bytes()

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(receipts.write.os, "replace", broken_replace)
    builder.add_case({"id": "late", "verdict": "pass"})
    with pytest.raises(OSError, match="disk full"):
        builder.write(target)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_writer_keeps_a_partial_receipt_current_and_completes(tmp_path: Path):
    target = tmp_path / "r.json"
    with make_builder().writer(target) as receipt:
        assert load_receipt(target)["status"] == "partial"
        for n, case in enumerate(matrix_cases(), start=1):
            receipt.add_case(case)
            on_disk = load_receipt(target)
            assert on_disk["status"] == "partial"
            assert len(on_disk["cases"]) == n
    final = load_receipt(target)
    assert final["status"] == "complete"
    assert len(final["cases"]) == 6
    assert verify_file(target, SOURCES).ok
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_writer_every_n_cases(tmp_path: Path):
    target = tmp_path / "r.json"
    with make_builder().writer(target, every=4) as receipt:
        for case in matrix_cases()[:3]:
            receipt.add_case(case)
        assert load_receipt(target)["cases"] == []
        receipt.add_case(matrix_cases()[3])
        assert len(load_receipt(target)["cases"]) == 4


@pytest.mark.parametrize("interruption", [RuntimeError, KeyboardInterrupt])
def test_interrupted_run_leaves_a_partial_receipt_that_verifies(tmp_path, interruption):
    target = tmp_path / "r.json"
    with pytest.raises(interruption), make_builder().writer(target, every=100) as receipt:
        for case in matrix_cases()[:3]:
            receipt.add_case(case)
        raise interruption("stopped mid-matrix")
    doc = load_receipt(target)
    assert doc["status"] == "partial"
    assert [case["id"] for case in doc["cases"]] == [c["id"] for c in matrix_cases()[:3]]
    check = verify_file(target, SOURCES)
    assert check.ok and check.partial
    assert any("partial" in warning for warning in check.warnings)
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


# --------------------------------------------------------------------------- reading


def test_load_receipt_round_trips(tmp_path: Path):
    builder = make_builder()
    for case in matrix_cases():
        builder.add_case(case)
    path = builder.write(tmp_path / builder.filename())
    assert load_receipt(path) == builder.document()
    assert path.read_bytes() == render_receipt(builder.document())


@pytest.mark.parametrize(
    "content, message",
    [
        (b"not json at all", "not valid JSON"),
        (b"[1, 2]", "a receipt is a JSON object"),
        (b'{"kind": "qualify"}', "no schema field"),
        (b'{"schema": "other.v9"}', "schema 'other.v9'"),
        (b'{"schema": "kdabench.receipt.v1", "kind": "qualify"}', "lacks field(s)"),
        (b'{"schema": "kdabench.receipt.v1", "x": NaN}', "NaN is not valid"),
        (b"\xff\xfe", "not UTF-8"),
    ],
    ids=["not-json", "not-object", "no-schema", "wrong-schema", "missing-fields", "nan",
         "binary"],
)
def test_load_receipt_rejects_what_is_not_a_receipt(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ReceiptError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_receipt(path)


def test_load_receipt_missing_file_and_folder(tmp_path: Path):
    with pytest.raises(ReceiptError, match="no such file"):
        load_receipt(tmp_path / "absent.json")
    with pytest.raises(ReceiptError, match="is a folder"):
        load_receipt(tmp_path)


def test_wrong_schema_of_a_real_receipt_is_refused(tmp_path: Path):
    doc = sealed()
    doc["schema"] = "kdabench.receipt.v0"
    path = tmp_path / "old.json"
    path.write_bytes(render_receipt(doc))
    with pytest.raises(ReceiptError, match=r"expected a kdabench.receipt.v1 receipt"):
        load_receipt(path)


# --------------------------------------------------------------------------- merging


def shard_receipts(count=2, cases=None, **kwargs):
    cases = matrix_cases() if cases is None else cases
    docs = []
    for shard in range(1, count + 1):
        builder = make_builder(config={"matrix": MATRIX, "shard": f"{shard}/{count}"}, **kwargs)
        # add in reverse to show that merge restores matrix order
        for case in reversed(cases[shard - 1::count]):
            builder.add_case(case)
        docs.append(builder.document())
    return docs


def test_merged_shards_equal_one_unsharded_run():
    single = sealed()
    merged = merge_receipts(shard_receipts(2), command_line=["kdabench", "merge"])
    assert merged["cases"] == single["cases"]
    assert [(c["id"], c["verdict"]) for c in merged["cases"]] == \
        [(c["id"], c["verdict"]) for c in single["cases"]]
    assert merged["summary"] == single["summary"]
    assert merged["status"] == "complete"
    assert verify_receipt(merged, current_sources=SOURCES).ok
    assert merged["config"]["matrix"] == MATRIX
    assert "shard" not in merged["config"]
    assert [entry["shard"] for entry in merged["config"]["merged_from"]] == ["1/2", "2/2"]
    assert missing_shards(merged) == []


def test_a_merged_receipt_names_no_machine_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outside = "/work/.device/4/results"
    merged = merge_receipts(
        shard_receipts(2), labels=[f"{outside}/a-shard1of2.json", str(tmp_path / "b.json")],
        command_line=["/work/venv/bin/kdabench", "merge", f"{outside}/a-shard1of2.json",
                      str(tmp_path / "b.json"), "--out", str(tmp_path / "results")])
    assert merged["command_line"] == ["kdabench", "merge", "a-shard1of2.json", "b.json",
                                      "--out", "results"]
    assert [entry["label"] for entry in merged["config"]["merged_from"]] == [
        "a-shard1of2.json", "b.json"]


def test_merge_orders_by_id_without_index():
    cases = [{"id": name, "verdict": "pass"} for name in ["c", "a", "d", "b"]]
    docs = shard_receipts(2, cases=cases)
    merged = merge_receipts(docs)
    assert [case["id"] for case in merged["cases"]] == ["a", "b", "c", "d"]


def test_merge_with_an_absent_shard_is_partial():
    docs = shard_receipts(3)
    merged = merge_receipts([docs[0], docs[2]])
    assert merged["status"] == "partial"
    assert missing_shards(merged) == ["2/3"]


def test_merge_refuses_receipts_of_different_kinds():
    qualify = shard_receipts(2)[0]
    bench = make_builder("bench", config={"matrix": MATRIX, "shard": "2/2"})
    bench.add_case({"id": "other", "verdict": "pass"})
    with pytest.raises(ReceiptError, match=r"'bench' receipt.*only receipts of one kind"):
        merge_receipts([qualify, bench.document()])


def test_merge_refuses_different_sources():
    first = shard_receipts(2)[0]
    other_sources = {**SOURCES, "kernels/triton/prefill.py": "d" * 64}
    second = shard_receipts(2, sources=other_sources)[1]
    with pytest.raises(ReceiptError, match=r"different kernel/oracle sources.*prefill.py"):
        merge_receipts([first, second])


def test_merge_refuses_different_matrix():
    first = shard_receipts(2)[0]
    builder = make_builder(config={"matrix": {**MATRIX, "heads": [64]}, "shard": "2/2"})
    builder.add_case({"id": "x", "verdict": "pass"})
    with pytest.raises(ReceiptError, match=r"different configurations.*matrix"):
        merge_receipts([first, builder.document()])


def test_run_local_keys_may_differ_and_are_kept_per_shard():
    first = make_builder(config={"matrix": MATRIX, "shard": "1/2", "rate": 1.0})
    first.add_case(matrix_cases()[0])
    second = make_builder(config={"matrix": MATRIX, "shard": "2/2", "rate": 2.0})
    second.add_case(matrix_cases()[1])
    docs = [first.document(), second.document()]
    with pytest.raises(ReceiptError, match=r"differing config keys: rate"):
        merge_receipts(docs)
    merged = merge_receipts(docs, run_local_keys=frozenset({"rate"}))
    assert merged["config"]["rate"] == 1.0 and merged["status"] == "complete"
    assert [e["config"] for e in merged["config"]["merged_from"]] == [{"rate": 1.0},
                                                                       {"rate": 2.0}]
    assert "config" not in merge_receipts(shard_receipts(2))["config"]["merged_from"][0]


def test_merge_refuses_a_different_device_model_but_not_another_unit():
    first = shard_receipts(2)[0]
    other_unit = shard_receipts(2, device={**H200, "device": "cuda:1", "uuid": "GPU-1"})[1]
    assert merge_receipts([first, other_unit])["status"] == "complete"
    other_model = shard_receipts(2, device={**H200, "name": "NVIDIA H100"})[1]
    with pytest.raises(ReceiptError, match=r"different devices.*name"):
        merge_receipts([first, other_model])


def test_merge_refuses_duplicate_case_ids():
    first = shard_receipts(2)[0]
    with pytest.raises(ReceiptError, match="appears in both"):
        merge_receipts([first, first], labels=["a.json", "b.json"])
    builder = make_builder(config={"matrix": MATRIX, "shard": "2/2"})
    builder.add_case(matrix_cases()[0])
    with pytest.raises(ReceiptError, match="appears in both shard 1 and shard 2"):
        merge_receipts([first, builder.document()])


def test_merge_refuses_tampered_and_partial_shards():
    first, second = shard_receipts(2)
    tampered = copy.deepcopy(second)
    tampered["cases"][0]["verdict"] = "pass" if tampered["cases"][0]["verdict"] != "pass" \
        else "fail"
    with pytest.raises(ReceiptError, match="shard 2: does not verify"):
        merge_receipts([first, tampered])
    builder = make_builder(config={"matrix": MATRIX, "shard": "2/2"})
    partial = builder.document("partial")
    with pytest.raises(ReceiptError, match="partial receipt"):
        merge_receipts([first, partial])


def test_merge_refuses_nothing_and_repeated_shards():
    with pytest.raises(ReceiptError, match="nothing to merge"):
        merge_receipts([])
    cases_a = [{"id": "a", "verdict": "pass"}]
    cases_b = [{"id": "b", "verdict": "pass"}]
    one = make_builder(config={"matrix": MATRIX, "shard": "1/2"})
    one.add_case(cases_a[0])
    again = make_builder(config={"matrix": MATRIX, "shard": "1/2"})
    again.add_case(cases_b[0])
    with pytest.raises(ReceiptError, match="same shard appears twice"):
        merge_receipts([one.document(), again.document()])


def test_the_command_line_names_no_machine_folder(tmp_path, monkeypatch):
    work = tmp_path / "work"
    argv = ["/opt/venv/bin/kdabench", "qualify", "--out", str(work / "results"),
            f"--matrix={work / 'm.toml'}", "--out", "/root/out/results", "relative/x", "-x"]
    assert portable_command_line(argv, work) == [
        "kdabench", "qualify", "--out", "results", "--matrix=m.toml", "--out", "results",
        "relative/x", "-x"]
    monkeypatch.chdir(tmp_path)
    builder = new_receipt("qualify", config={}, command_line=argv, device={"name": "cpu"},
                          sources={}, created_at="2026-12-04T17:00:00Z")
    assert builder.command_line == ["kdabench", "qualify", "--out", "work/results",
                                    "--matrix=work/m.toml", "--out", "results", "relative/x",
                                    "-x"]
