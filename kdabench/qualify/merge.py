"""Joining qualify receipts of one run (shards, or the parts its worker processes ran) into
one receipt whose ``time`` totals are recomputed over every case."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kdabench.qualify.run import time_totals
from kdabench.receipts import merge_receipts, sanitize, seal

# Config keys each part measured on its own; each part's values stay in merged_from.
RUN_LOCAL_KEYS = frozenset({"time"})


def merge_qualify_receipts(docs: Sequence[Mapping[str, Any]], *,
                           labels: Sequence[str] | None = None,
                           command_line: Sequence[str] | None = None,
                           created_at: str | None = None,
                           wall_s: float | None = None) -> dict[str, Any]:
    """Join qualify receipts as :func:`kdabench.receipts.merge_receipts` does; the config's
    ``time`` sums the cases' compile, run and wall seconds, counts the parts as workers, and
    records `wall_s` (the wall time of the whole run; None when the parts ran apart).
    Raises ReceiptError."""
    merged = merge_receipts(docs, labels=labels, command_line=command_line,
                            created_at=created_at, run_local_keys=RUN_LOCAL_KEYS)
    loads = [(doc["config"].get("time") or {}).get("backend_load_s") for doc in docs]
    loaded = [value for value in loads if isinstance(value, (int, float))]
    totals = time_totals(merged["cases"], wall_s=wall_s, workers=len(docs),
                         backend_load_s=round(sum(loaded), 3) if loaded else None)
    return seal({**merged, "config": {**merged["config"], "time": sanitize(totals)}})
