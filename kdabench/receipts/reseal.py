"""Resealing a receipt that holds a machine's absolute paths: each path rewritten as the
writer records it today, the rewritten values named in a ``resealed`` field, the receipt
sealed again.

The folder a command ran in is not recorded, so every absolute path counts as lying outside
it and is recorded by its last component: ``command_line`` through the writer's
:func:`~kdabench.receipts.write.portable_command_line`, and in every other string each
absolute path token (see :data:`PATH_TOKEN`). ``sources``, ``git`` and ``created_at`` are
never rewritten, nor is a number. The old values are not kept; ``resealed`` records::

    previous_sha256   the hash the receipt had before this reseal
    original_sha256   the hash its run sealed it with (only on a receipt resealed again)
    at                UTC time of the reseal
    tool_version      kdabench version that resealed it
    rewritten         JSON pointers (RFC 6901) of every value that differs from the run's
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from kdabench.receipts.encoding import ReceiptError, seal, utc_now
from kdabench.receipts.verify import verify_receipt
from kdabench.receipts.write import portable_command_line, tool_version

RESEALED = "resealed"

#: An absolute path inside a string: "/" at the start or after whitespace, "(", "=" or a
#: quote, then two components or more ("/work/main/profiles"); "ms/token", "GB/s" and "/s"
#: are not paths.
PATH_TOKEN = re.compile(r"""(?:^|(?<=[\s(='"]))/(?:[\w.@+~-]+/)+[\w.@+~-]+/?""")

#: Fields never rewritten: the hash, the record of a reseal (its pointers start with "/"),
#: and the run's identity.
_KEPT = frozenset({"sha256", RESEALED, "sources", "git", "created_at"})

#: A relative folder, which no absolute path lies inside: every path counts as outside.
_NO_FOLDER = Path()


def reseal(doc: Mapping[str, Any], *, raw: bytes | None = None) -> tuple[dict[str, Any], list[str]]:
    """``doc`` with its absolute paths rewritten and sealed again, and the JSON pointers of
    the values rewritten; an unchanged copy of ``doc`` and ``[]`` when it holds no absolute
    path.

    Raises :class:`ReceiptError` when ``doc`` does not verify (nor its file bytes ``raw``,
    when given): a tampered receipt is never resealed.
    """
    check = verify_receipt(doc, {}, raw=raw)
    if not check.ok:
        raise ReceiptError(f"does not verify, so it is not resealed: {'; '.join(check.problems)}")
    rewritten: list[str] = []
    body: dict[str, Any] = {}
    for key, value in doc.items():
        if key in _KEPT:
            body[key] = value
        elif key == "command_line":
            body[key] = _portable_argv(value, rewritten)
        else:
            body[key] = _rewrite(value, f"/{_pointer_token(key)}", rewritten)
    if not rewritten:
        return dict(doc), []
    body[RESEALED] = _record(doc, rewritten)
    return seal(body), rewritten


def _record(doc: Mapping[str, Any], rewritten: list[str]) -> dict[str, Any]:
    """The ``resealed`` field: this reseal, carrying an earlier one's original hash and
    pointers."""
    record: dict[str, Any] = {
        "previous_sha256": doc["sha256"],
        "at": utc_now(),
        "tool_version": tool_version(),
        "rewritten": rewritten,
    }
    earlier = doc.get(RESEALED)
    if isinstance(earlier, Mapping):
        record["original_sha256"] = earlier.get("original_sha256", earlier["previous_sha256"])
        before = list(earlier["rewritten"])
        record["rewritten"] = before + [pointer for pointer in rewritten if pointer not in before]
    return record


def _portable_argv(argv: Any, rewritten: list[str]) -> list[str]:
    if not isinstance(argv, list) or not all(isinstance(arg, str) for arg in argv):
        raise ReceiptError("command_line is not a list of strings")
    portable = portable_command_line(argv, _NO_FOLDER)
    rewritten += [f"/command_line/{i}" for i, (old, new) in enumerate(zip(argv, portable))
                  if old != new]
    return portable


def _rewrite(value: Any, pointer: str, rewritten: list[str]) -> Any:
    """``value`` with every absolute path token in its strings replaced by its last
    component; the pointer of each string changed is appended to ``rewritten``."""
    if isinstance(value, str):
        new = PATH_TOKEN.sub(lambda match: PurePosixPath(match.group()).name, value)
        if new != value:
            rewritten.append(pointer)
        return new
    if isinstance(value, Mapping):
        return {key: _rewrite(item, f"{pointer}/{_pointer_token(key)}", rewritten)
                for key, item in value.items()}
    if isinstance(value, list):
        return [_rewrite(item, f"{pointer}/{i}", rewritten) for i, item in enumerate(value)]
    return value


def _pointer_token(key: str) -> str:
    """``key`` escaped for a JSON pointer (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")
