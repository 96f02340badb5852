"""Gate regimes of `kdabench bench`: which log decays g the inputs of a case carry.

    regimes = parse_gates(["long-memory", "fast-decay", "my-model.toml"])
    x, stats = draw_inputs(shape, shapes, regimes[1], device)   # stats: mean/min/max of x.g

Both contenders read g as a precomputed per-key-channel log decay [T, H, K] in
[lower_bound, 0]: kdabench with ``gate="precomputed"``, fla's chunk_kda without its in-kernel
gate and with ``safe_gate=True`` at the same ``lower_bound``. So a regime is one tensor g, the
same tensor in both calls; q, k, v, beta and the initial states are the one seeded draw of
:func:`kdabench.inputs.make_inputs` in every regime.

* ``long-memory``: make_inputs' own g (a typical rate per (head, channel), jittered per token):
  about half the channels decay slowly, memory over thousands of tokens.
* ``fast-decay``: g = lower_bound * sigmoid(z), z ~ N(0, 1) per element (at the default lower
  bound -5: mean about -2.5, every channel forgets within a few tokens).
* a gate-stats file (schema ``kdabench.gate-stats.v1``, TOML, or JSON when it ends in
  ``.json``): per-key-channel statistics of the log decay measured on a real model, ``mean``
  and ``std``, K numbers each (``mean`` <= 0, ``std`` >= 0), and an optional ``name`` (the
  regime's name in case ids; default: the file's stem); g = clip(N(mean[k], std[k]),
  lower_bound, 0) per element. The receipt records the file's name (not its path), its
  sha256 and the statistics.

The regime draws use their own generator seeded with the shapes file's seed.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kdabench.bench.options import BenchError
from kdabench.bench.shapes import BenchShape, ShapeSet
from kdabench.datafiles import parse_toml, read_bytes

LONG_MEMORY = "long-memory"
FAST_DECAY = "fast-decay"
DEFAULT_GATES = (LONG_MEMORY, FAST_DECAY)
GATE_STATS_SCHEMA = "kdabench.gate-stats.v1"
GATE_STATS_KEYS = {"schema", "name", "mean", "std"}
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
FORMULAS = {
    LONG_MEMORY: ("kdabench.inputs.make_inputs: g = max(lower_bound * s * w, lower_bound), "
                  "s = u^4, u ~ U(0.05, 1) per (head, channel), w ~ U(0.5, 1.5) per element"),
    FAST_DECAY: "g = lower_bound * sigmoid(z), z ~ N(0, 1) per element",
}
FILE_FORMULA = "g = clip(mean[k] + std[k] * z, lower_bound, 0), z ~ N(0, 1) per element"


@dataclass(frozen=True)
class GateRegime:
    """One gate regime: ``kind`` is long-memory, fast-decay or file (``mean``/``std`` per key
    channel, from ``file`` with ``sha256``)."""

    name: str
    kind: str
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    file: str | None = None
    sha256: str | None = None

    @property
    def formula(self) -> str:
        return FORMULAS.get(self.kind, FILE_FORMULA)

    def record(self, seed: int, *, statistics: bool = False) -> dict[str, Any]:
        """The regime's parameters as the receipt records them; a file regime's per-channel
        ``mean`` and ``std`` with ``statistics`` (the config has them, not every case)."""
        found: dict[str, Any] = {"name": self.name, "kind": self.kind, "formula": self.formula,
                                 "seed": seed}
        if self.kind == "file":
            found.update(file=self.file, sha256=self.sha256)
            if statistics:
                found.update(mean=list(self.mean), std=list(self.std))
        return found

    def draw(self, tokens: int, heads: int, head_dim: int, lower_bound: float,
             seed: int) -> Any:
        """This regime's g [T, H, K] fp32 on the CPU; None for long-memory (make_inputs')."""
        import torch

        if self.kind == LONG_MEMORY:
            return None
        z = torch.randn((tokens, heads, head_dim), generator=torch.Generator().manual_seed(seed))
        if self.kind == FAST_DECAY:
            return lower_bound * torch.sigmoid(z)
        mean = torch.tensor(self.mean, dtype=torch.float32)
        std = torch.tensor(self.std, dtype=torch.float32)
        return torch.clamp(mean + std * z, min=lower_bound, max=0.0)


def draw_inputs(shape: BenchShape, shapes: ShapeSet, regime: GateRegime,
                device: Any) -> tuple[Any, dict[str, float]]:
    """Input set 0 of a case (KdaInputs on ``device``) and the measured mean/min/max of its g."""
    from kdabench.inputs import make_inputs

    x = make_inputs(shape.lengths, shape.heads, shapes.head_dim,
                    lower_bound=shapes.lower_bound, seed=shapes.seed, device=device)
    g = regime.draw(shape.tokens, shape.heads, shapes.head_dim, shapes.lower_bound, shapes.seed)
    if g is not None:
        x = replace(x, g=g.to(x.g.device))
    return x, log_decay_stats(x.g)


def log_decay_stats(g: Any) -> dict[str, float]:
    """The mean, min and max of a log-decay tensor (float64 mean)."""
    import torch

    return {"mean": float(g.mean(dtype=torch.float64)), "min": float(g.min()),
            "max": float(g.max())}


def parse_gates(items: Sequence[str]) -> list[GateRegime]:
    """The regimes named by ``items`` (a built-in name or a gate-stats file each), in order,
    each once; :class:`BenchError` (one line) for an unknown name or a bad file."""
    regimes: list[GateRegime] = []
    for item in dict.fromkeys(items):
        if item in FORMULAS:
            regime = GateRegime(item, item)
        elif Path(item).suffix.lower() in (".toml", ".json") or Path(item).exists():
            regime = load_gate_stats(item)
        else:
            raise BenchError(f"--gates: {item!r} is neither a regime ({', '.join(FORMULAS)}) "
                             "nor a gate-stats file (.toml or .json)")
        if any(r.name == regime.name for r in regimes):
            raise BenchError(f"--gates: two regimes are named {regime.name!r}")
        regimes.append(regime)
    if not regimes:
        raise BenchError(f"--gates takes a comma-separated list of {', '.join(FORMULAS)} or "
                         "gate-stats files, got nothing")
    return regimes


def load_gate_stats(path: str | Path) -> GateRegime:
    """A gate-stats file (module docstring) as a regime; :class:`BenchError` when it is bad."""
    path = Path(path)
    raw = read_bytes(path, "gate-stats file", BenchError)
    origin = f"--gates {path}"
    if path.suffix.lower() == ".json":
        try:
            document = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise BenchError(f"{origin}: not JSON ({error})") from None
        digest = hashlib.sha256(raw).hexdigest()
    else:
        document, digest = parse_toml(raw, origin, BenchError)
    if not isinstance(document, dict):
        raise BenchError(f"{origin}: not a table of {', '.join(sorted(GATE_STATS_KEYS))}")
    if document.get("schema") != GATE_STATS_SCHEMA:
        raise BenchError(f"{origin}: schema must be {GATE_STATS_SCHEMA!r}, got "
                         f"{document.get('schema')!r}")
    unknown = sorted(set(document) - GATE_STATS_KEYS)
    if unknown:
        raise BenchError(f"{origin}: unknown key(s) {', '.join(unknown)} (known: "
                         f"{', '.join(sorted(GATE_STATS_KEYS))})")
    name = document.get("name", path.stem)
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or name in FORMULAS:
        raise BenchError(f"{origin}: name must be letters, digits, '.', '_' or '-' and not "
                         f"{' or '.join(FORMULAS)}, got {name!r}")
    mean = _numbers(origin, "mean", document.get("mean"))
    std = _numbers(origin, "std", document.get("std"))
    if len(mean) != len(std):
        raise BenchError(f"{origin}: mean has {len(mean)} channels and std {len(std)}; one "
                         "of each per key channel")
    if any(value > 0 for value in mean):
        raise BenchError(f"{origin}: mean must be <= 0 (a log decay), got {max(mean)!r}")
    if any(value < 0 for value in std):
        raise BenchError(f"{origin}: std must be >= 0, got {min(std)!r}")
    return GateRegime(name, "file", tuple(mean), tuple(std), file=path.name, sha256=digest)


def check_head_dim(regimes: Sequence[GateRegime], head_dim: int) -> None:
    """Refuse a file regime whose channel count is not the shapes' head_dim."""
    for regime in regimes:
        if regime.kind == "file" and len(regime.mean) != head_dim:
            raise BenchError(f"--gates {regime.file}: {len(regime.mean)} channels, but the "
                             f"shapes have head_dim {head_dim}")


def _numbers(origin: str, key: str, value: Any) -> list[float]:
    """A non-empty list of finite numbers, or :class:`BenchError` naming ``key``."""
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                       and math.isfinite(v) for v in value)):
        raise BenchError(f"{origin}: {key} must be a non-empty list of finite numbers, one per "
                         "key channel")
    return [float(v) for v in value]
