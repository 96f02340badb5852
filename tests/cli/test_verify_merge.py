"""`kdabench verify` and `kdabench merge` through click's CliRunner: output and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import invoke

from kdabench.receipts import load_receipt, new_receipt, verify_file
from kdabench.sources import source_hashes

DEVICE = {
    "kind": "cuda", "device": "cuda:0", "name": "NVIDIA H200", "compute_capability": "9.0",
    "sm_count": 132, "total_memory_bytes": 150_000_000_000, "uuid": "GPU-0",
    "driver_version": "580.159.04", "cuda_runtime_version": "13.0",
    "cpu_model": "Intel Xeon", "cpu_count": 16,
}
MATRIX = {"capacity": [1, 2, 4], "heads": [4, 8]}
VERDICTS = ["pass", "pass", "fail", "pass", "skip", "pass"]


def case(index: int) -> dict:
    return {
        "id": f"case-{index:02d}", "index": index, "verdict": VERDICTS[index],
        "errors": {"o": 1e-3}, "samples_ms": [0.5, 0.6, 0.55], "median_ms": 0.55,
    }


def write_receipt(folder: Path, *, shard: str | None = None, indices=range(6),
                  sources: dict | None = None, kind: str = "qualify",
                  name: str | None = None) -> Path:
    config = {"matrix": MATRIX} if shard is None else {"matrix": MATRIX, "shard": shard}
    builder = new_receipt(
        kind, config=config, command_line=["kdabench", kind], device=DEVICE,
        sources=source_hashes() if sources is None else sources,
        created_at="2026-12-02T16:24:05Z",
    )
    for index in indices:
        builder.add_case(case(index))
    return builder.write(folder / (name or builder.filename()))


@pytest.fixture
def receipt(tmp_path: Path) -> Path:
    return write_receipt(tmp_path)


# --------------------------------------------------------------------------- verify


def test_verify_accepts_an_intact_receipt(receipt: Path):
    result = invoke("verify", receipt)
    assert result.exit_code == 0, result.output
    assert "hash     ok" in result.stdout
    assert "qualify · NVIDIA H200 (cuda, cc 9.0) · complete" in result.stdout
    assert "6 cases: 4 pass, 1 fail, 0 error, 1 skip" in result.stdout
    assert "sources  match the tree in hand" in result.stdout
    assert "1 receipt(s) verify" in result.stdout


def test_verify_fails_on_one_edited_byte(receipt: Path):
    raw = receipt.read_bytes()
    receipt.write_bytes(raw.replace(b'"verdict": "fail"', b'"verdict": "pass"', 1))
    result = invoke("verify", receipt)
    assert result.exit_code == 1
    assert "FAILED" in result.stdout
    assert "sha256 mismatch" in result.stdout
    assert result.stderr.strip().startswith("finding: 1 of 1 receipt(s) do not verify")


def test_verify_fails_on_an_edited_digit(receipt: Path):
    raw = receipt.read_bytes()
    position = raw.index(b"0.55")
    receipt.write_bytes(raw[:position] + b"0.54" + raw[position + 4:])
    assert invoke("verify", receipt).exit_code == 1


def test_verify_many_receipts_fails_when_one_is_tampered(tmp_path: Path):
    good = write_receipt(tmp_path, name="good.json")
    bad = write_receipt(tmp_path, name="bad.json")
    bad.write_bytes(bad.read_bytes().replace(b"NVIDIA H200", b"NVIDIA H100"))
    result = invoke("verify", good, bad)
    assert result.exit_code == 1
    assert "bad.json" in result.stderr and "good.json" not in result.stderr


def test_verify_reads_a_folder_as_its_receipts(tmp_path: Path):
    write_receipt(tmp_path, name="a.json")
    bad = write_receipt(tmp_path, name="b.json")
    (tmp_path / "plot.png").write_bytes(b"not a receipt")
    assert invoke("verify", tmp_path).exit_code == 0
    assert "2 receipt(s) verify" in invoke("verify", tmp_path).stdout
    bad.write_bytes(bad.read_bytes().replace(b"NVIDIA H200", b"NVIDIA H100"))
    result = invoke("verify", tmp_path)
    assert result.exit_code == 1
    assert "1 of 2 receipt(s) do not verify" in result.stderr and "b.json" in result.stderr


def test_verify_missing_path_or_empty_folder_is_bad_input(tmp_path: Path):
    missing = invoke("verify", tmp_path / "absent")
    assert missing.exit_code == 2
    assert missing.stderr.strip() == f"error: {tmp_path / 'absent'}: no such file or folder"
    empty = invoke("verify", tmp_path)
    assert empty.exit_code == 2
    assert "a folder with no *.json receipt in it" in empty.stderr


def test_verify_partial_receipt_verifies_and_says_partial(tmp_path: Path):
    path = tmp_path / "r.json"
    builder = new_receipt("qualify", config={"matrix": MATRIX}, command_line=["kdabench"],
                          device=DEVICE, created_at="2026-12-02T16:24:05Z")
    with pytest.raises(KeyboardInterrupt), builder.writer(path) as receipt:
        receipt.add_case(case(0))
        raise KeyboardInterrupt
    result = invoke("verify", path)
    assert result.exit_code == 0, result.output
    assert "partial (interrupted run)" in result.stdout


def test_verify_source_mismatch_is_a_warning_unless_required(tmp_path: Path):
    sources = dict(source_hashes())
    sources["kernels/triton/prefill_old.py"] = "0" * 64
    first_key = next(iter(source_hashes()))
    sources[first_key] = "1" * 64
    path = write_receipt(tmp_path, sources=sources)

    result = invoke("verify", path)
    assert result.exit_code == 0, result.output
    assert "differ from the tree in hand" in result.stdout
    assert f"changed  {first_key}" in result.stdout
    assert "missing  kernels/triton/prefill_old.py" in result.stdout

    strict = invoke("verify", "--require-sources-match", path)
    assert strict.exit_code == 1
    assert "other kernel/oracle sources" in strict.stderr


def test_verify_json(receipt: Path):
    result = invoke("verify", "--json", receipt)
    assert result.exit_code == 0
    [entry] = json.loads(result.stdout)
    assert entry["ok"] is True and entry["hash_ok"] is True and entry["bytes_ok"] is True
    assert entry["kind"] == "qualify" and entry["status"] == "complete"
    assert entry["summary"] == {"total": 6, "pass": 4, "fail": 1, "error": 0, "skip": 1}
    assert entry["sources_match"] is True
    assert entry["recorded"] == entry["recomputed"] == load_receipt(receipt)["sha256"]


def test_verify_json_tampered(receipt: Path):
    receipt.write_bytes(receipt.read_bytes().replace(b"case-03", b"case-09"))
    result = invoke("verify", "--json", receipt)
    assert result.exit_code == 1
    [entry] = json.loads(result.stdout)
    assert entry["ok"] is False and entry["hash_ok"] is False


@pytest.mark.parametrize(
    "content, fragment",
    [(b"{ not json", "not valid JSON"), (b'{"schema": "x"}', "schema 'x'")],
    ids=["not-json", "wrong-schema"],
)
def test_verify_unreadable_input_exits_2(tmp_path: Path, content: bytes, fragment: str):
    path = tmp_path / "broken.json"
    path.write_bytes(content)
    result = invoke("verify", path)
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0]
    assert "Traceback" not in result.output


def test_verify_missing_file_exits_2(tmp_path: Path):
    result = invoke("verify", tmp_path / "absent.json")
    assert result.exit_code == 2
    assert "no such file" in result.stderr


def test_verify_needs_a_receipt():
    assert invoke("verify").exit_code == 2


# --------------------------------------------------------------------------- merge


def test_merge_two_shards_equals_one_run(tmp_path: Path):
    single = load_receipt(write_receipt(tmp_path, name="single.json"))
    shard1 = write_receipt(tmp_path, shard="1/2", indices=[0, 2, 4], name="s1.json")
    shard2 = write_receipt(tmp_path, shard="2/2", indices=[5, 3, 1], name="s2.json")
    out = tmp_path / "merged.json"

    result = invoke("merge", out, shard1, shard2)

    assert result.exit_code == 0, result.output
    assert "merged 2 qualify shard receipt(s)" in result.stdout
    assert "6 cases: 4 pass, 1 fail, 0 error, 1 skip" in result.stdout
    merged = load_receipt(out)
    assert merged["cases"] == single["cases"]
    assert merged["summary"] == single["summary"]
    assert verify_file(out).ok
    assert invoke("verify", out).exit_code == 0


def test_merge_into_a_folder_uses_the_file_name_convention(tmp_path: Path):
    shards = tmp_path / "shards"
    shards.mkdir()
    shard1 = write_receipt(shards, shard="1/2", indices=[0, 1, 2], name="s1.json")
    shard2 = write_receipt(shards, shard="2/2", indices=[3, 4, 5], name="s2.json")
    out_dir = tmp_path / "results"
    out_dir.mkdir()
    result = invoke("merge", "--json", out_dir, shard1, shard2)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    written = Path(report["out"])
    assert written.parent == out_dir
    assert written.name.startswith("qualify-nvidia-h200-") and written.suffix == ".json"
    assert report["status"] == "complete" and report["missing_shards"] == []
    assert report["sha256"] == load_receipt(written)["sha256"]
    assert [entry["shard"] for entry in report["shards"]] == ["1/2", "2/2"]


def test_merge_refuses_to_overwrite_without_force(tmp_path: Path):
    shard1 = write_receipt(tmp_path, shard="1/2", indices=[0, 1, 2], name="s1.json")
    shard2 = write_receipt(tmp_path, shard="2/2", indices=[3, 4, 5], name="s2.json")
    out = tmp_path / "merged.json"
    assert invoke("merge", out, shard1, shard2).exit_code == 0
    again = invoke("merge", out, shard1, shard2)
    assert again.exit_code == 2 and "--force" in again.stderr
    assert invoke("merge", "--force", out, shard1, shard2).exit_code == 0
    into_shard = invoke("merge", "--force", shard1, shard1, shard2)
    assert into_shard.exit_code == 2 and "is one of the shards" in into_shard.stderr


def test_merge_with_an_absent_shard_writes_partial_and_exits_1(tmp_path: Path):
    shard1 = write_receipt(tmp_path, shard="1/3", indices=[0, 1], name="s1.json")
    shard3 = write_receipt(tmp_path, shard="3/3", indices=[4, 5], name="s3.json")
    out = tmp_path / "merged.json"
    result = invoke("merge", out, shard1, shard3)
    assert result.exit_code == 1
    assert "2/3" in result.stderr
    assert load_receipt(out)["status"] == "partial"


@pytest.mark.parametrize("mismatch", ["kind", "sources", "duplicate"])
def test_merge_refuses_shards_that_do_not_belong_together(tmp_path: Path, mismatch: str):
    shard1 = write_receipt(tmp_path, shard="1/2", indices=[0, 1, 2], name="s1.json")
    if mismatch == "kind":
        shard2 = write_receipt(tmp_path, shard="2/2", indices=[3, 4, 5], kind="bench",
                               name="s2.json")
        fragment = "only receipts of one kind"
    elif mismatch == "sources":
        shard2 = write_receipt(tmp_path, shard="2/2", indices=[3, 4, 5],
                               sources={"kernels/other.py": "2" * 64}, name="s2.json")
        fragment = "different kernel/oracle sources"
    else:
        shard2 = write_receipt(tmp_path, shard="2/2", indices=[2, 3], name="s2.json")
        fragment = "'case-02' appears in both"
    out = tmp_path / "merged.json"
    result = invoke("merge", out, shard1, shard2)
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "cannot merge" in lines[0]
    assert not out.exists()


def test_merge_refuses_a_tampered_shard(tmp_path: Path):
    shard1 = write_receipt(tmp_path, shard="1/2", indices=[0, 1, 2], name="s1.json")
    shard2 = write_receipt(tmp_path, shard="2/2", indices=[3, 4, 5], name="s2.json")
    shard2.write_bytes(shard2.read_bytes().replace(b'"verdict": "skip"', b'"verdict": "pass"'))
    result = invoke("merge", tmp_path / "merged.json", shard1, shard2)
    assert result.exit_code == 2
    assert "does not verify" in result.stderr


def test_merge_unreadable_shard_exits_2(tmp_path: Path):
    shard1 = write_receipt(tmp_path, shard="1/2", indices=[0, 1, 2], name="s1.json")
    junk = tmp_path / "junk.json"
    junk.write_text("plain text")
    result = invoke("merge", tmp_path / "merged.json", shard1, junk)
    assert result.exit_code == 2
    assert "not valid JSON" in result.stderr
