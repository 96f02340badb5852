"""How kernels name a folder in what they report (a plan's config source, its origin), so
that a receipt holding the line names no machine's folders."""

from __future__ import annotations

from pathlib import Path


def shown_folder(directory: str | Path) -> str:
    """``directory`` as a report names it: as given when relative; else relative to the current
    directory or the home folder (``~/...``), whichever of the two holds it more closely; else
    by its last component."""
    path = Path(directory)
    if not path.is_absolute():
        return str(path)
    holders = [(base, prefix) for base, prefix in ((Path.cwd(), ""), (Path.home(), "~/"))
               if path.is_relative_to(base) and path != base]
    if not holders:
        return path.name
    base, prefix = max(holders, key=lambda holder: len(holder[0].parts))
    return prefix + str(path.relative_to(base))
