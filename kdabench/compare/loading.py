"""Receipts of one side read from disk, verified byte for byte before they are compared."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kdabench.compare.cases import CompareError
from kdabench.receipts import ReceiptError, read_receipt, verify_receipt
from kdabench.receipts.files import receipt_files


@dataclass
class LoadedReceipt:
    """A receipt read from disk, and whether it verified (None: not checked)."""

    path: str
    doc: dict[str, Any]
    verified: bool | None
    problems: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return str(self.doc.get("kind"))

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


def load_receipts(
    path: str | os.PathLike, *, verify: bool = True, warnings: list[str] | None = None
) -> list[LoadedReceipt]:
    """Read (and verify, byte for byte) every receipt named by ``path``.

    A receipt that does not verify raises :class:`CompareError` when ``verify`` is True;
    otherwise it is kept and a warning is appended to ``warnings``. Partial receipts are
    kept with a warning.
    """
    warnings = [] if warnings is None else warnings
    loaded: list[LoadedReceipt] = []
    for file in receipt_files([path], CompareError):
        try:
            doc, raw = read_receipt(file)
        except ReceiptError as error:
            raise CompareError(str(error)) from error
        sources = doc.get("sources") if isinstance(doc.get("sources"), dict) else {}
        check = verify_receipt(doc, sources, raw=raw, path=file)
        if not check.ok:
            problems = "; ".join(check.problems)
            if verify:
                raise CompareError(
                    f"{file} does not verify ({problems}); pass --no-verify to compare it anyway"
                )
            warnings.append(f"{file} does not verify ({problems}); compared anyway (--no-verify)")
        if doc.get("status") != "complete":
            warnings.append(f"{file} is a partial receipt (interrupted run)")
        loaded.append(LoadedReceipt(str(file), doc, check.ok, list(check.problems)))
    return loaded
