"""Joining the shard receipts of one sharded bench run (``Bench(..., shard=(I, N))``) into one
receipt whose ``bench_summary`` is recomputed over every case, as one unsharded run's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kdabench.bench.summary import summarize_by_gates
from kdabench.receipts import ReceiptError, merge_receipts, sanitize, seal

# Config keys each shard measured or computed on its own: the copy bandwidth and matmul rate,
# the medians over that shard's shapes and its wall time.
RUN_LOCAL_KEYS = frozenset({"ceilings", "bench_summary", "time"})


def merge_bench_receipts(docs: Sequence[Mapping[str, Any]], *,
                         labels: Sequence[str] | None = None,
                         command_line: Sequence[str] | None = None,
                         created_at: str | None = None) -> dict[str, Any]:
    """Join bench shard receipts as :func:`kdabench.receipts.merge_receipts` does; each
    shard's ceilings and summary stay in ``merged_from``, the config keeps the first shard's
    ceilings and gets the summary over all shapes. Raises ReceiptError."""
    kinds = sorted({str(doc.get("kind")) for doc in docs})
    if docs and kinds != ["bench"]:
        raise ReceiptError(f"these are {', '.join(map(repr, kinds))} receipts; only bench "
                           "receipts merge as a bench run")
    merged = merge_receipts(docs, labels=labels, command_line=command_line,
                            created_at=created_at, run_local_keys=RUN_LOCAL_KEYS)
    config = merged["config"]
    summary = summarize_by_gates(merged["cases"], config["modes"],
                                 [regime["name"] for regime in config.get("gates", [])],
                                 baseline=config.get("baseline_policy") is not None,
                                 backend_kernels=[config["backend_kernels"][name]
                                                  for name in config["backends"][1:]])
    return seal({**merged, "config": {**config, "bench_summary": sanitize(summary)}})
