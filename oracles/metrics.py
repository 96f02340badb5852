"""The one comparison the project uses: relative Frobenius error against a float64 reference."""

from __future__ import annotations

import torch


def relative_error(ref: torch.Tensor, out: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| (Frobenius, float64); inf if out has NaN/inf; ||out - ref|| if ref == 0."""
    if ref.shape != out.shape:
        raise ValueError(f"shape mismatch: ref {list(ref.shape)} vs out {list(out.shape)}")
    ref = ref.detach().to(torch.float64)
    out = out.detach().to(device=ref.device, dtype=torch.float64)
    if not torch.isfinite(ref).all():
        raise ValueError("the reference holds NaN or inf")
    if not torch.isfinite(out).all():
        return float("inf")
    diff = torch.linalg.vector_norm(out - ref).item()
    norm = torch.linalg.vector_norm(ref).item()
    return diff / norm if norm > 0 else diff


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, tol: float) -> float:
    """Raise AssertionError naming `name` and the measured error when it exceeds tol; return it."""
    error = relative_error(ref, out)
    if not error <= tol:
        raise AssertionError(f"{name}: relative error {error:.3e} exceeds tolerance {tol:.1e}")
    return error
