"""Receipts: one verifiable JSON document per run (schema ``kdabench.receipt.v1``).

A receipt holds::

    schema         "kdabench.receipt.v1"
    kind           "qualify" | "bench" | "serve-sweep"
    tool_version   kdabench version that wrote it
    created_at     UTC ISO 8601, seconds ("2026-12-02T16:24:00Z")
    git            {"commit": str | None, "dirty": bool | None}
    sources        {"kernels/triton/prefill.py": sha256, ...}  (kdabench.sources)
    device         device identity (kdabench.environment.device_identity)
    toolchain      {"python": ..., "torch": ..., ...}         (kdabench.environment.toolchain)
    command_line   argv as a list of strings
    config         free dict: the matrix, the options
    cases          [{"id": str, "verdict": "pass"|"fail"|"error"|"skip", ...free fields}]
    summary        {"total": n, "pass": n, "fail": n, "error": n, "skip": n}  (computed)
    status         "complete" | "partial" (an interrupted run)
    resealed       only on a receipt `kdabench reseal` rewrote (kdabench.receipts.reseal):
                   its previous sha256, when, and the JSON pointers of the values rewritten
    sha256         sha256 hex of the canonical JSON of every other field

Canonical JSON is ``json.dumps(obj, sort_keys=True, separators=(",", ":"),
ensure_ascii=False, allow_nan=False)`` encoded UTF-8. NaN and infinities are not JSON:
:func:`sanitize` turns them into the strings "nan", "inf", "-inf" before anything is
hashed or written.

On disk a receipt is rendered in exactly one way (:func:`render_receipt`: sorted keys,
two-space indent, trailing newline), so :func:`verify_file` can reject any edited
byte: an edit inside a value breaks the hash, an edit of whitespace or key order breaks
the rendering.

Writes are atomic (temporary file in the same folder, fsync, ``os.replace``). A
:class:`ReceiptWriter` rewrites the receipt as "partial" while cases arrive and as
"complete" when its ``with`` block ends normally; an exception or Ctrl-C leaves the
last partial receipt, which still verifies.

The modules: `encoding` (the schema's constants, sanitising, canonical JSON, the hash, the
one rendering, sealing), `write` (file names, atomic writes, building and writing a
receipt), `location` (the folder a receipt goes to when no --out is given: $KDABENCH_OUT,
else ./.kdabench), `verify` (reading and verifying), `loading` (the receipts a command was pointed at, read and
verified: :func:`load_receipts`) and `merge` (joining shard receipts).
"""

from kdabench.receipts.encoding import (
    KINDS,
    SCHEMA,
    STATUSES,
    VERDICTS,
    ReceiptError,
    canonical_json,
    compute_hash,
    render_receipt,
    sanitize,
    seal,
    summarize,
    utc_now,
)
from kdabench.receipts.loading import LoadedReceipt, load_receipts
from kdabench.receipts.location import OUT_ENV, WORKING_FOLDER, receipt_dir
from kdabench.receipts.merge import (
    DEVICE_UNIT_KEYS,
    SHARD_CONFIG_KEYS,
    merge_receipts,
    missing_shards,
    parse_shard,
)
from kdabench.receipts.verify import (
    Verification,
    load_receipt,
    read_receipt,
    verify_bytes,
    verify_file,
    verify_receipt,
)
from kdabench.receipts.write import (
    ReceiptBuilder,
    ReceiptWriter,
    atomic_write_bytes,
    device_slug,
    free_receipt_path,
    new_receipt,
    receipt_filename,
    repo_root,
)

__all__ = [
    "DEVICE_UNIT_KEYS", "KINDS", "OUT_ENV", "SCHEMA", "SHARD_CONFIG_KEYS", "STATUSES",
    "VERDICTS", "WORKING_FOLDER", "LoadedReceipt", "ReceiptBuilder", "ReceiptError",
    "ReceiptWriter", "Verification", "atomic_write_bytes", "canonical_json", "compute_hash",
    "device_slug", "free_receipt_path", "load_receipt", "load_receipts", "merge_receipts",
    "missing_shards", "new_receipt",
    "parse_shard", "read_receipt", "receipt_dir", "receipt_filename", "render_receipt",
    "repo_root", "sanitize", "seal", "summarize", "utc_now", "verify_bytes", "verify_file",
    "verify_receipt",
]
