"""The shapes file of `kdabench bench` (schema ``kdabench.bench-shapes.v1``).

    from kdabench.bench.shapes import load_shapes

    shapes = load_shapes(None)          # the packaged default set, kdabench/data/bench-shapes.toml
    shapes.shapes[0].label              # "8192x8x1"
    load_shapes("quick"), load_shapes("mine.toml")    # a packaged set by name, or a file

Packaged sets (:data:`SHAPE_SETS`): ``default`` (nine shapes, 8192 to 65536 tokens) and
``quick`` (three shapes for kernel work: a short single sequence, a long one with few heads,
many short sequences; kdabench/data/bench-shapes-quick.toml). A name wins over a file of the
same name (write ``./quick`` for the file).

Top-level keys: ``schema`` (required), ``name``, ``head_dim`` (64 or 128; default 128),
``lower_bound`` (in [-5, 0); default -5), ``seed`` (default 0), ``flop_chunk`` (the chunk
length of the FLOP count, default 16). Each ``[[shape]]`` has ``tokens`` (T), ``heads`` (H)
and ``seqs`` (default 1) equal-length sequences; ``seqs`` must divide ``tokens``, and
sequences need at least 16 tokens (four interior checkpoints). Anything
else is refused with :class:`ShapesError`, one line naming the file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kdabench.datafiles import packaged_bytes, parse_toml, read_bytes
from kdabench.kernels.contract import HEAD_DIMS

SCHEMA = "kdabench.bench-shapes.v1"
SHAPE_SETS = {"default": "bench-shapes.toml", "quick": "bench-shapes-quick.toml"}  # data/
TOP_KEYS = {"schema", "name", "head_dim", "lower_bound", "seed", "flop_chunk", "shape"}
SHAPE_KEYS = {"tokens", "heads", "seqs"}
MIN_SEQ_LEN = 16  # four strictly increasing interior checkpoint offsets


class ShapesError(ValueError):
    """A shapes file that cannot be used; one line naming the file and what is wrong."""


@dataclass(frozen=True)
class BenchShape:
    """One packed batch: ``seqs`` sequences of ``tokens // seqs`` tokens, ``heads`` heads."""

    tokens: int
    heads: int
    seqs: int = 1

    @property
    def seq_len(self) -> int:
        return self.tokens // self.seqs

    @property
    def lengths(self) -> list[int]:
        return [self.seq_len] * self.seqs

    @property
    def label(self) -> str:
        """"8192x8x1", or "8192x8x(4x2048)" for several sequences."""
        seqs = "1" if self.seqs == 1 else f"({self.seqs}x{self.seq_len})"
        return f"{self.tokens}x{self.heads}x{seqs}"


@dataclass(frozen=True)
class ShapeSet:
    """A loaded shapes file: where it came from (``set_name``: the packaged set's name, None
    for a file of the user's), its settings and shapes."""

    origin: str
    sha256: str
    name: str
    head_dim: int
    lower_bound: float
    seed: int
    flop_chunk: int
    shapes: tuple[BenchShape, ...]
    document: dict[str, Any]
    set_name: str | None = None


def load_shapes(spec: str | Path | None = None) -> ShapeSet:
    """Load and validate a packaged set by name (:data:`SHAPE_SETS`) or a shapes file; None
    loads the packaged default."""
    name = "default" if spec is None else spec
    if isinstance(name, str) and name in SHAPE_SETS:
        found = parse_shapes(packaged_bytes(SHAPE_SETS[name]), origin=name)
        return replace(found, set_name=name)
    if not Path(name).exists():
        raise ShapesError(f"{name}: no such shapes file, nor a packaged set "
                          f"({', '.join(SHAPE_SETS)})")
    return parse_shapes(read_bytes(name, "shapes file", ShapesError), origin=str(name))


def parse_shapes(raw: bytes | str, *, origin: str = "shapes") -> ShapeSet:
    """Parse and validate shapes TOML (bytes or text); ``origin`` names it in errors."""
    document, digest = parse_toml(raw, origin, ShapesError)
    return _validate(document, origin, digest)


def _integer(origin: str, where: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ShapesError(f"{origin}: {where} must be an integer >= {minimum}, got {value!r}")
    return value


def _validate(document: dict[str, Any], origin: str, sha256: str) -> ShapeSet:
    if document.get("schema") != SCHEMA:
        raise ShapesError(f"{origin}: schema must be {SCHEMA!r}, got {document.get('schema')!r}")
    unknown = sorted(set(document) - TOP_KEYS)
    if unknown:
        raise ShapesError(f"{origin}: unknown key(s) {', '.join(unknown)} (known: "
                          f"{', '.join(sorted(TOP_KEYS))})")
    head_dim = document.get("head_dim", 128)
    if head_dim not in HEAD_DIMS or isinstance(head_dim, bool):
        raise ShapesError(f"{origin}: head_dim must be one of {HEAD_DIMS}, got {head_dim!r}")
    lower_bound = document.get("lower_bound", -5.0)
    if (isinstance(lower_bound, bool) or not isinstance(lower_bound, (int, float))
            or not -5.0 <= lower_bound < 0):
        raise ShapesError(f"{origin}: lower_bound must be a number in [-5, 0), got "
                          f"{lower_bound!r}")
    seed = _integer(origin, "seed", document.get("seed", 0), minimum=0)
    flop_chunk = _integer(origin, "flop_chunk", document.get("flop_chunk", 16))
    entries = document.get("shape")
    if not isinstance(entries, list) or not entries:
        raise ShapesError(f"{origin}: no [[shape]] entries")
    shapes = []
    for number, entry in enumerate(entries, start=1):
        where = f"shape {number}"
        if not isinstance(entry, dict):
            raise ShapesError(f"{origin}: {where} is not a table")
        unknown = sorted(set(entry) - SHAPE_KEYS)
        if unknown:
            raise ShapesError(f"{origin}: {where}: unknown key(s) {', '.join(unknown)} (known: "
                              f"{', '.join(sorted(SHAPE_KEYS))})")
        for key in ("tokens", "heads"):
            if key not in entry:
                raise ShapesError(f"{origin}: {where}: missing {key!r}")
        tokens = _integer(origin, f"{where}: tokens", entry["tokens"])
        heads = _integer(origin, f"{where}: heads", entry["heads"])
        seqs = _integer(origin, f"{where}: seqs", entry.get("seqs", 1))
        if tokens % seqs:
            raise ShapesError(f"{origin}: {where}: seqs {seqs} does not divide tokens {tokens} "
                              "(sequences are of equal length)")
        shape = BenchShape(tokens, heads, seqs)
        if shape.seq_len < MIN_SEQ_LEN:
            raise ShapesError(f"{origin}: {where}: sequences of {shape.seq_len} tokens; four "
                              f"interior checkpoints need at least {MIN_SEQ_LEN}")
        if shape in shapes:
            raise ShapesError(f"{origin}: {where}: {shape.label} is listed twice")
        shapes.append(shape)
    return ShapeSet(origin=origin, sha256=sha256, name=str(document.get("name", "shapes")),
                    head_dim=int(head_dim), lower_bound=float(lower_bound), seed=seed,
                    flop_chunk=flop_chunk, shapes=tuple(shapes), document=document)
