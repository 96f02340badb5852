"""Reading receipts for a report: the files named, each read and verified.

Inputs are receipt files or folders of them (every ``*.json`` directly inside a folder).
Every receipt is verified (:func:`kdabench.receipts.verify_file`); a file that is not a
readable receipt raises :class:`ReportError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdabench.receipts import ReceiptError, Verification, read_receipt, verify_receipt
from kdabench.receipts.files import receipt_files


class ReportError(ValueError):
    """An input cannot be reported (missing, not a receipt, refused); one line."""



@dataclass
class LoadedReceipt:
    """One receipt as read: its path, document and what verification found."""

    path: Path
    doc: dict[str, Any]
    check: Verification
    sources_compared: bool = True

    @property
    def kind(self) -> str:
        return str(self.doc.get("kind"))

    @property
    def cases(self) -> list[dict[str, Any]]:
        return [case for case in self.doc.get("cases", []) if isinstance(case, dict)]

    @property
    def verified(self) -> bool:
        return self.check.ok


def receipt_paths(inputs: Iterable[str | Path]) -> list[Path]:
    """Receipt files named by ``inputs``: files as given, folders as their ``*.json``."""
    return receipt_files(inputs, ReportError)


def _current_sources() -> dict[str, str] | None:
    from kdabench.sources import source_hashes

    try:
        return source_hashes()
    except ModuleNotFoundError:  # sources not installed: integrity is still checked
        return None


def load_receipts(
    inputs: Iterable[str | Path], current_sources: Mapping[str, str] | None = None
) -> list[LoadedReceipt]:
    """Read and verify every receipt named by ``inputs`` (raises :class:`ReportError`)."""
    current = dict(current_sources) if current_sources is not None else _current_sources()
    loaded = []
    for path in receipt_paths(inputs):
        try:
            doc, raw = read_receipt(path)
        except ReceiptError as error:
            raise ReportError(str(error)) from error
        # Without sources to compare with, compare the receipt with itself rather than
        # report every file as changed; integrity is checked either way.
        sources = current if current is not None else (doc.get("sources") or {})
        check = verify_receipt(doc, sources, raw=raw, path=path)
        loaded.append(LoadedReceipt(path, doc, check, sources_compared=current is not None))
    return loaded
