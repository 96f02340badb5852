"""Receipts named on a command line, read and verified: the one loader of `compare` and
`report`.

Inputs are receipt files or folders of them (every ``*.json`` directly inside a folder; see
:func:`kdabench.receipts.files.receipt_files`). Each file is read and verified byte for byte
(:func:`kdabench.receipts.verify_receipt`): its hash, its one rendering, its summary, and its
recorded source hashes against the kernel sources in hand (``sources="tree"``), against a
mapping given, or against its own (``sources="own"``: integrity only). What to do with a
receipt that does not verify, or is partial, is the caller's policy; a file that is not a
readable receipt raises :class:`~kdabench.receipts.ReceiptError`.

The backend a receipt's cases ran on: a qualify receipt records it as ``config.backend``; a
bench receipt times kdabench on each backend of ``config.backend_kernels`` ({backend:
kernel}; the first backend's kernel is ``kdabench``, a further one's ``kdabench-<backend>``).
Receipts written before kdabench had a second backend record none: they ran Triton. Other
kinds (serve-sweep) have no kernel backend.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kdabench.receipts.encoding import ReceiptError
from kdabench.receipts.files import receipt_files
from kdabench.receipts.verify import Verification, read_receipt, verify_receipt

#: The backend of a qualify or bench receipt that records none, and bench's kernel on it.
DEFAULT_BACKEND = "triton"
DEFAULT_BENCH_KERNEL = "kdabench"
BACKEND_KINDS = frozenset({"qualify", "bench"})


@dataclass
class LoadedReceipt:
    """One receipt as read: its path, document, what verification found, and whether its
    source hashes were compared with the tree in hand."""

    path: Path
    doc: dict[str, Any]
    check: Verification
    sources_compared: bool = True

    @property
    def name(self) -> str:
        """The file's name (in the folder given, or as given): never an absolute path."""
        return self.path.name

    @property
    def kind(self) -> str:
        return str(self.doc.get("kind"))

    @property
    def verified(self) -> bool:
        return self.check.ok

    @property
    def cases(self) -> list[dict[str, Any]]:
        return [case for case in self.doc.get("cases", []) if isinstance(case, dict)]

    @property
    def config(self) -> Mapping[str, Any]:
        """The receipt's config ({} when it holds none)."""
        config = self.doc.get("config")
        return config if isinstance(config, Mapping) else {}

    @property
    def device(self) -> Mapping[str, Any]:
        """The receipt's device identity ({} when it holds none)."""
        device = self.doc.get("device")
        return device if isinstance(device, Mapping) else {}

    @property
    def device_name(self) -> str:
        return str(self.device.get("name") or "unknown device")

    @property
    def backend(self) -> str | None:
        """The backend the cases ran on (a bench receipt's first: the one its ``kdabench``
        kernel ran on); None for kinds without one."""
        if self.kind == "bench":
            kernels = self.backend_kernels
            return next((backend for backend, kernel in kernels.items()
                         if kernel == DEFAULT_BENCH_KERNEL), next(iter(kernels)))
        recorded = self.config.get("backend")
        if recorded:
            return str(recorded)
        return DEFAULT_BACKEND if self.kind in BACKEND_KINDS else None

    @property
    def backend_kernels(self) -> dict[str, str]:
        """{backend: kdabench kernel timed on it} of a bench receipt."""
        recorded = self.config.get("backend_kernels")
        if isinstance(recorded, Mapping) and recorded:
            return {str(backend): str(kernel) for backend, kernel in recorded.items()}
        return {DEFAULT_BACKEND: DEFAULT_BENCH_KERNEL}


def _tree_sources() -> dict[str, str] | None:
    from kdabench.sources import source_hashes

    try:
        return source_hashes()
    except ModuleNotFoundError:  # sources not installed: integrity is still checked
        return None


def load_receipts(
    inputs: Iterable[str | os.PathLike],
    sources: Mapping[str, str] | Literal["tree", "own"] = "tree",
) -> list[LoadedReceipt]:
    """Read and verify every receipt named by ``inputs`` (files, or folders of ``*.json``),
    each once, in order. ``sources``: what the recorded source hashes are compared with (the
    module docstring). Raises :class:`ReceiptError` for a missing path, a folder without
    receipts, or a file that is not a readable receipt."""
    current = _tree_sources() if sources == "tree" else None if sources == "own" else sources
    loaded = []
    for path in receipt_files(inputs, ReceiptError):
        doc, raw = read_receipt(path)
        # Without sources to compare with, compare the receipt with itself rather than
        # report every file as changed; integrity is checked either way.
        own = doc.get("sources") if isinstance(doc.get("sources"), dict) else {}
        check = verify_receipt(doc, own if current is None else current, raw=raw, path=path)
        loaded.append(LoadedReceipt(path, doc, check, sources_compared=current is not None))
    return loaded
