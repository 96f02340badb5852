"""The policy catalog: what a planned KDA prefill is looked up by, and what it resolves to.

The KDA prefill is registered here (`CATALOG["kda_prefill"]`) with two versioned schemas:

* the query, `KdaQuery`: heads, head_dim, the activation dtype, the checkpoint capacity, the
  gate mode, and power-of-two buckets of the token and sequence capacities (`token_bucket`
  is the smallest power of two >= max_tokens; `seq_bucket` likewise for max_seqs);
* the config: the fields of `KernelConfig`, read from the dataclass itself
  (`dataclasses.fields`), so a new tunable joins the schema without an edit here.

A profile (kernels/profiles.py) names both schemas; one that does not match the catalog's is
refused with `KdaPolicyError`. Bump a version when a field changes meaning; adding or
removing a field changes the schema by itself (the field names are part of it).

Config schema v2 added `segments`, v3 `solve`, v4 `checkpoints`. Older profiles still load:
their entries were tuned with the serial walk (segments = 1), the substitution solve and the
checkpoint kernel (CONFIG_ADDITIONS names what each version added, and a profile of an older
one gets every later addition).

`config_problems` is the validity rule every config must pass (an explicit one in plan(),
a profile entry, a tuning candidate); `shared_memory_estimate` is the tuner's pre-filter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from . import config as kernel_config
from .config import Caps, KernelConfig

QUERY_VERSION = 1
CONFIG_VERSION = 4
# per config schema version: the fields it added, with the value entries of earlier versions
# ran with
CONFIG_ADDITIONS: dict[int, dict[str, Any]] = {2: {"segments": 1}, 3: {"solve": "substitution"},
                                               4: {"checkpoints": "kernel"}}
QUERY_FIELDS = ("heads", "head_dim", "dtype", "capacity", "gate", "token_bucket", "seq_bucket")
WARP_COUNTS = (1, 2, 4, 8, 16)
DOT_PRECISIONS = ("tf32", "tf32x3", "ieee")
MIN_DOT_DIM = 16  # tl.dot needs every tile dimension >= 16
FP32_BYTES = 4


class KdaPolicyError(ValueError):
    """A kernel config that cannot be resolved: a bad policy mode, a profile that does not
    load or match the catalog's schemas, or PREPLANNED_ONLY without a profile entry."""


def power_of_two_at_least(value: int) -> int:
    """The smallest power of two >= value (1 for value <= 1)."""
    return 1 << max(int(value) - 1, 0).bit_length()


def dtype_name(dtype: torch.dtype | str) -> str:
    """torch.bfloat16 -> "bfloat16"; a string is checked and made canonical ("half" ->
    "float16")."""
    found = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise KdaPolicyError(f"{dtype!r} is not a torch dtype")
    return str(found).removeprefix("torch.")


@dataclass(frozen=True)
class KdaQuery:
    """What the KDA prefill's config is looked up by (schema version QUERY_VERSION)."""

    heads: int
    head_dim: int
    dtype: str
    capacity: int
    gate: str
    token_bucket: int
    seq_bucket: int

    @classmethod
    def from_caps(cls, caps: Caps, activation_dtype: torch.dtype | str = torch.bfloat16
                  ) -> KdaQuery:
        return cls(heads=caps.num_heads, head_dim=caps.head_dim,
                   dtype=dtype_name(activation_dtype), capacity=caps.max_checkpoints,
                   gate=caps.gate, token_bucket=power_of_two_at_least(caps.max_tokens),
                   seq_bucket=power_of_two_at_least(caps.max_seqs))

    @classmethod
    def from_dict(cls, data: Any, where: str = "query") -> KdaQuery:
        """A query from its JSON form; KdaPolicyError names what is missing or wrong."""
        if not isinstance(data, dict):
            raise KdaPolicyError(f"{where}: a query is an object, found {type(data).__name__}")
        if sorted(data) != sorted(QUERY_FIELDS):
            raise KdaPolicyError(f"{where}: query fields {sorted(data)}, the catalog's are "
                                 f"{sorted(QUERY_FIELDS)}")
        for name in QUERY_FIELDS:
            expected = str if name in ("dtype", "gate") else int
            value = data[name]
            if isinstance(value, bool) or not isinstance(value, expected):
                raise KdaPolicyError(f"{where}: query field {name} must be "
                                     f"{expected.__name__}, got {value!r}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One line naming the query and its version, for messages and config sources."""
        return (f"query v{QUERY_VERSION} heads={self.heads} head_dim={self.head_dim} "
                f"dtype={self.dtype} capacity={self.capacity} gate={self.gate} "
                f"tokens<={self.token_bucket} seqs<={self.seq_bucket}")


# --------------------------------------------------------------------------- config schema


def config_fields() -> dict[str, dataclasses.Field]:
    """KernelConfig's fields by name, in declaration order."""
    return {f.name: f for f in dataclasses.fields(KernelConfig)}


def config_defaults() -> dict[str, Any]:
    """KernelConfig's default values, read from the dataclass."""
    return dataclasses.asdict(KernelConfig())


def config_schema() -> dict[str, Any]:
    """The config schema as profiles record it: version, and each field's type and default."""
    defaults = config_defaults()
    return {"version": CONFIG_VERSION,
            "fields": {name: {"type": type(defaults[name]).__name__, "default": defaults[name]}
                       for name in config_fields()}}


def query_schema() -> dict[str, Any]:
    """The query schema as profiles record it: version and field names."""
    return {"version": QUERY_VERSION, "fields": list(QUERY_FIELDS)}


def config_to_dict(config: KernelConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)


def config_from_dict(data: Any, where: str = "config") -> KernelConfig:
    """A KernelConfig from its JSON form: exactly the dataclass's fields, of their types."""
    if not isinstance(data, dict):
        raise KdaPolicyError(f"{where}: a config is an object, found {type(data).__name__}")
    defaults = config_defaults()
    if sorted(data) != sorted(defaults):
        missing = sorted(set(defaults) - set(data))
        unknown = sorted(set(data) - set(defaults))
        raise KdaPolicyError(f"{where}: config fields differ from KernelConfig's (missing "
                             f"{missing or 'none'}, unknown {unknown or 'none'})")
    for name, value in data.items():
        if not same_type(value, defaults[name]):
            raise KdaPolicyError(f"{where}: config field {name} must be "
                                 f"{type(defaults[name]).__name__}, got {value!r}")
    return KernelConfig(**data)


def same_type(value: Any, default: Any) -> bool:
    """Whether `value` may stand for a field whose default is `default` (ints are no bools)."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


# --------------------------------------------------------------------------- validity


def _power_of_two(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        and value & (value - 1) == 0


def config_problems(config: KernelConfig, head_dim: int) -> list[str]:
    """Why `config` cannot run a prefill with K = V = head_dim (empty when it can).

    The rule: block_v a power of two in [16, head_dim] that divides head_dim; chunk_size a
    multiple of 16 (tl.dot tiles); num_warps and prepare_warps in 1, 2, 4, 8, 16;
    num_stages >= 1; dot_precision one of Triton's input precisions; operand_dtype one of
    kernels.config.OPERAND_DTYPES; pipeline one of kernels.config.PIPELINES; segments in
    1..kernels.config.MAX_SEGMENTS; solve one of kernels.config.SOLVES, "inverse" only with
    the split pipeline; checkpoints one of kernels.config.CHECKPOINT_PATHS, "pass" only with
    16-token chunks (kernels.config.PASS_CHECKPOINT_CHUNK). Fields KernelConfig does not have
    are not checked.
    """
    problems = []
    values = config_to_dict(config)
    block_v = values.get("block_v")
    if block_v is not None:
        if isinstance(block_v, bool) or not isinstance(block_v, int) or block_v <= 0 \
                or head_dim % block_v:
            problems.append(f"block_v {block_v} does not divide head_dim {head_dim}")
        elif not _power_of_two(block_v) or not MIN_DOT_DIM <= block_v <= head_dim:
            problems.append(f"block_v {block_v} must be a power of two in "
                            f"[{MIN_DOT_DIM}, {head_dim}]")
    chunk_size = values.get("chunk_size")
    if chunk_size is not None and not (isinstance(chunk_size, int) and chunk_size > 0
                                       and chunk_size % MIN_DOT_DIM == 0):
        problems.append(f"chunk_size {chunk_size} must be a multiple of {MIN_DOT_DIM}")
    for name in ("num_warps", "prepare_warps"):
        if name in values and values[name] not in WARP_COUNTS:
            problems.append(f"{name} {values[name]} must be one of {WARP_COUNTS}")
    stages = values.get("num_stages")
    if stages is not None and not (isinstance(stages, int) and stages >= 1):
        problems.append(f"num_stages {stages} must be >= 1")
    precision = values.get("dot_precision")
    if precision is not None and precision not in DOT_PRECISIONS:
        problems.append(f"dot_precision {precision!r} must be one of {DOT_PRECISIONS}")
    pipeline = values.get("pipeline")
    if pipeline is not None and pipeline not in kernel_config.PIPELINES:
        problems.append(f"pipeline {pipeline!r} must be one of {kernel_config.PIPELINES}")
    segments = values.get("segments")
    if segments is not None and not (isinstance(segments, int) and not isinstance(segments, bool)
                                     and 1 <= segments <= kernel_config.MAX_SEGMENTS):
        problems.append(f"segments {segments} must be in 1..{kernel_config.MAX_SEGMENTS}")
    solve = values.get("solve")
    if solve is not None and solve not in kernel_config.SOLVES:
        problems.append(f"solve {solve!r} must be one of {kernel_config.SOLVES}")
    elif solve == "inverse" and pipeline not in (None, "split"):
        problems.append(f"solve 'inverse' runs in the split pipeline only (got {pipeline!r})")
    checkpoints = values.get("checkpoints")
    pass_chunk = kernel_config.PASS_CHECKPOINT_CHUNK
    if checkpoints is not None and checkpoints not in kernel_config.CHECKPOINT_PATHS:
        problems.append(f"checkpoints {checkpoints!r} must be one of "
                        f"{kernel_config.CHECKPOINT_PATHS}")
    elif checkpoints == "pass" and chunk_size not in (None, pass_chunk):
        problems.append(f"checkpoints 'pass' runs with {pass_chunk}-token chunks only (got "
                        f"chunk_size {chunk_size})")
    operand_dtypes = getattr(kernel_config, "OPERAND_DTYPES", None)
    operand = values.get("operand_dtype")
    if operand is not None and operand_dtypes is not None and operand not in operand_dtypes:
        problems.append(f"operand_dtype {operand!r} must be one of {tuple(operand_dtypes)}")
    return problems


def shared_memory_estimate(config: KernelConfig, head_dim: int) -> int:
    """Bytes of shared memory the state pass is estimated to need under `config`.

    The rule: the largest tl.dot of a chunk stages its operands in shared memory, and the
    loop's loads are multi-buffered num_stages times. The dots are W [C, K] x S [K, BV] (and
    qg likewise), kd^T [K, C] x delta [C, BV] and Aqk [C, C] x delta [C, BV], so with E the
    operand size (4 bytes, 2 for operand_dtype "bfloat16")
        bytes = num_stages * E * max(C*K + K*BV, K*C + C*BV, C*C + C*BV).
    A pre-filter for tuning against SHARED_MEMORY_BUDGET_BYTES, not a promise: a candidate
    that still does not compile is recorded as such.
    """
    values = config_to_dict(config)
    chunk = values.get("chunk_size", kernel_config.CHUNK_SIZE)
    block_v = values.get("block_v", head_dim)
    stages = max(int(values.get("num_stages", 1)), 1)
    widest = max(chunk * head_dim + head_dim * block_v, head_dim * chunk + chunk * block_v,
                 chunk * chunk + chunk * block_v)
    element = 2 if values.get("operand_dtype") == "bfloat16" else FP32_BYTES
    return stages * element * widest


def shared_memory_budget() -> int:
    """The kernel's shared-memory budget per program (kernels.config), read at call time."""
    return int(kernel_config.SHARED_MEMORY_BUDGET_BYTES)


# --------------------------------------------------------------------------- the catalog


@dataclass(frozen=True)
class CatalogEntry:
    """One operator of the catalog: its query and config schemas."""

    operator: str
    query_type: type
    config_type: type

    def schema(self) -> dict[str, Any]:
        """Both schemas, as a profile records them."""
        return {"query": query_schema(), "config": config_schema()}


CATALOG: dict[str, CatalogEntry] = {
    "kda_prefill": CatalogEntry("kda_prefill", KdaQuery, KernelConfig),
}
KDA_PREFILL = CATALOG["kda_prefill"]
