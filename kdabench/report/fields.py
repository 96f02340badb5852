"""Field access: values read from receipt cases whatever their layout.

Anything absent is None (shown as "-" and never stopping a report); numbers stored as
"nan"/"inf" strings (see :func:`kdabench.receipts.sanitize`) are read as floats.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any


def get_field(case: Mapping[str, Any], *names: str) -> Any:
    """The first present, non-None value among dotted field names ("shape.tokens")."""
    for name in names:
        value: Any = case
        for part in name.split("."):
            if isinstance(value, Mapping) and part in value:
                value = value[part]
            else:
                value = None
                break
        if value is not None:
            return value
    return None


def to_number(value: Any) -> float | None:
    """A float from a receipt value (numbers, or the strings "nan"/"inf"/"-inf")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    return None


def finite_numbers(values: Any) -> list[float]:
    if not isinstance(values, (list, tuple)):
        return []
    return [n for n in (to_number(v) for v in values) if n is not None and math.isfinite(n)]


def worst(values: Iterable[float | None]) -> float | None:
    """The largest value, NaN counting as worst of all; None when there is none."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return max(present, key=lambda v: math.inf if math.isnan(v) else v)
