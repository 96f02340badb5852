"""Which receipts are compared with which.

On each side, the receipts' cases are grouped by (kind, backend, device); within a group the
newest receipt (``created_at``) wins a case id that several receipts hold. A group of BASE
is paired with the group of HEAD that has the same key, less the fields compared across
(``across``: "backend" for CuTe against Triton, "device" for one GPU against another). A
group without a counterpart is unmatched: its receipts are listed, its cases not compared.

The backend a receipt's cases ran on is :attr:`kdabench.receipts.LoadedReceipt.backend`; a
bench receipt that timed several backends (``backend_kernels``) holds one part per backend,
each judged by that backend's kernel. Other kinds (serve-sweep) have no kernel backend.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kdabench.compare.bench_cases import BENCH_KIND, TIMED_KERNEL, bench_case_key
from kdabench.compare.cases import CompareError
from kdabench.receipts import LoadedReceipt

#: What a case is paired by, besides its id, and the fields that may be compared across.
PAIRING_FIELDS = ("kind", "backend", "device")
ACROSS_FIELDS = ("backend", "device")
SIDES = ("BASE", "HEAD")


def parse_across(fields: Iterable[str]) -> tuple[str, ...]:
    """The fields to compare across, in ACROSS_FIELDS order; CompareError for another."""
    chosen = set(fields)
    unknown = sorted(chosen - set(ACROSS_FIELDS))
    if unknown:
        raise CompareError(f"cannot compare across {', '.join(unknown)}; "
                           f"choose among {', '.join(ACROSS_FIELDS)}")
    return tuple(name for name in ACROSS_FIELDS if name in chosen)


def pairing_fields(across: Collection[str]) -> tuple[str, ...]:
    """The fields groups are paired by when ``across`` are left out."""
    return tuple(name for name in PAIRING_FIELDS if name not in across)


@dataclass(frozen=True)
class GroupKey:
    """What a receipt's cases are paired by, besides their ids."""

    kind: str
    backend: str | None  # None: a kind whose cases ran on no kernel backend
    device: str

    def describe(self) -> str:
        """'qualify, triton, NVIDIA H200'."""
        return f"{self.kind}, {self.backend or 'no backend'}, {self.device}"

    def reduced(self, across: Collection[str]) -> tuple[str | None, ...]:
        """The key less the fields compared across."""
        return tuple(getattr(self, name) for name in pairing_fields(across))

    def sort_key(self) -> tuple[str, str, str]:
        return self.kind, self.backend or "", self.device


@dataclass(frozen=True, eq=False)
class ReceiptPart:
    """A receipt's cases on one backend; ``kernel`` is the bench kernel timed on it."""

    receipt: LoadedReceipt
    key: GroupKey
    kernel: str = TIMED_KERNEL


def receipt_parts(receipt: LoadedReceipt) -> list[ReceiptPart]:
    """One part per backend the receipt's cases ran on."""
    if receipt.kind == BENCH_KIND:
        return [ReceiptPart(receipt, GroupKey(receipt.kind, backend, receipt.device_name), kernel)
                for backend, kernel in receipt.backend_kernels.items()]
    return [ReceiptPart(receipt, GroupKey(receipt.kind, receipt.backend, receipt.device_name))]


@dataclass
class Group:
    """One side's receipt parts of one key (oldest first) and each case id's newest case."""

    key: GroupKey
    parts: list[ReceiptPart] = field(default_factory=list)
    cases: dict[str, tuple[dict[str, Any], ReceiptPart]] = field(default_factory=dict)
    duplicates: int = 0  # cases whose id an older receipt of the group holds too

    def add(self, part: ReceiptPart) -> None:
        self.parts.append(part)
        for case in part.receipt.doc["cases"]:
            case_id = (bench_case_key(case) if part.key.kind == BENCH_KIND
                       else str(case.get("id")))
            if case_id in self.cases:
                self.duplicates += 1
            self.cases[case_id] = (case, part)

    @property
    def used(self) -> list[ReceiptPart]:
        """The parts that hold at least one of the cases compared."""
        winners = {part for _, part in self.cases.values()}
        return [part for part in self.parts if part in winners]

    @property
    def superseded(self) -> list[ReceiptPart]:
        """The parts none of whose cases is compared: a newer receipt holds each."""
        used = self.used
        return [part for part in self.parts if part not in used]

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.key.backend, "device": self.key.device,
                "receipts": [str(part.receipt.path) for part in self.used],
                "superseded": [str(part.receipt.path) for part in self.superseded]}


def group_receipts(receipts: Sequence[LoadedReceipt]) -> dict[GroupKey, Group]:
    """One side's receipts as groups, filled oldest first so the newest wins a case id."""
    groups: dict[GroupKey, Group] = {}
    for receipt in sorted(receipts, key=lambda r: str(r.doc.get("created_at"))):
        for part in receipt_parts(receipt):
            groups.setdefault(part.key, Group(part.key)).add(part)
    return groups


@dataclass
class ReceiptPair:
    """A group of BASE compared with a group of HEAD."""

    base: Group
    head: Group

    @property
    def kind(self) -> str:
        return self.base.key.kind

    def label(self, name: str) -> str | None:
        """The pair's backend or device: the one value, or 'BASE's -> HEAD's' across."""
        base, head = getattr(self.base.key, name), getattr(self.head.key, name)
        return base if base == head else f"{base} -> {head}"

    def describe(self) -> str:
        """'qualify, triton, NVIDIA H200', or across backends 'qualify, triton -> cute, ...'."""
        return f"{self.kind}, {self.label('backend') or 'no backend'}, {self.label('device')}"

    def case_ids(self) -> list[str]:
        """BASE's case ids, then those only in HEAD."""
        return list(self.base.cases) + [i for i in self.head.cases if i not in self.base.cases]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "base": self.base.to_dict(), "head": self.head.to_dict()}


@dataclass(frozen=True)
class UnmatchedReceipt:
    """A receipt (on one backend) whose group has no counterpart on the other side."""

    side: str
    path: str
    key: GroupKey
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"side": self.side, "path": self.path, "kind": self.key.kind,
                "backend": self.key.backend, "device": self.key.device, "reason": self.reason}


def pair_groups(
    base: Mapping[GroupKey, Group], head: Mapping[GroupKey, Group], across: Collection[str],
) -> tuple[list[ReceiptPair], list[UnmatchedReceipt]]:
    """BASE's groups paired with HEAD's by key less ``across``, and the receipts of the groups
    left without a counterpart. Raises :class:`CompareError` when a side holds two groups
    that differ only in a field compared across and the other side holds their counterpart
    (which of the two would pair is a guess)."""
    sides = dict(zip(SIDES, (_by_pairing_key(base, across), _by_pairing_key(head, across)),
                     strict=True))
    shared = [key for key in sides["BASE"] if key in sides["HEAD"]]
    for side in SIDES:
        for key in shared:
            _require_one(sides[side][key], side, across)
    pairs = [ReceiptPair(sides["BASE"][key][0], sides["HEAD"][key][0]) for key in shared]
    reason = f"no receipt of that {'/'.join(pairing_fields(across))} on the other side"
    unmatched = [UnmatchedReceipt(side, str(part.receipt.path), part.key, reason)
                 for side, other in zip(SIDES, reversed(SIDES), strict=True)
                 for key, groups in sides[side].items() if key not in sides[other]
                 for group in groups for part in group.parts]
    return pairs, unmatched


def _by_pairing_key(groups: Mapping[GroupKey, Group],
                    across: Collection[str]) -> dict[tuple[str | None, ...], list[Group]]:
    found: dict[tuple[str | None, ...], list[Group]] = {}
    for key in sorted(groups, key=GroupKey.sort_key):
        found.setdefault(key.reduced(across), []).append(groups[key])
    return found


def _require_one(groups: Sequence[Group], side: str, across: Collection[str]) -> None:
    if len(groups) > 1:
        held = " and ".join(f"({group.key.describe()})" for group in groups)
        raise CompareError(
            f"across {'/'.join(across)}, {side} receipts of {held} would pair with the same "
            f"receipts of the other side; point {side} at one {'/'.join(across)}'s receipts")


def pairs_across(base: Mapping[GroupKey, Group], head: Mapping[GroupKey, Group],
                 across: Collection[str]) -> list[str]:
    """The fields not yet in ``across`` that, compared across too, would pair some group."""
    return [name for name in ACROSS_FIELDS if name not in across
            and {key.reduced([*across, name]) for key in base}
            & {key.reduced([*across, name]) for key in head}]
