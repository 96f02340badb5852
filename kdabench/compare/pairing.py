"""Receipts of two sides compared: their groups paired (:mod:`kdabench.compare.groups`), each
pair's cases judged, and the warnings that come with pairing them."""

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
from kdabench.compare.groups import (
    SIDES,
    Group,
    ReceiptPair,
    ReceiptPart,
    UnmatchedReceipt,
    group_receipts,
    pair_groups,
    pairing_fields,
    pairs_across,
    parse_across,
)
from kdabench.receipts import DEVICE_UNIT_KEYS, LoadedReceipt, ReceiptError, load_receipts
from kdabench.sources import compare_source_hashes

#: Toolchain entries that do not touch kernel timings; a difference in them is not warned.
HARNESS_ONLY_TOOLCHAIN_KEYS = frozenset({"kdabench", "click", "rich"})

CaseEntry = tuple[dict[str, Any], ReceiptPart]


@dataclass
class Comparison:
    """Every case compared, the warnings to show first, the options used, and which
    receipts were paired with which (``across``: the pairing fields left out)."""

    base: list[str]
    head: list[str]
    options: CompareOptions
    warnings: list[str]
    cases: list[CaseComparison]
    pairs: list[ReceiptPair] = field(default_factory=list)
    unmatched: list[UnmatchedReceipt] = field(default_factory=list)
    across: tuple[str, ...] = ()

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

    def pairing_heading(self) -> str:
        """'pairing by kind/backend/device', and what it compares across."""
        across = f", across {'/'.join(self.across)}" if self.across else ""
        return f"pairing by {'/'.join(pairing_fields(self.across))}{across}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base, "head": self.head, "options": asdict(self.options),
            "warnings": list(self.warnings), "counts": self.counts,
            "has_regression": self.has_regression, "summary": self.summary_line(),
            "pairing": {"by": list(pairing_fields(self.across)), "across": list(self.across),
                        "pairs": [pair.to_dict() for pair in self.pairs],
                        "unmatched": [receipt.to_dict() for receipt in self.unmatched]},
            "cases": [case.to_dict() for case in self.cases],
        }


# --------------------------------------------------------------------------- warnings


def _duplicate_warnings(pairs: Sequence[ReceiptPair]) -> list[str]:
    return [f"{side}: {group.duplicates} case(s) ({group.key.describe()}) appear in more than "
            "one receipt; the newest receipt's result is used"
            for pair in pairs for side, group in zip(SIDES, (pair.base, pair.head), strict=True)
            if group.duplicates]


def _environment_warnings(pair: ReceiptPair) -> list[str]:
    found: list[str] = []
    for base in _receipts_used(pair.base):
        for head in _receipts_used(pair.head):
            where = f"{pair.kind}: {base.path} vs {head.path}"
            base_device = {k: v for k, v in base.device.items() if k not in DEVICE_UNIT_KEYS}
            head_device = {k: v for k, v in head.device.items() if k not in DEVICE_UNIT_KEYS}
            if base.device_name != head.device_name:
                found.append(f"device differs ({where}): BASE ran on {base.device_name}, "
                             f"HEAD on {head.device_name}")
            elif base_device != head_device:
                found.append(f"device differs ({where}): "
                             f"{_describe_differences(base_device, head_device)}")
            base_tools = _timing_toolchain(base)
            head_tools = _timing_toolchain(head)
            if base_tools != head_tools:
                found.append(f"toolchain differs ({where}): "
                             f"{_describe_differences(base_tools, head_tools)}")
            diff = compare_source_hashes(_mapping(base.doc.get("sources")),
                                         _mapping(head.doc.get("sources")))
            if not diff.match:
                found.append(f"kernel/oracle sources differ ({where}): {diff.describe()}")
    return found


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _timing_toolchain(receipt: LoadedReceipt) -> dict[str, Any]:
    """The receipt's toolchain less the entries that do not touch kernel timings."""
    return {k: v for k, v in _mapping(receipt.doc.get("toolchain")).items()
            if k not in HARNESS_ONLY_TOOLCHAIN_KEYS}


def _receipts_used(group: Group) -> list[LoadedReceipt]:
    """The receipts whose cases a group compares, each once."""
    seen: dict[str, LoadedReceipt] = {}
    for part in group.used:
        seen.setdefault(part.receipt.path, part.receipt)
    return list(seen.values())


def _describe_differences(base: Mapping[str, Any], head: Mapping[str, Any]) -> str:
    keys = sorted(key for key in set(base) | set(head) if base.get(key) != head.get(key))
    return ", ".join(f"{key} {base.get(key)} -> {head.get(key)}" for key in keys)


# --------------------------------------------------------------------------- comparing


def compare_receipts(
    base: Sequence[LoadedReceipt], head: Sequence[LoadedReceipt],
    options: CompareOptions | None = None, *, warnings: Sequence[str] = (),
    across: Sequence[str] = (),
) -> Comparison:
    """Pair the receipts of BASE and HEAD (by kind, backend and device, less ``across``) and
    compare each pair's cases (see the package doc).

    Raises :class:`CompareError` when the two sides share no receipt kind, no group pairs,
    a side is ambiguous across a field, or no case is on both sides of a pair.
    """
    options = CompareOptions() if options is None else options
    across = parse_across(across)
    warnings = list(warnings)
    _require_a_common_kind(base, head)
    base_groups, head_groups = group_receipts(base), group_receipts(head)
    pairs, unmatched = pair_groups(base_groups, head_groups, across)
    if not pairs:
        raise CompareError(_nothing_paired(base_groups, head_groups, across))
    cases = [case for pair in pairs for case in _compare_cases(pair, options)]
    if not any(c.verdict not in ("new", "missing") for c in cases):
        raise CompareError("nothing to compare: no case appears in both BASE and HEAD")
    for message in _duplicate_warnings(pairs) + [
            message for pair in pairs for message in _environment_warnings(pair)]:
        if message not in warnings:
            warnings.append(message)
    order = {verdict: rank for rank, verdict in enumerate(VERDICTS)}
    cases.sort(key=lambda case: order[case.verdict])  # stable: pair order within a verdict
    return Comparison([], [], options, warnings, cases, pairs, unmatched, across)


def _require_a_common_kind(base: Sequence[LoadedReceipt], head: Sequence[LoadedReceipt]) -> None:
    base_kinds = sorted({r.kind for r in base})
    head_kinds = sorted({r.kind for r in head})
    if not set(base_kinds) & set(head_kinds):
        raise CompareError(
            f"nothing to compare: BASE holds {'/'.join(base_kinds) or 'no'} receipts, HEAD "
            f"{'/'.join(head_kinds) or 'no'} receipts; compare receipts of one kind"
        )


def _nothing_paired(base: Mapping[Any, Group], head: Mapping[Any, Group],
                    across: Sequence[str]) -> str:
    def listed(groups: Mapping[Any, Group]) -> str:
        return "; ".join(sorted(group.key.describe() for group in groups.values()))

    hints = [f"--across {name}" for name in pairs_across(base, head, across)]
    hint = f"; {' or '.join(hints)} would pair them" if hints else ""
    return (f"nothing to compare: no receipt of BASE has one of the same "
            f"{'/'.join(pairing_fields(across))} in HEAD (BASE: {listed(base)}; HEAD: "
            f"{listed(head)}){hint}")


def _compare_cases(pair: ReceiptPair, options: CompareOptions) -> list[CaseComparison]:
    """Each case id of the pair, compared."""
    return [_compare_entries(pair.base.cases.get(case_id), pair.head.cases.get(case_id),
                             options, pair)
            for case_id in pair.case_ids()]


def _compare_entries(base: CaseEntry | None, head: CaseEntry | None, options: CompareOptions,
                     pair: ReceiptPair) -> CaseComparison:
    """compare_case, with bench cases seen through each side's backend kernel in a mode both
    ran."""
    labels = {"kind": pair.kind, "device": str(pair.label("device")),
              "backend": pair.label("backend")}
    base_case, base_part = base or (None, None)
    head_case, head_part = head or (None, None)
    if pair.kind != BENCH_KIND:
        return compare_case(base_case, head_case, options, **labels)
    present = base_part or head_part
    kernels = ((base_part or present).kernel, (head_part or present).kernel)
    mode = bench_mode(base_case, head_case, kernels)
    result = compare_case(timed_view(base_case, mode, kernels[0]),
                          timed_view(head_case, mode, kernels[1]), options, **labels)
    result.note = f"{fla_ratio_note(base_case, head_case, mode, kernels)}; {result.note}"
    return result


def compare_paths(
    base: str | os.PathLike, head: str | os.PathLike, *, threshold: float | str = 0.05,
    alpha: float = 0.01, verify: bool = True, resamples: int = 2000,
    confidence: float = 0.95, seed: int = 0, across: Sequence[str] = (),
) -> Comparison:
    """Load BASE and HEAD (receipt files or folders of them) and compare them.

    ``threshold`` is a fraction or a string such as "5%". With ``verify`` False, a
    receipt that fails verification is compared with a warning instead of refused.
    ``across`` names the pairing fields ("backend", "device") to compare across.
    Raises :class:`CompareError` for input that cannot be compared.
    """
    options = CompareOptions(threshold=parse_threshold(threshold), alpha=alpha,
                             resamples=resamples, confidence=confidence, seed=seed)
    warnings: list[str] = []
    base_receipts = load_side(base, verify=verify, warnings=warnings)
    head_receipts = load_side(head, verify=verify, warnings=warnings)
    comparison = compare_receipts(base_receipts, head_receipts, options, warnings=warnings,
                                  across=across)
    comparison.base = [str(r.path) for r in base_receipts]
    comparison.head = [str(r.path) for r in head_receipts]
    return comparison


def load_side(path: str | os.PathLike, *, verify: bool = True,
              warnings: list[str] | None = None) -> list[LoadedReceipt]:
    """Every receipt of one side (a file or a folder), verified byte for byte against its own
    source hashes (the sides' sources are compared with each other, not with the tree).

    A receipt that does not verify raises :class:`CompareError` when ``verify`` is True;
    otherwise it is kept and a warning is appended to ``warnings``, as one is for a partial
    receipt."""
    warnings = [] if warnings is None else warnings
    try:
        loaded = load_receipts([path], sources="own")
    except ReceiptError as error:
        raise CompareError(str(error)) from error
    for receipt in loaded:
        if not receipt.verified:
            problems = "; ".join(receipt.check.problems)
            if verify:
                raise CompareError(f"{receipt.path} does not verify ({problems}); pass "
                                   "--no-verify to compare it anyway")
            warnings.append(f"{receipt.path} does not verify ({problems}); compared anyway "
                            "(--no-verify)")
        if receipt.doc.get("status") != "complete":
            warnings.append(f"{receipt.path} is a partial receipt (interrupted run)")
    return loaded
