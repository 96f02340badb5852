"""The PNG plots beside a bench receipt: time against T per kernel (each further kernel
backend's ``kdabench-<backend>`` a line of its own), with the floor, one plot per mode and
gate regime, drawn by :func:`kdabench.report.plot_bench`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def plot_receipt(receipt: Mapping[str, Any], receipt_path: Path) -> list[Path]:
    """``<receipt stem>-<mode>-<regime>.png`` for every mode the receipt measured and every
    gate regime of its cases (``<receipt stem>-<mode>.png`` for a receipt whose cases record
    no regime); the paths drawn."""
    from kdabench.report import bench_points, plot_bench

    device = str((receipt.get("device") or {}).get("name") or "unknown device")
    cases = receipt.get("cases", [])
    regimes = list(dict.fromkeys((case.get("gates") or {}).get("name") for case in cases))
    drawn = []
    for mode in receipt.get("config", {}).get("modes", []):
        for regime in regimes:
            points = []
            for case in cases:
                kernels = (case.get("modes") or {}).get(mode)
                if not kernels or (case.get("gates") or {}).get("name") != regime:
                    continue
                points += bench_points({**case, "kernels": kernels})
            suffix = mode if regime is None else f"{mode}-{regime}"
            title = f"{device} · {mode}" + ("" if regime is None else f" · {regime} gates")
            path = receipt_path.with_name(f"{receipt_path.stem}-{suffix}.png")
            if plot_bench(points, path, title):
                drawn.append(path)
    return drawn
