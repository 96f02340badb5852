"""The two numbers of a shape: bytes it must move, FLOPs it must do, and the floor.

Bytes (each input read once, each output written once; K = V = D):

    q, k, v    bf16 read       3 * T * H * D * 2
    g          fp32 read           T * H * D * 4
    beta       fp32 read           T * H * 4
    o          bf16 written        T * H * D * 2
    states     fp32            (1 initial read + 1 final written + C checkpoints written)
                               * N * H * D * D * 4

with C = 4 checkpoints per sequence (the capacity-4 run the floor is for).

FLOPs of the chunked (WY) form with chunk length c, per head and per chunk of c tokens
(a multiply-add counts 2; the triangular products are counted full, as the tensor cores
do them):

    A_kk = (k e^{g}) (k e^{-g})^T       2 c^2 K
    A_qk = (q e^{g}) (k e^{-g})^T       2 c^2 K
    (I + A_kk)^{-1}, unit lower         2 c^3 / 3
    W = T diag(beta) k e^{g}            2 c^2 K
    U = T diag(beta) v                  2 c^2 V
    delta = U - W S                     2 c K V
    o = (q e^{g}) S + A_qk delta        2 c K V + 2 c^2 V
    S' = e^{g_c} S + (k e^{g_c - g})^T delta   2 c K V

so per token and head: 6 K V + 2 c (3 K + 2 V) + 2 c^2 / 3, and FLOPs = T * H * that.

The floor is max(bytes / copy rate, FLOPs / bf16 matmul rate), both rates measured in the
same run (a device-to-device copy counting bytes read plus written; a large bf16 matmul).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CHECKPOINTS = 4

BYTES_FORMULA = ("3*T*H*D*2 (q,k,v bf16) + T*H*D*4 (g fp32) + T*H*4 (beta fp32) + T*H*D*2 "
                 "(o bf16) + (2 + C)*N*H*D*D*4 (initial read, final and C = 4 checkpoints "
                 "written, fp32)")
FLOPS_FORMULA = ("T*H*(6*K*V + 2*c*(3*K + 2*V) + 2*c^2/3), the chunked WY form with chunk "
                 "length c (see kdabench.bench.work)")


def count_bytes(tokens: int, heads: int, head_dim: int, seqs: int,
                checkpoints: int = CHECKPOINTS) -> int:
    """The fewest bytes one prefill of the shape moves through device memory."""
    t, h, d = tokens, heads, head_dim
    activations = 3 * t * h * d * 2 + t * h * d * 4 + t * h * 4 + t * h * d * 2
    states = (2 + checkpoints) * seqs * h * d * d * 4
    return activations + states


def count_flops(tokens: int, heads: int, head_dim: int, chunk: int) -> float:
    """FLOPs of the chunked form with chunk length ``chunk`` (module docstring)."""
    k = v = head_dim
    per_token = 6 * k * v + 2 * chunk * (3 * k + 2 * v) + 2 * chunk**2 / 3
    return tokens * heads * per_token


@dataclass(frozen=True)
class Ceilings:
    """The two rates measured in this run, with the samples they came from."""

    copy_bytes_per_s: float
    matmul_flops_per_s: float
    details: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"copy_bytes_per_s": self.copy_bytes_per_s,
                "matmul_flops_per_s": self.matmul_flops_per_s, **self.details}


def floor(tokens: int, heads: int, head_dim: int, seqs: int, chunk: int,
          ceilings: Ceilings) -> dict[str, Any]:
    """Bytes, FLOPs, the time of each at the measured rates, and the floor (the larger)."""
    moved = count_bytes(tokens, heads, head_dim, seqs)
    flops = count_flops(tokens, heads, head_dim, chunk)
    bytes_ms = moved / ceilings.copy_bytes_per_s * 1e3
    flops_ms = flops / ceilings.matmul_flops_per_s * 1e3
    return {"bytes": moved, "flops": flops, "bytes_ms": bytes_ms, "flops_ms": flops_ms,
            "ms": max(bytes_ms, flops_ms), "bound": "bytes" if bytes_ms >= flops_ms else "flops",
            "flop_chunk": chunk}
