"""The PNG plots beside a bench receipt: time against T per kernel (each further kernel
backend's ``kdabench-<backend>`` a line of its own), with the floor, one plot per mode, drawn
by :func:`kdabench.report.plot_bench`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def plot_receipt(receipt: Mapping[str, Any], receipt_path: Path) -> list[Path]:
    """``<receipt stem>-<mode>.png`` for every mode the receipt measured; the paths drawn."""
    from kdabench.report import bench_points, plot_bench

    device = str((receipt.get("device") or {}).get("name") or "unknown device")
    drawn = []
    for mode in receipt.get("config", {}).get("modes", []):
        points = []
        for case in receipt.get("cases", []):
            kernels = (case.get("modes") or {}).get(mode)
            if not kernels:
                continue
            points += bench_points({**case, "kernels": kernels})
        path = receipt_path.with_name(f"{receipt_path.stem}-{mode}.png")
        if plot_bench(points, path, f"{device} · {mode}"):
            drawn.append(path)
    return drawn
