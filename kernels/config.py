"""What a caller asks of the kernel (Caps) and how the kernel is configured for it (KernelConfig)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The caller's side of the contract lives in kernels/contract.py. BACKENDS is re-exported for
# kdabench.qualify.run, which still reads it from here.
from .contract import AUTO_BACKEND, BACKENDS, GATE_MODES, MIN_LOWER_BOUND, VALIDATION_MODES

__all__ = ["AUTO_BACKEND", "BACKENDS", "CHECKPOINT_PATHS", "CHUNK_SIZE", "MAX_SEGMENTS",
           "OPERAND_DTYPES", "PASS_CHECKPOINT_CHUNK", "PIPELINES", "SHARED_MEMORY_BUDGET_BYTES",
           "SOLVES", "Caps", "CuteConfig", "KernelConfig"]

OPERAND_DTYPES = ("float32", "bfloat16")
PIPELINES = ("fused", "split")
SOLVES = ("substitution", "inverse")
CHECKPOINT_PATHS = ("kernel", "pass")
PASS_CHECKPOINT_CHUNK = 16  # the one chunk size of checkpoints "pass" (kernels/triton/prefill.py)
CHUNK_SIZE = 32
SHARED_MEMORY_BUDGET_BYTES = 99 * 1024
MAX_SEGMENTS = 16


@dataclass(frozen=True)
class Caps:
    """Everything a caller will ever ask of one planned prefill.

    device: where it runs. num_heads, head_dim: H and K = V. max_tokens: packed token capacity.
    max_seqs: sequence capacity of the metadata. max_state_slots: slots in the state pool.
    max_checkpoints: checkpoint capacity per sequence (1, 2 or 4; 1 uses vector metadata [N]).
    gate: "precomputed" log decay, or the raw gate fused in kernel ("sigmoid": lower_bound *
    sigmoid(exp(A_log) * (g + dt_bias)); "softplus": max(-exp(A_log) * softplus(g + dt_bias),
    lower_bound)). lower_bound: the smallest log decay the caller guarantees (>= -5).
    backend: "triton", "cute", or "auto" (default): the backend the device's profile entry
    for the query names (the one `kdabench tune` measured fastest), else "triton"; plan()
    resolves it, so a plan's caps always name the backend that runs.
    """

    device: torch.device | str
    num_heads: int
    head_dim: int
    max_tokens: int
    max_seqs: int
    max_state_slots: int
    max_checkpoints: int = 1
    gate: str = GATE_MODES[0]
    lower_bound: float = MIN_LOWER_BOUND
    qk_l2norm: bool = False
    beta_sigmoid: bool = False
    validation: str = VALIDATION_MODES[0]
    backend: str = AUTO_BACKEND


@dataclass(frozen=True)
class KernelConfig:
    """The Triton backend's tunables.

    chunk_size: tokens per sequential step (a multiple of 16). block_v: V columns per state-pass
    program. operand_dtype: storage of the state pass's matrix operands (qg, kd, W, Aqk) and of
    the state and delta fed to its dots: "float32" (tf32 dots) or "bfloat16" (bf16 dots); the
    state itself always accumulates in fp32. pipeline: "fused" runs stage 1 as one program per
    chunk and computes the output inside the state pass; "split" runs stage 1 as parallel
    sub-block kernels, keeps only the state chain in the pass and computes the output in a
    parallel kernel from the stored chunk-start states (faster at few heads and long chunks,
    slower where small chunks make those states many). segments: ranges of the batch's chunks
    whose state passes run at once, joined exactly by each range's transition and a scan
    (kernels/triton/segments.py); 1 is the serial walk. More programs for few heads and
    sequences, for about three times the pass's work. solve (split pipeline only): how stage 1
    turns the chunk's triangular system into W and U: "substitution" solves it by block forward
    substitution in every column-block program; "inverse" forms the chunk's full inverse
    (I + M)^-1 once per chunk and head, then each column block is one product with it
    (kernels/triton/prepare_blocks.py). checkpoints: where an interior checkpoint (one strictly
    inside a chunk) is finished: "kernel" leaves the chunk-start state in its slot for a
    parallel checkpoint kernel after the pass (a second write and a read-back, off the pass's
    chain); "pass" forms it in the pass and writes it once (on the program's chain: faster
    where checkpoints are dense, slower on long single sequences; kernels/triton/prefill.py),
    with 16-token chunks only (PASS_CHECKPOINT_CHUNK).
    """

    chunk_size: int = CHUNK_SIZE
    block_v: int = 32
    num_warps: int = 4
    num_stages: int = 2
    prepare_warps: int = 4
    dot_precision: str = "tf32"
    operand_dtype: str = "float32"
    pipeline: str = "fused"
    segments: int = 1
    solve: str = SOLVES[0]
    checkpoints: str = CHECKPOINT_PATHS[0]


@dataclass(frozen=True)
class CuteConfig:
    """The cute backend's kernels. algorithm: "chunk" (16-token chunks: a chunk-parallel
    preparation, then a state pass on bf16 tensor cores with the state-path products split in
    three, kernels/cute/chunk_source.py), "wgmma" (the same with the pass on warpgroup MMA, one
    warpgroup per 64 V columns holding all K keys, its operands brought by the TMA unit;
    sm_90a only, kernels/cute/wgmma_source.py; key_split does not apply) or "recurrence"
    (token by token on CUDA cores, kernels/cute/source.py). key_split: warps of the chunk pass
    that share one block of 16 V columns, each holding K / key_split of the state's keys (their
    partial products summed through shared memory every chunk). threads and rows_per_thread:
    the recurrence's launch shape, 128 threads per state-pass block, each lane holding 16 of a
    column's K rows."""

    backend: str = "cute"
    threads: int = 128
    rows_per_thread: int = 16
    algorithm: str = "chunk"
    key_split: int = 4
