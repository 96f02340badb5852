"""The queries file of `kdabench tune` (schema ``kdabench.tune-queries.v1``).

    from kdabench.tune.queries import load_queries

    queries = load_queries(None)       # the packaged kdabench/data/tune.toml
    queries.queries[0].id              # "8192x8x1-C4-precomputed"

Top-level keys: ``schema`` (required), ``name``, ``head_dim`` (64 or 128; default 128),
``dtype`` (of q, k, v: bfloat16, float16 or float32; default bfloat16), ``gates`` (default
["precomputed"]), ``capacities`` (default [4, 1]), ``lower_bound`` (in [-5, 0); default -5),
``seed`` (default 0), ``shortlist`` (default 0: every query times the whole grid; n > 0: the
later capacities and gates of a shape time only the heuristic and the n fastest configs of
the shape's first query, which saves most of the compiles). Tables:

* ``[timing]`` ``reps`` (default 50) and ``warmup`` (default 5) per candidate config, and
  ``min_gain`` (default 0.03): a candidate replaces the heuristic only when its median is at
  least that fraction faster, so noise never trades the fallback for an equal config;
* ``[check]`` the oracle check of each winner on a smaller instance of its query: at most
  ``max_seqs`` (default 4) sequences of at most ``max_tokens / seqs`` tokens (default 1024,
  never under 32 per sequence), and ``tolerances`` = {output, state} (relative Frobenius
  error against the float64 recurrence; default 5e-3 and 3e-3, as the qualify matrix);
* ``[grid]`` lists of values for KernelConfig fields (any field of the dataclass; the others
  keep their defaults).

Each ``[[query]]`` has ``tokens``, ``heads`` and ``seqs`` (default 1) equal-length sequences,
and is expanded over ``capacities`` x ``gates``. Anything else is refused with
:class:`QueriesError`, one line naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdabench.bench.shapes import BenchShape
from kdabench.datafiles import load_data_file, parse_toml
from kdabench.kernels.contract import ACTIVATION_DTYPES, CAPACITIES, GATE_MODES, HEAD_DIMS

SCHEMA = "kdabench.tune-queries.v1"
DEFAULT_QUERIES = "tune.toml"  # in kdabench/data/
MIN_CHECK_LEN = 32  # four strictly increasing interior checkpoints
TOP_KEYS = {"schema", "name", "head_dim", "dtype", "gates", "capacities", "lower_bound", "seed",
            "shortlist", "timing", "check", "grid", "query"}
QUERY_KEYS = {"tokens", "heads", "seqs"}
TIMING_DEFAULTS = {"reps": 50, "warmup": 5, "min_gain": 0.03}
CHECK_DEFAULTS = {"max_tokens": 1024, "max_seqs": 4}
TOLERANCE_DEFAULTS = {"output": 5e-3, "state": 3e-3}


class QueriesError(ValueError):
    """A queries file that cannot be used; one line naming the file and what is wrong."""


@dataclass(frozen=True)
class TuneQuery:
    """One query to tune: a shape, a capacity, a gate, and the settings they share."""

    shape: BenchShape
    capacity: int
    gate: str
    head_dim: int
    dtype: str
    lower_bound: float

    @property
    def id(self) -> str:
        """"8192x8x1-C4-precomputed"."""
        return f"{self.shape.label}-C{self.capacity}-{self.gate}"

    def caps(self, device: Any, shape: BenchShape | None = None):
        """The Caps a plan of this query (or of `shape`, a smaller instance) is made with."""
        from kdabench.bench.work import CHECKPOINTS
        from kdabench.kernels import Caps

        shape = shape or self.shape
        return Caps(device=device, num_heads=shape.heads, head_dim=self.head_dim,
                    max_tokens=shape.tokens, max_seqs=shape.seqs,
                    max_state_slots=shape.seqs * (2 + CHECKPOINTS),
                    max_checkpoints=self.capacity, gate=self.gate, lower_bound=self.lower_bound)

    def catalog_query(self):
        """The catalog's KdaQuery this query's profile entry answers."""
        from kdabench.kernels import KdaQuery

        return KdaQuery.from_caps(self.caps("cpu"), self.dtype)

    def check_shape(self, max_tokens: int, max_seqs: int) -> BenchShape:
        """The smaller instance the oracle check runs: fewer, shorter sequences."""
        seqs = min(self.shape.seqs, max_seqs)
        seq_len = min(self.shape.seq_len, max(max_tokens // seqs, MIN_CHECK_LEN))
        return BenchShape(seqs * seq_len, self.shape.heads, seqs)


@dataclass(frozen=True)
class TuneQueries:
    """A loaded queries file: where it came from, its settings and its expanded queries."""

    origin: str
    sha256: str
    name: str
    seed: int
    timing: dict[str, Any]
    check: dict[str, Any]
    grid: dict[str, list[Any]]
    queries: tuple[TuneQuery, ...]
    document: dict[str, Any] = field(repr=False)
    shortlist: int = 0


def select_queries(queries: TuneQueries, patterns: list[str] | tuple[str, ...]) -> TuneQueries:
    """The queries whose id matches any of the shell-style `patterns` (all when none), so a
    long file can be tuned in parts; QueriesError when a pattern matches nothing."""
    if not patterns:
        return queries
    idle = [p for p in patterns if not any(fnmatch.fnmatchcase(q.id, p) for q in queries.queries)]
    if idle:
        known = ", ".join(q.id for q in queries.queries)
        raise QueriesError(f"--only {idle[0]!r} matches no query of {queries.origin} "
                           f"(ids: {known})")
    chosen = tuple(q for q in queries.queries
                   if any(fnmatch.fnmatchcase(q.id, p) for p in patterns))
    return dataclasses.replace(queries, queries=chosen)


def load_queries(path: str | Path | None = None) -> TuneQueries:
    """Load and validate a queries file; None loads the packaged default."""
    return load_data_file(path, DEFAULT_QUERIES, "queries file", QueriesError, parse_queries)


def parse_queries(raw: bytes | str, *, origin: str = "queries") -> TuneQueries:
    """Parse and validate queries TOML (bytes or text); ``origin`` names it in errors."""
    document, digest = parse_toml(raw, origin, QueriesError)
    return _Validator(origin).validate(document, digest)


class _Validator:
    def __init__(self, origin: str) -> None:
        self.origin = origin

    def fail(self, message: str) -> QueriesError:
        return QueriesError(f"{self.origin}: {message}")

    def integer(self, where: str, value: Any, minimum: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(f"{where} must be an integer >= {minimum}, got {value!r}")
        return value

    def number(self, where: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise self.fail(f"{where} must be a number > 0, got {value!r}")
        return float(value)

    def choices(self, where: str, value: Any, allowed: tuple) -> list:
        if not isinstance(value, list) or not value:
            raise self.fail(f"{where} must be a non-empty list, got {value!r}")
        bad = [v for v in value if v not in allowed or isinstance(v, bool)]
        if bad:
            raise self.fail(f"{where}: {bad} not among {list(allowed)}")
        return list(dict.fromkeys(value))

    def table(self, where: str, value: Any, keys: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(f"[{where}] must be a table")
        unknown = sorted(set(value) - keys)
        if unknown:
            raise self.fail(f"[{where}]: unknown key(s) {', '.join(unknown)} (known: "
                            f"{', '.join(sorted(keys))})")
        return value

    def validate(self, document: dict[str, Any], sha256: str) -> TuneQueries:
        if document.get("schema") != SCHEMA:
            raise self.fail(f"schema must be {SCHEMA!r}, got {document.get('schema')!r}")
        unknown = sorted(set(document) - TOP_KEYS)
        if unknown:
            raise self.fail(f"unknown key(s) {', '.join(unknown)} (known: "
                            f"{', '.join(sorted(TOP_KEYS))})")
        head_dim = document.get("head_dim", 128)
        if head_dim not in HEAD_DIMS or isinstance(head_dim, bool):
            raise self.fail(f"head_dim must be one of {HEAD_DIMS}, got {head_dim!r}")
        dtype = document.get("dtype", "bfloat16")
        if dtype not in ACTIVATION_DTYPES:
            raise self.fail(f"dtype must be one of {ACTIVATION_DTYPES}, got {dtype!r}")
        gates = self.choices("gates", document.get("gates", ["precomputed"]), GATE_MODES)
        capacities = self.choices("capacities", document.get("capacities", [4, 1]), CAPACITIES)
        lower_bound = document.get("lower_bound", -5.0)
        if (isinstance(lower_bound, bool) or not isinstance(lower_bound, (int, float))
                or not -5.0 <= lower_bound < 0):
            raise self.fail(f"lower_bound must be a number in [-5, 0), got {lower_bound!r}")
        seed = self.integer("seed", document.get("seed", 0), minimum=0)
        shortlist = self.integer("shortlist", document.get("shortlist", 0), minimum=0)
        timing = self.timing(document.get("timing", {}))
        check = self.check(document.get("check", {}))
        grid = self.grid(document.get("grid", {}))
        shapes = self.shapes(document.get("query"))
        queries = [TuneQuery(shape, capacity, gate, int(head_dim), dtype, float(lower_bound))
                   for shape, capacity, gate in itertools.product(shapes, capacities, gates)]
        self.distinct(queries)
        return TuneQueries(origin=self.origin, sha256=sha256,
                           name=str(document.get("name", "queries")), seed=seed, timing=timing,
                           check=check, grid=grid, queries=tuple(queries), document=document,
                           shortlist=shortlist)

    def timing(self, value: Any) -> dict[str, Any]:
        table = self.table("timing", value, set(TIMING_DEFAULTS))
        min_gain = table.get("min_gain", TIMING_DEFAULTS["min_gain"])
        if (isinstance(min_gain, bool) or not isinstance(min_gain, (int, float))
                or not 0 <= min_gain < 1):
            raise self.fail(f"timing.min_gain must be a number in [0, 1), got {min_gain!r}")
        return {"reps": self.integer("timing.reps", table.get("reps", TIMING_DEFAULTS["reps"])),
                "warmup": self.integer("timing.warmup",
                                       table.get("warmup", TIMING_DEFAULTS["warmup"]), 0),
                "min_gain": float(min_gain)}

    def check(self, value: Any) -> dict[str, Any]:
        table = self.table("check", value, {*CHECK_DEFAULTS, "tolerances"})
        tolerances = self.table("check.tolerances", table.get("tolerances", {}),
                                set(TOLERANCE_DEFAULTS))
        return {
            "max_tokens": self.integer("check.max_tokens", table.get(
                "max_tokens", CHECK_DEFAULTS["max_tokens"]), MIN_CHECK_LEN),
            "max_seqs": self.integer("check.max_seqs",
                                     table.get("max_seqs", CHECK_DEFAULTS["max_seqs"])),
            "tolerances": {name: self.number(f"check.tolerances.{name}",
                                             tolerances.get(name, default))
                           for name, default in TOLERANCE_DEFAULTS.items()},
        }

    def grid(self, value: Any) -> dict[str, list[Any]]:
        """Lists of values per KernelConfig field, of the field's type (from the dataclass)."""
        from kdabench.kernels.catalog import config_defaults, same_type

        defaults = config_defaults()
        table = self.table("grid", value, set(defaults))
        grid = {}
        for name, values in table.items():
            if not isinstance(values, list) or not values:
                raise self.fail(f"grid.{name} must be a non-empty list, got {values!r}")
            bad = [v for v in values if not same_type(v, defaults[name])]
            if bad:
                raise self.fail(f"grid.{name}: {bad} are not of KernelConfig.{name}'s type "
                                f"{type(defaults[name]).__name__}")
            grid[name] = list(dict.fromkeys(values))
        return grid

    def shapes(self, entries: Any) -> list[BenchShape]:
        if not isinstance(entries, list) or not entries:
            raise self.fail("no [[query]] entries")
        shapes: list[BenchShape] = []
        for number, entry in enumerate(entries, start=1):
            where = f"query {number}"
            self.table(where, entry, QUERY_KEYS)
            for key in ("tokens", "heads"):
                if key not in entry:
                    raise self.fail(f"{where}: missing {key!r}")
            tokens = self.integer(f"{where}: tokens", entry["tokens"])
            heads = self.integer(f"{where}: heads", entry["heads"])
            seqs = self.integer(f"{where}: seqs", entry.get("seqs", 1))
            if tokens % seqs:
                raise self.fail(f"{where}: seqs {seqs} does not divide tokens {tokens} "
                                "(sequences are of equal length)")
            shape = BenchShape(tokens, heads, seqs)
            if shape.seq_len < MIN_CHECK_LEN:
                raise self.fail(f"{where}: sequences of {shape.seq_len} tokens; the tuner's "
                                f"checkpoints need at least {MIN_CHECK_LEN}")
            if shape in shapes:
                raise self.fail(f"{where}: {shape.label} is listed twice")
            shapes.append(shape)
        return shapes

    def distinct(self, queries: list[TuneQuery]) -> None:
        """Two shapes in the same token and sequence buckets would answer one query twice."""
        seen: dict[Any, TuneQuery] = {}
        for query in queries:
            key = query.catalog_query()
            if key in seen:
                raise self.fail(f"{query.id} and {seen[key].id} fall into the same catalog "
                                f"query ({key.describe()}); keep one of them")
            seen[key] = query
