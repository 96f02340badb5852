"""Merging shard receipts of one run into one sealed receipt, and reading shard counts."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kdabench.receipts.encoding import _HASH_FIELD, SCHEMA, ReceiptError, seal, utc_now
from kdabench.receipts.verify import verify_receipt
from kdabench.receipts.write import portable_command_line, portable_path
from kdabench.sources import compare_source_hashes

# Config keys that legitimately differ between shards of one matrix run; every other
# config key must be equal for shards to be merged.
SHARD_CONFIG_KEYS = frozenset({"shard"})

# Device identity keys that name one unit or its host rather than the device model;
# shards run on two GPUs of the same model may differ in these and still be merged.
DEVICE_UNIT_KEYS = frozenset({"device", "uuid", "cpu_model", "cpu_count"})


def _shard_config(config: Mapping[str, Any], run_local_keys: frozenset[str] = frozenset()
                  ) -> dict[str, Any]:
    """The config without the keys shards of one run may differ in."""
    left_out = SHARD_CONFIG_KEYS | run_local_keys
    return {key: value for key, value in config.items() if key not in left_out}


def _device_model(device: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in device.items() if key not in DEVICE_UNIT_KEYS}


def _differing_keys(first: Mapping[str, Any], other: Mapping[str, Any]) -> list[str]:
    keys = set(first) | set(other)
    return sorted(key for key in keys if first.get(key) != other.get(key))


def _case_order(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    indices = [case.get("index") for case in cases]
    if cases and all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
        seen: dict[int, str] = {}
        for case in cases:
            if case["index"] in seen:
                raise ReceiptError(
                    f"cases {seen[case['index']]!r} and {case['id']!r} share index {case['index']}"
                )
            seen[case["index"]] = case["id"]
        return sorted(cases, key=lambda case: case["index"])
    return sorted(cases, key=lambda case: case["id"])


def merge_receipts(
    docs: Sequence[Mapping[str, Any]],
    *,
    labels: Sequence[str] | None = None,
    command_line: Sequence[str] | None = None,
    created_at: str | None = None,
    run_local_keys: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Join shard receipts of one run into one sealed receipt.

    Every shard must verify, be complete, and share kind, tool version, git commit,
    source hashes, toolchain, device model (keys in :data:`DEVICE_UNIT_KEYS` may differ)
    and config (keys in :data:`SHARD_CONFIG_KEYS` and ``run_local_keys`` may differ); case
    ids must be unique across shards. Cases are ordered by their ``index`` field when every
    case has one, else by id. ``config["merged_from"]`` records each shard (label, shard,
    sha256, created_at, case count, device and, with ``run_local_keys``, ``config`` = its
    values of those keys); the merged config keeps the first shard's values of
    ``run_local_keys``. The merged receipt is "partial" when the shards
    declare a shard count (``config["shard"]`` as "I/N" or {"index", "count"}) and some
    shard of it is absent. Raises :class:`ReceiptError` with the reason otherwise.
    """
    if not docs:
        raise ReceiptError("nothing to merge: give at least one shard receipt")
    labels = list(labels) if labels is not None else [f"shard {i + 1}" for i in range(len(docs))]
    if len(labels) != len(docs):
        raise ReceiptError("merge_receipts: one label per receipt")

    for doc, label in zip(docs, labels, strict=True):
        if doc.get("schema") != SCHEMA:
            raise ReceiptError(f"{label}: not a {SCHEMA} receipt")
        check = verify_receipt(doc, current_sources=doc.get("sources") or {})
        if not (check.hash_ok and check.summary_ok):
            raise ReceiptError(f"{label}: does not verify ({'; '.join(check.problems)})")
        if doc.get("status") != "complete":
            raise ReceiptError(f"{label}: is a partial receipt (interrupted run); rerun that shard")

    first, first_label = docs[0], labels[0]
    for doc, label in zip(docs[1:], labels[1:], strict=True):
        if doc["kind"] != first["kind"]:
            raise ReceiptError(
                f"{label} is a {doc['kind']!r} receipt, {first_label} a {first['kind']!r} one; "
                "only receipts of one kind merge"
            )
        if doc["sources"] != first["sources"]:
            diff = compare_source_hashes(first["sources"], doc["sources"])
            raise ReceiptError(
                f"{label} and {first_label} were made from different kernel/oracle sources "
                f"({diff.describe()})"
            )
        ours, theirs = (_shard_config(d["config"], run_local_keys) for d in (first, doc))
        if theirs != ours:
            keys = _differing_keys(ours, theirs)
            raise ReceiptError(
                f"{label} and {first_label} ran different configurations "
                f"(differing config keys: {', '.join(keys)})"
            )
        if doc["tool_version"] != first["tool_version"]:
            raise ReceiptError(
                f"{label} was made by kdabench {doc['tool_version']}, {first_label} by "
                f"{first['tool_version']}"
            )
        if doc["toolchain"] != first["toolchain"]:
            keys = _differing_keys(first["toolchain"], doc["toolchain"])
            raise ReceiptError(
                f"{label} and {first_label} used different toolchains ({', '.join(keys)})"
            )
        if _device_model(doc["device"]) != _device_model(first["device"]):
            keys = _differing_keys(_device_model(first["device"]), _device_model(doc["device"]))
            raise ReceiptError(
                f"{label} and {first_label} ran on different devices ({', '.join(keys)})"
            )
        if doc["git"].get("commit") != first["git"].get("commit"):
            raise ReceiptError(
                f"{label} was made at commit {doc['git'].get('commit')}, {first_label} at "
                f"{first['git'].get('commit')}"
            )

    owner: dict[str, str] = {}
    cases: list[dict[str, Any]] = []
    for doc, label in zip(docs, labels, strict=True):
        for case in doc["cases"]:
            case_id = case.get("id")
            if case_id in owner:
                raise ReceiptError(
                    f"case id {case_id!r} appears in both {owner[case_id]} and {label}"
                )
            owner[case_id] = label
            cases.append(dict(case))
    cases = _case_order(cases)

    shards = [doc["config"].get("shard") for doc in docs]
    status = "complete" if _shards_complete(shards) else "partial"
    config = _shard_config(first["config"])
    config["merged_from"] = [
        _merged_from(doc, label, run_local_keys) for doc, label in zip(docs, labels, strict=True)
    ]
    return seal({
        "schema": SCHEMA,
        "kind": first["kind"],
        "tool_version": first["tool_version"],
        "created_at": utc_now() if created_at is None else created_at,
        "git": {
            "commit": first["git"].get("commit"),
            "dirty": any(bool(doc["git"].get("dirty")) for doc in docs),
        },
        "sources": first["sources"],
        "device": first["device"],
        "toolchain": first["toolchain"],
        "command_line": portable_command_line(
            list(sys.argv) if command_line is None else command_line, Path.cwd()),
        "config": config,
        "cases": cases,
        "status": status,
    })


def _merged_from(doc: Mapping[str, Any], label: str, run_local_keys: frozenset[str]
                 ) -> dict[str, Any]:
    """What the merged receipt records of one shard."""
    entry = {
        "label": portable_path(label, Path.cwd()),
        "shard": doc["config"].get("shard"),
        "sha256": doc[_HASH_FIELD],
        "created_at": doc["created_at"],
        "cases": len(doc["cases"]),
        "device": doc["device"],
    }
    if run_local_keys:
        entry["config"] = {key: doc["config"].get(key) for key in sorted(run_local_keys)}
    return entry


def parse_shard(shard: Any) -> tuple[int, int] | None:
    """(index, count) from "I/N" or {"index": I, "count": N}; None when not a shard."""
    if isinstance(shard, str):
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", shard)
        if match:
            return int(match.group(1)), int(match.group(2))
        return None
    if isinstance(shard, Mapping):
        index, count = shard.get("index"), shard.get("count")
        if isinstance(index, int) and isinstance(count, int):
            return index, count
    return None


def _shards_complete(shards: list[Any]) -> bool:
    parsed = [parse_shard(shard) for shard in shards]
    if any(item is None for item in parsed):
        return True  # shards that do not declare a count cannot be checked for gaps
    counts = {count for _, count in parsed}
    if len(counts) != 1:
        raise ReceiptError(
            f"shards disagree on the shard count: {', '.join(str(s) for s in shards)}"
        )
    (count,) = counts
    indices = [index for index, _ in parsed]
    if len(set(indices)) != len(indices):
        raise ReceiptError(f"the same shard appears twice: {', '.join(str(s) for s in shards)}")
    return set(indices) == set(range(1, count + 1))


def missing_shards(merged: Mapping[str, Any]) -> list[str]:
    """For a merged receipt, the shards ("I/N") its shard count names but it lacks."""
    sources = merged.get("config", {}).get("merged_from", [])
    parsed = [parse_shard(entry.get("shard")) for entry in sources]
    if not parsed or any(item is None for item in parsed):
        return []
    count = parsed[0][1]
    present = {index for index, _ in parsed}
    return [f"{index}/{count}" for index in range(1, count + 1) if index not in present]
