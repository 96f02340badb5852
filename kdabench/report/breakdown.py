"""A bench kernel's GPU breakdown (a receipt's ``breakdown`` record) as one line of text,
for `kdabench bench`'s console and `kdabench report`."""

from __future__ import annotations

from typing import Any

SHOWN_KERNELS = 6  # GPU kernels a rendered breakdown names, largest first


def short_kernel_name(name: str) -> str:
    """A GPU kernel's name without template arguments, signature or namespace: "void
    at::native::vectorized_elementwise_kernel<4, ...>(...)" -> "vectorized_elementwise_kernel"."""
    bare = name.removeprefix("void ").split("<")[0].split("(")[0]
    return bare.rsplit("::", 1)[-1] or name


def breakdown_line(record: dict[str, Any], shown: int = SHOWN_KERNELS) -> str:
    """One line: the GPU time per call, then the largest kernels' shares (sorted here: a
    receipt read back has its keys in canonical, alphabetical order)."""
    kernels = sorted(record.get("kernels_us", {}).items(), key=lambda item: -item[1])
    parts = [f"{short_kernel_name(name)} {us:.0f}" for name, us in kernels[:shown]]
    if len(kernels) > shown:
        parts.append(f"{len(kernels) - shown} more {sum(us for _, us in kernels[shown:]):.0f}")
    return f"{record.get('gpu_us', 0):.0f} us: " + ", ".join(parts)
