"""Receipts of two sides: loading (verified), matching by kind, device and case id, and the
warnings that come with pairing them."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kdabench.compare.bench_cases import BENCH_KIND, bench_mode, fla_ratio_note, timed_view
from kdabench.compare.cases import (
    VERDICTS,
    CaseComparison,
    CompareError,
    CompareOptions,
    compare_case,
    parse_threshold,
)
from kdabench.receipts import DEVICE_UNIT_KEYS, ReceiptError, read_receipt, verify_receipt
from kdabench.receipts.files import receipt_files
from kdabench.sources import compare_source_hashes

#: Toolchain entries that do not touch kernel timings; a difference in them is not warned.
HARNESS_ONLY_TOOLCHAIN_KEYS = frozenset({"kdabench", "click", "rich"})


# --------------------------------------------------------------------------- receipts


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
    def device_name(self) -> str:
        device = self.doc.get("device")
        name = device.get("name") if isinstance(device, Mapping) else None
        return str(name or "unknown device")


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


# --------------------------------------------------------------------------- comparing


@dataclass
class Comparison:
    """Every case compared, the warnings to show first, and the options used."""

    base: list[str]
    head: list[str]
    options: CompareOptions
    warnings: list[str]
    cases: list[CaseComparison]

    @property
    def counts(self) -> dict[str, int]:
        counts = {verdict: 0 for verdict in VERDICTS}
        for case in self.cases:
            counts[case.verdict] += 1
        return counts

    @property
    def regressions(self) -> list[CaseComparison]:
        return [case for case in self.cases if case.is_regression]

    @property
    def has_regression(self) -> bool:
        return bool(self.regressions)

    def summary_line(self) -> str:
        counts = self.counts
        parts = ", ".join(f"{counts[v]} {v}" for v in VERDICTS)
        head = (f"{len(self.regressions)} regression(s)" if self.has_regression
                else "no regression")
        return (f"{head}: {len(self.cases)} cases ({parts}); threshold "
                f"{self.options.threshold * 100:g}%, alpha {self.options.alpha:g}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base, "head": self.head, "options": asdict(self.options),
            "warnings": list(self.warnings), "counts": self.counts,
            "has_regression": self.has_regression, "summary": self.summary_line(),
            "cases": [case.to_dict() for case in self.cases],
        }


def _by_kind_and_device(receipts, side: str, warnings: list[str]):
    """{kind: {device: {case id: (case, receipt)}}}; the newest receipt wins a duplicate."""
    table: dict[str, dict[str, dict[str, tuple[dict, LoadedReceipt]]]] = {}
    superseded: dict[tuple[str, str], int] = {}
    for receipt in sorted(receipts, key=lambda r: str(r.doc.get("created_at"))):
        cases = table.setdefault(receipt.kind, {}).setdefault(receipt.device_name, {})
        for case in receipt.doc["cases"]:
            if case.get("id") in cases:
                superseded[(receipt.kind, receipt.device_name)] = (
                    superseded.get((receipt.kind, receipt.device_name), 0) + 1)
            cases[str(case.get("id"))] = (case, receipt)
    for (kind, device), count in sorted(superseded.items()):
        warnings.append(f"{side}: {count} {kind} case(s) on {device} appear in more than one "
                        "receipt; the newest receipt's result is used")
    return table


def _pair_devices(kind, base_devices, head_devices, warnings):
    pairs = [(name, name) for name in base_devices if name in head_devices]
    base_only = [name for name in base_devices if name not in head_devices]
    head_only = [name for name in head_devices if name not in base_devices]
    if len(base_only) == 1 and len(head_only) == 1:
        pairs.append((base_only[0], head_only[0]))
        base_only, head_only = [], []
    pairs += [(name, None) for name in base_only] + [(None, name) for name in head_only]
    for name in base_only:
        warnings.append(f"{kind} receipts on {name} are only in BASE: their cases are missing")
    for name in head_only:
        warnings.append(f"{kind} receipts on {name} are only in HEAD: their cases are new")
    return pairs


def _environment_warnings(kind, base_receipts, head_receipts) -> list[str]:
    found: list[str] = []
    for base in base_receipts:
        for head in head_receipts:
            where = f"{kind}: {base.path} vs {head.path}"
            base_device = {k: v for k, v in base.doc.get("device", {}).items()
                           if k not in DEVICE_UNIT_KEYS}
            head_device = {k: v for k, v in head.doc.get("device", {}).items()
                           if k not in DEVICE_UNIT_KEYS}
            if base.device_name != head.device_name:
                found.append(f"device differs ({where}): BASE ran on {base.device_name}, "
                             f"HEAD on {head.device_name}")
            elif base_device != head_device:
                found.append(f"device differs ({where}): "
                             f"{_describe_differences(base_device, head_device)}")
            base_tools = {k: v for k, v in base.doc.get("toolchain", {}).items()
                          if k not in HARNESS_ONLY_TOOLCHAIN_KEYS}
            head_tools = {k: v for k, v in head.doc.get("toolchain", {}).items()
                          if k not in HARNESS_ONLY_TOOLCHAIN_KEYS}
            if base_tools != head_tools:
                found.append(f"toolchain differs ({where}): "
                             f"{_describe_differences(base_tools, head_tools)}")
            diff = compare_source_hashes(base.doc.get("sources", {}), head.doc.get("sources", {}))
            if not diff.match:
                found.append(f"kernel/oracle sources differ ({where}): {diff.describe()}")
    return found


def _describe_differences(base: Mapping[str, Any], head: Mapping[str, Any]) -> str:
    keys = sorted(key for key in set(base) | set(head) if base.get(key) != head.get(key))
    return ", ".join(f"{key} {base.get(key)} -> {head.get(key)}" for key in keys)


def compare_receipts(
    base: Sequence[LoadedReceipt], head: Sequence[LoadedReceipt],
    options: CompareOptions | None = None, *, warnings: Sequence[str] = (),
) -> Comparison:
    """Match the cases of BASE and HEAD receipts and compare each (see the module doc).

    Raises :class:`CompareError` when the two sides share no receipt kind or no case.
    """
    options = CompareOptions() if options is None else options
    warnings = list(warnings)
    base_kinds = sorted({r.kind for r in base})
    head_kinds = sorted({r.kind for r in head})
    common = [kind for kind in base_kinds if kind in head_kinds]
    if not common:
        raise CompareError(
            f"nothing to compare: BASE holds {'/'.join(base_kinds) or 'no'} receipts, HEAD "
            f"{'/'.join(head_kinds) or 'no'} receipts; compare receipts of one kind"
        )
    for kind in base_kinds + head_kinds:
        if kind not in common:
            side = "BASE" if kind in base_kinds else "HEAD"
            warnings.append(f"{kind} receipts are only in {side}; they are not compared")
    base_table = _by_kind_and_device(base, "BASE", warnings)
    head_table = _by_kind_and_device(head, "HEAD", warnings)

    cases: list[CaseComparison] = []
    environment: list[str] = []
    for kind in common:
        for base_device, head_device in _pair_devices(
                kind, list(base_table[kind]), list(head_table[kind]), warnings):
            base_cases = base_table[kind].get(base_device, {}) if base_device else {}
            head_cases = head_table[kind].get(head_device, {}) if head_device else {}
            label = (base_device or head_device if base_device == head_device
                     or None in (base_device, head_device)
                     else f"{base_device} -> {head_device}")
            for case_id in list(base_cases) + [i for i in head_cases if i not in base_cases]:
                base_case = base_cases.get(case_id, (None, None))[0]
                head_case = head_cases.get(case_id, (None, None))[0]
                cases.append(_compare_pair(base_case, head_case, options, kind, str(label)))
            if base_device and head_device:
                environment += _environment_warnings(
                    kind, _contributors(base_cases), _contributors(head_cases))
    if not any(c.verdict not in ("new", "missing") for c in cases):
        raise CompareError("nothing to compare: no case appears in both BASE and HEAD")
    for message in environment:
        if message not in warnings:
            warnings.append(message)
    order = {verdict: rank for rank, verdict in enumerate(VERDICTS)}
    cases.sort(key=lambda case: order[case.verdict])  # stable: receipt order within a verdict
    return Comparison([], [], options, warnings, cases)


def _compare_pair(base_case, head_case, options, kind: str, label: str) -> CaseComparison:
    """compare_case, with bench cases seen through kdabench's samples in a shared mode."""
    if kind != BENCH_KIND:
        return compare_case(base_case, head_case, options, kind=kind, device=label)
    mode = bench_mode(base_case, head_case)
    result = compare_case(timed_view(base_case, mode), timed_view(head_case, mode), options,
                          kind=kind, device=label)
    result.note = f"{fla_ratio_note(base_case, head_case, mode)}; {result.note}"
    return result


def _contributors(cases: Mapping[str, tuple[dict, LoadedReceipt]]) -> list[LoadedReceipt]:
    seen: dict[str, LoadedReceipt] = {}
    for _, receipt in cases.values():
        seen.setdefault(receipt.path, receipt)
    return list(seen.values())


def compare_paths(
    base: str | os.PathLike, head: str | os.PathLike, *, threshold: float | str = 0.05,
    alpha: float = 0.01, verify: bool = True, resamples: int = 2000,
    confidence: float = 0.95, seed: int = 0,
) -> Comparison:
    """Load BASE and HEAD (receipt files or folders of them) and compare them.

    ``threshold`` is a fraction or a string such as "5%". With ``verify`` False, a
    receipt that fails verification is compared with a warning instead of refused.
    Raises :class:`CompareError` for input that cannot be compared.
    """
    options = CompareOptions(threshold=parse_threshold(threshold), alpha=alpha,
                             resamples=resamples, confidence=confidence, seed=seed)
    warnings: list[str] = []
    base_receipts = load_receipts(base, verify=verify, warnings=warnings)
    head_receipts = load_receipts(head, verify=verify, warnings=warnings)
    comparison = compare_receipts(base_receipts, head_receipts, options, warnings=warnings)
    comparison.base = [r.path for r in base_receipts]
    comparison.head = [r.path for r in head_receipts]
    return comparison


