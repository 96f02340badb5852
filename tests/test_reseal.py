"""Resealing receipts that hold machine paths: what is rewritten, what is recorded, what is
refused, and `kdabench reseal` / `kdabench verify` on the result."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import kdabench
from kdabench.cli.main import cli
from kdabench.receipts import SCHEMA, ReceiptError, canonical_json, render_receipt, seal
from kdabench.receipts.reseal import reseal

PROFILE_MISS = ("heuristic (no profile for device 'NVIDIA H100 80GB HBM3' "
                "(nvidia-h100-80gb-hbm3.json not in {}))")
CUTE_ORIGIN = "cute backend, aot {} (nvidia-cutlass-dsl 4.8.1, built 2026-12-03T05:29:07Z)"
UNITS = ["12.5 ms/token", "3.2 GB/s", "tokens/s", "shard 1/2", "per /s", "kernels/triton/x.py",
         "http://127.0.0.1:8000/v1/models", "~/out/results", "a/b /c"]


def sealed(command_line: list[str], config: dict[str, Any], strings: list[str]) -> dict[str, Any]:
    """A receipt as older code sealed it: ``strings`` as its cases' config sources."""
    return seal({
        "schema": SCHEMA, "kind": "qualify", "tool_version": "0.1.0",
        "created_at": "2026-12-03T05:31:04Z", "git": {"commit": "a" * 40, "dirty": False},
        "sources": {"kernels/triton/prefill.py": "b" * 64},
        "device": {"kind": "cuda", "name": "NVIDIA H200"}, "toolchain": {"python": "3.11.7"},
        "command_line": command_line, "config": config, "status": "complete",
        "cases": [{"id": f"case-{i}", "verdict": "pass", "median_ms": 0.1 + i / 3,
                   "samples_ms": [0.1, 0.2, float(i)], "config_source": text}
                  for i, text in enumerate(strings)],
    })


@pytest.fixture
def old() -> dict[str, Any]:
    """A receipt holding machine paths in its command line, config and cases."""
    return sealed(
        ["/opt/torch/.venv/bin/kdabench", "merge", "results", "--out", "/root/out/results",
         "--shapes=/tmp/s19/shapes.toml", "/work/.device/4/results/bench-shard1of2.json"],
        {"merged_from": [{"label": "/tmp/s19/bench-shard1of2.json", "cases": 3}],
         "paths/by~name": "(see /home/me/w/notes.txt)", "rate": "3.2 GB/s"},
        [CUTE_ORIGIN.format("/work/main/.cute-kernels/sm_90a"),
         PROFILE_MISS.format("/work/main/profiles"), "triton heuristic", *UNITS],
    )


def invoke(*args: str | Path):
    return CliRunner().invoke(cli, ["reseal", *(str(arg) for arg in args)], prog_name="kdabench")


def write(doc: dict[str, Any], path: Path) -> Path:
    path.write_bytes(render_receipt(doc))
    return path


def assert_refused(result, fragment: str) -> None:
    """Exit 2 with one line on stderr that holds ``fragment``, and no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr


def test_command_line_and_embedded_paths_are_rewritten_as_the_writer_records_them(old):
    new, rewritten = reseal(old)
    assert new["command_line"] == ["kdabench", "merge", "results", "--out", "results",
                                   "--shapes=shapes.toml", "bench-shard1of2.json"]
    assert new["config"]["merged_from"][0]["label"] == "bench-shard1of2.json"
    assert new["config"]["paths/by~name"] == "(see notes.txt)"
    sources = [case["config_source"] for case in new["cases"]]
    assert sources[:3] == [CUTE_ORIGIN.format("sm_90a"), PROFILE_MISS.format("profiles"),
                           "triton heuristic"]
    assert rewritten == [
        "/command_line/0", "/command_line/4", "/command_line/5", "/command_line/6",
        "/config/merged_from/0/label", "/config/paths~1by~0name",
        "/cases/0/config_source", "/cases/1/config_source",
    ]


def test_units_and_relative_paths_are_never_touched(old):
    new, _ = reseal(old)
    assert [case["config_source"] for case in new["cases"][3:]] == UNITS
    assert new["config"]["rate"] == "3.2 GB/s"
    clean = sealed(["kdabench", "bench", "--out", "results"], {"unit": "GB/s"}, UNITS)
    assert reseal(clean) == (clean, [])


def test_a_path_beside_a_unit_is_rewritten_and_the_unit_kept():
    doc = sealed(["kdabench"], {}, ["=/work/main/profiles at 3 GB/s, 1.2 ms/token"])
    new, rewritten = reseal(doc)
    assert new["cases"][0]["config_source"] == "=profiles at 3 GB/s, 1.2 ms/token"
    assert rewritten == ["/cases/0/config_source"]


def test_the_reseal_records_the_previous_hash_and_never_the_old_values(old):
    new, rewritten = reseal(old)
    record = new["resealed"]
    assert record["previous_sha256"] == old["sha256"] != new["sha256"]
    assert record["rewritten"] == rewritten
    assert record["tool_version"] == kdabench.__version__
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["at"])
    assert "original_sha256" not in record
    text = canonical_json(new).decode()
    for old_value in ("/opt/", "/root/", "/tmp/", "/work/", "/home/", ".venv"):
        assert old_value not in text


def test_values_not_rewritten_are_bit_identical(old):
    new, rewritten = reseal(old)

    def blanked(doc: dict[str, Any]) -> dict[str, Any]:
        doc = copy.deepcopy(doc)
        for pointer in rewritten:
            *parents, last = [part.replace("~1", "/").replace("~0", "~")
                              for part in pointer.split("/")[1:]]
            holder = doc
            for part in parents:
                holder = holder[int(part) if isinstance(holder, list) else part]
            holder[int(last) if isinstance(holder, list) else last] = None
        return {key: value for key, value in doc.items() if key not in ("resealed", "sha256")}

    assert rewritten and blanked(new) != new
    assert canonical_json(blanked(new)) == canonical_json(blanked(old))
    assert set(new) - set(old) == {"resealed"}


def test_a_resealed_receipt_is_not_resealed_again_unless_a_path_is_left(old):
    first, _ = reseal(old)
    assert reseal(first) == (first, [])
    body = copy.deepcopy(first)
    body["config"]["extra"] = "/tmp/x/y.toml"
    second, rewritten = reseal(seal(body))
    assert rewritten == ["/config/extra"]
    assert second["resealed"]["original_sha256"] == old["sha256"]
    assert second["resealed"]["rewritten"] == first["resealed"]["rewritten"] + rewritten


def test_a_tampered_receipt_is_refused(old):
    tampered = copy.deepcopy(old)
    tampered["cases"][0]["median_ms"] = 0.01
    with pytest.raises(ReceiptError, match="sha256 mismatch"):
        reseal(tampered)


def test_the_command_reseals_in_place_and_the_result_verifies(old, tmp_path):
    path = write(old, tmp_path / "old.json")
    result = invoke(path)
    assert result.exit_code == 0, result.output
    new = json.loads(path.read_text())
    assert path.read_bytes() == render_receipt(new)
    assert f"{path}: resealed, 8 value(s) rewritten, sha256 {old['sha256'][:16]}… -> " \
           f"{new['sha256'][:16]}…" in result.stdout
    verified = CliRunner().invoke(cli, ["verify", str(path)], prog_name="kdabench")
    assert verified.exit_code == 0, verified.output
    assert f"resealed {new['resealed']['at']} from sha256 {old['sha256'][:16]}" in verified.stdout
    as_json = CliRunner().invoke(cli, ["verify", "--json", str(path)], prog_name="kdabench")
    assert json.loads(as_json.stdout)[0]["resealed"] == new["resealed"]


def test_the_command_refuses_a_tampered_receipt_and_writes_nothing(old, tmp_path):
    clean = write(sealed(["kdabench"], {}, ["/work/main/profiles"]), tmp_path / "a.json")
    tampered = copy.deepcopy(old)
    tampered["cases"][0]["verdict"] = "fail"
    path = write(tampered, tmp_path / "b.json")
    before = {p: p.read_bytes() for p in (clean, path)}
    assert_refused(invoke(clean, path), f"{path}: does not verify")
    assert {p: p.read_bytes() for p in (clean, path)} == before


def test_the_command_refuses_an_edited_layout(old, tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old, indent=4))
    assert_refused(invoke(path), "edited layout")


@pytest.mark.parametrize(("content", "fragment"), [
    (None, "no such file"), ("[1, 2]", "a receipt is a JSON object"), ("{", "not valid JSON"),
])
def test_the_command_refuses_what_is_not_a_receipt(tmp_path, content, fragment):
    path = tmp_path / "x.json"
    if content is not None:
        path.write_text(content)
    assert_refused(invoke(path), fragment)


def test_a_clean_receipt_is_left_byte_for_byte(tmp_path):
    path = write(sealed(["kdabench", "qualify", "--out", "results"], {}, UNITS), tmp_path / "c.json")
    before, mtime = path.read_bytes(), path.stat().st_mtime_ns
    result = invoke(path)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"{path}: nothing to rewrite"
    assert path.read_bytes() == before and path.stat().st_mtime_ns == mtime


def test_dry_run_writes_nothing(old, tmp_path):
    path = write(old, tmp_path / "old.json")
    before = path.read_bytes()
    result = invoke("--dry-run", path)
    assert result.exit_code == 0, result.output
    assert f"{path}: would reseal, 8 value(s) to rewrite" in result.stdout
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]


def test_json_output_names_the_pointers_and_hashes(old, tmp_path):
    path = write(old, tmp_path / "old.json")
    report = json.loads(invoke("--json", path).stdout)
    new = json.loads(path.read_text())
    assert report == [{"path": str(path), "rewritten": new["resealed"]["rewritten"],
                       "previous_sha256": old["sha256"], "sha256": new["sha256"],
                       "written": True}]
