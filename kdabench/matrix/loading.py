"""Reading a matrix file: TOML, then every key, layout, group and axis value checked, with
one-line errors that name the file and the group."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kdabench.datafiles import load_data_file, parse_toml
from kdabench.kernels.contract import (
    CAPACITIES,
    GATE_MODES,
    HEAD_DIMS,
    INDEX_DTYPES,
    MIN_LOWER_BOUND,
)
from kdabench.matrix.axes import (
    AXES,
    DEFAULT_MATRIX,
    DEFAULT_TIMING,
    DEFAULT_TOLERANCES,
    FAULT_VARIANTS,
    OFFSET_MODES,
    SCENARIOS,
    SCHEMA,
    TIERS,
    TWO_SEQUENCE_VARIANTS,
    MatrixError,
    Scenario,
)
from kdabench.matrix.cases import Matrix

_GROUP_KEYS = {"scenario", "tiers", "tolerances"}
_TOP_KEYS = {"schema", "name", "description", "seed", "backends", "tolerances", "timing",
             "layouts", "group"}
_LAYOUT_KEYS = {"lengths", "count", "random", "seed"}
_LAYOUT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9.]*")



def load_matrix(path: str | Path | None = None) -> Matrix:
    """Load and validate a matrix file; None loads the packaged default."""
    return load_data_file(path, DEFAULT_MATRIX, "matrix file", MatrixError, parse_matrix)


def parse_matrix(raw: bytes | str, *, origin: str = "matrix") -> Matrix:
    """Parse and validate matrix TOML (bytes or text); `origin` names it in errors."""
    document, digest = parse_toml(raw, origin, MatrixError)
    return _validate(document, origin, digest)


def _fail(origin: str, where: str, message: str) -> MatrixError:
    return MatrixError(f"{origin}: {where}: {message}" if where else f"{origin}: {message}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _validate(doc: dict[str, Any], origin: str, sha256: str) -> Matrix:
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise _fail(origin, "", f"unknown top-level key(s) {', '.join(map(repr, unknown))}; "
                    f"known: {', '.join(sorted(_TOP_KEYS))}")
    if doc.get("schema") != SCHEMA:
        found = "no 'schema'" if "schema" not in doc else f"schema {doc['schema']!r}"
        raise _fail(origin, "", f"{found}; a matrix starts with schema = \"{SCHEMA}\"")
    name = doc.get("name", Path(origin).stem)
    if not isinstance(name, str) or not name:
        raise _fail(origin, "", "'name' must be a non-empty string")
    seed = doc.get("seed", 0)
    if not _is_int(seed) or seed < 0:
        raise _fail(origin, "", f"'seed' must be an integer >= 0, got {seed!r}")
    backends = doc.get("backends", ["triton"])
    if (not isinstance(backends, list) or not backends
            or not all(isinstance(b, str) and b for b in backends)):
        raise _fail(origin, "", f"'backends' must be a non-empty list of names, got {backends!r}")
    tolerances = _tolerances(doc.get("tolerances", {}), origin, "tolerances", DEFAULT_TOLERANCES)
    timing = _timing(doc.get("timing", {}), origin)
    layouts = _layouts(doc.get("layouts", {}), origin, seed)
    groups = doc.get("group")
    if not isinstance(groups, list) or not groups:
        raise _fail(origin, "", "no [[group]] tables: a matrix needs at least one group of cases")
    parsed = tuple(
        _group(group, number, origin, layouts) for number, group in enumerate(groups, start=1)
    )
    matrix = Matrix(
        origin=origin, sha256=sha256, document=doc, name=name, seed=seed,
        backends=tuple(backends), tolerances=tolerances, timing=timing, layouts=layouts,
        groups=parsed,
    )
    for tier in TIERS:
        matrix.expand(tier)  # duplicate ids are an error of the file, found at load time
    return matrix


def _tolerances(value: Any, origin: str, where: str, base: Mapping[str, float]) -> dict:
    if not isinstance(value, dict):
        raise _fail(origin, where, "tolerances must be a table {output = ..., state = ...}")
    unknown = sorted(set(value) - set(DEFAULT_TOLERANCES))
    if unknown:
        raise _fail(origin, where, f"unknown tolerance(s) {', '.join(map(repr, unknown))}; "
                    f"known: {', '.join(DEFAULT_TOLERANCES)}")
    for key, tol in value.items():
        if not _is_number(tol) or not 0 < tol < 1:
            raise _fail(origin, where, f"tolerance {key} must be a number in (0, 1), got {tol!r}")
    return {**base, **{key: float(tol) for key, tol in value.items()}}


def _timing(value: Any, origin: str) -> dict[str, int]:
    if not isinstance(value, dict):
        raise _fail(origin, "timing", "must be a table {warmup = ..., reps = ...}")
    unknown = sorted(set(value) - set(DEFAULT_TIMING))
    if unknown:
        raise _fail(origin, "timing", f"unknown key(s) {', '.join(map(repr, unknown))}")
    timing = {**DEFAULT_TIMING, **value}
    if not _is_int(timing["warmup"]) or timing["warmup"] < 0:
        raise _fail(origin, "timing", f"warmup must be an integer >= 0, got {timing['warmup']!r}")
    if not _is_int(timing["reps"]) or not 1 <= timing["reps"] <= 1000:
        raise _fail(origin, "timing", f"reps must be an integer in 1..1000, got {timing['reps']!r}")
    return timing


def _layouts(value: Any, origin: str, matrix_seed: int) -> dict[str, tuple[int, ...]]:
    if not isinstance(value, dict):
        raise _fail(origin, "layouts", "must be a table of [layouts.NAME] tables")
    layouts = {}
    for name, spec in value.items():
        where = f"layout {name!r}"
        if not _LAYOUT_NAME.fullmatch(name):
            raise _fail(origin, where, "a layout name is letters, digits and dots, starting "
                        "with a letter (it becomes part of case ids)")
        if not isinstance(spec, dict):
            raise _fail(origin, where, "must be a table with 'lengths' (and optionally "
                        "'count', 'random', 'seed')")
        unknown = sorted(set(spec) - _LAYOUT_KEYS)
        if unknown:
            raise _fail(origin, where, f"unknown key(s) {', '.join(map(repr, unknown))}; "
                        f"known: {', '.join(sorted(_LAYOUT_KEYS))}")
        lengths = spec.get("lengths", [])
        if not isinstance(lengths, list) or not all(_is_int(n) and n >= 1 for n in lengths):
            raise _fail(origin, where, f"lengths must be a list of integers >= 1, got {lengths!r}")
        count = spec.get("count", len(lengths))
        if not _is_int(count) or count < max(len(lengths), 1):
            raise _fail(origin, where, f"count must be an integer >= the listed lengths "
                        f"({len(lengths)}) and >= 1, got {count!r}")
        lengths = list(lengths)
        if count > len(lengths):
            bounds = spec.get("random")
            if (not isinstance(bounds, list) or len(bounds) != 2
                    or not all(_is_int(b) for b in bounds) or not 1 <= bounds[0] <= bounds[1]):
                raise _fail(origin, where, "count exceeds the listed lengths: give "
                            f"random = [min, max] (1 <= min <= max), got {bounds!r}")
            seed = spec.get("seed", 0)
            if not _is_int(seed):
                raise _fail(origin, where, f"seed must be an integer, got {seed!r}")
            rng = random.Random(f"{matrix_seed}/{name}/{seed}")
            lengths += [rng.randint(*bounds) for _ in range(count - len(lengths))]
        layouts[name] = tuple(lengths)
    return layouts


def _group(group: Any, number: int, origin: str, layouts: Mapping[str, Sequence[int]]) -> dict:
    where = f"group {number}"
    if not isinstance(group, dict):
        raise _fail(origin, where, "must be a table")
    scenario_name = group.get("scenario")
    if scenario_name not in SCENARIOS:
        found = "no 'scenario'" if scenario_name is None else f"unknown scenario {scenario_name!r}"
        raise _fail(origin, where, f"{found}; known: {', '.join(SCENARIOS)}")
    scenario = SCENARIOS[scenario_name]
    where = f"group {number} ({scenario_name})"

    tiers = group.get("tiers")
    if (not isinstance(tiers, list) or not tiers or any(t not in TIERS for t in tiers)
            or len(set(tiers)) != len(tiers)):
        raise _fail(origin, where, f"tiers must be a list drawn from {', '.join(TIERS)}, "
                    f"got {tiers!r}")
    if scenario.gpu_only and "cpu" in tiers:
        raise _fail(origin, where, f"scenario {scenario_name!r} runs on the GPU tier only")

    axes, options = {}, {}
    for key, value in group.items():
        if key in _GROUP_KEYS:
            continue
        if key in scenario.options:
            options[key] = _option(scenario_name, key, value, origin, where)
        elif key in scenario.axes:
            values = value if isinstance(value, list) else [value]
            if not values:
                raise _fail(origin, where, f"axis {key!r} has an empty list")
            axes[key] = [_axis_value(key, v, scenario, origin, where, layouts) for v in values]
            if len(set(map(repr, axes[key]))) != len(axes[key]):
                raise _fail(origin, where, f"axis {key!r} repeats a value: {values!r}")
        elif key in AXES:
            raise _fail(origin, where, f"axis {key!r} does not apply to scenario "
                        f"{scenario_name!r} (it reads: {', '.join(scenario.axes)})")
        else:
            known = [*scenario.axes, *scenario.options, *sorted(_GROUP_KEYS)]
            raise _fail(origin, where, f"unknown axis {key!r}; known for {scenario_name!r}: "
                        f"{', '.join(known)}")
    for required in ("variant", "layout"):
        if required in scenario.axes and required not in axes:
            raise _fail(origin, where, f"scenario {scenario_name!r} needs a {required!r} axis")
    if "capacity" in scenario.axes:
        capacities = axes.get("capacity", [AXES["capacity"].default])
        bad = [c for c in capacities if c not in scenario.capacities]
        if bad:
            raise _fail(origin, where, f"scenario {scenario_name!r} takes capacity "
                        f"{' or '.join(map(str, scenario.capacities))}, got {bad}")
        for variant in axes.get("variant", []):
            needs = FAULT_VARIANTS.get(variant, 1) if scenario_name == "fault" else 1
            if any(c < needs for c in capacities):
                raise _fail(origin, where, f"fault {variant!r} needs capacity >= {needs}; "
                            "put it in a group with capacity = [2, 4]")
    two_sequences = TWO_SEQUENCE_VARIANTS.get(scenario_name, frozenset())
    for variant in axes.get("variant", []):
        short = [name for name in axes.get("layout", []) if len(layouts[name]) < 2]
        if variant in two_sequences and short:
            raise _fail(origin, where, f"variant {variant!r} needs a layout of two or more "
                        f"sequences; {', '.join(short)} has one")
    result = {"scenario": scenario_name, "tiers": list(tiers), "axes": axes, "options": options}
    if "tolerances" in group:
        result["tolerances"] = _tolerances(group["tolerances"], origin, where, {})
    return result


def _axis_value(name: str, value: Any, scenario: Scenario, origin: str, where: str,
                layouts: Mapping[str, Sequence[int]]) -> Any:
    def bad(expected: str) -> MatrixError:
        return _fail(origin, where, f"{name} = {value!r} is not {expected}")

    if name == "capacity":
        if not _is_int(value) or value not in CAPACITIES:
            raise bad(f"one of {', '.join(map(str, CAPACITIES))}")
    elif name == "heads":
        if not _is_int(value) or not 1 <= value <= 1024:
            raise bad("an integer in 1..1024")
    elif name == "head_dim":
        if not _is_int(value) or value not in HEAD_DIMS:
            raise bad(f"one of {', '.join(map(str, HEAD_DIMS))} (K = V)")
    elif name == "layout":
        if value not in layouts:
            known = ", ".join(layouts) or "none defined"
            raise bad(f"a layout of this file (known: {known})")
    elif name == "offsets":
        if value not in OFFSET_MODES:
            raise bad(f"one of {', '.join(OFFSET_MODES)}")
    elif name == "gate":
        if value not in GATE_MODES:
            raise bad(f"one of {', '.join(GATE_MODES)}")
    elif name == "lower_bound":
        if not _is_number(value) or not MIN_LOWER_BOUND <= value < 0:
            raise bad(f"a number in [{MIN_LOWER_BOUND:g}, 0)")
        value = float(value)
    elif name in ("qk_l2norm", "beta_sigmoid"):
        if not isinstance(value, bool):
            raise bad("true or false")
    elif name == "index_dtype":
        if value not in INDEX_DTYPES:
            raise bad(f"one of {', '.join(INDEX_DTYPES)}")
    elif name == "seed":
        if not _is_int(value) or value < 0:
            raise bad("an integer >= 0")
    elif name == "variant" and value not in scenario.variants:
        raise bad(f"a {scenario.name} variant ({', '.join(scenario.variants)})")
    return value


def _option(scenario: str, key: str, value: Any, origin: str, where: str) -> Any:
    checks = {
        "replays": (lambda v: _is_int(v) and 5 <= v <= 100, "an integer in 5..100"),
        "sets": (lambda v: _is_int(v) and 1 <= v <= 10_000, "an integer in 1..10000"),
        "invalid_share": (lambda v: _is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
        "max_seqs": (lambda v: _is_int(v) and 1 <= v <= 64, "an integer in 1..64"),
        "max_len": (lambda v: _is_int(v) and 2 <= v <= 4096, "an integer in 2..4096"),
    }
    ok, expected = checks[key]
    if not ok(value):
        raise _fail(origin, where, f"{key} = {value!r} is not {expected}")
    return value


