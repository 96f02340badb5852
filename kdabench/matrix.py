"""The qualification matrix: a TOML file of axes and scenarios, expanded into cases.

A matrix file (``kdabench/data/qualify.toml`` is the default) holds::

    schema = "kdabench.matrix.v1"
    name = "default"
    seed = 0                                   # mixed into every case's data seed
    backends = ["triton"]                      # the backends this matrix qualifies
    tolerances = { output = 5e-3, state = 3e-3 }
    timing = { warmup = 3, reps = 15 }         # GPU tier: CUDA-event samples per case

    [layouts.R16]                              # a batch of sequence lengths, named for case ids
    lengths = [1, 15, 16, 17, 1024]            # listed lengths first ...
    count = 16                                 # ... then seeded random ones up to `count`
    random = [1, 300]                          # drawn from this range (inclusive)

    [[group]]                                  # one block of cases: list-valued axes are crossed
    scenario = "accuracy"
    tiers = ["gpu"]
    capacity = [1, 2, 4]
    heads = [4, 8]
    layout = ["R16"]

Every axis takes a value or a list of values; a group expands to the product of its lists
(in the order of :data:`AXES`), axes left out take their defaults. Each case gets an id
that reads like the case (``accuracy-C4-H8-K128-L8192x1-unaligned-precomputed-lb5``) and
an ``index``: its position in the expansion for its tier. Ids are unique per tier.

Errors a user can make in the file (TOML syntax, unknown axes, scenarios or layouts, bad
values) raise :class:`MatrixError` with one line that names the file and the group.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdabench.datafiles import load_data_file, parse_toml

SCHEMA = "kdabench.matrix.v1"
TIERS = ("cpu", "gpu")
DEFAULT_MATRIX = "qualify.toml"  # in kdabench/data/

# What the kernel contract allows (DESIGN section 2). Kept here, not imported from
# kdabench.kernels: importing the kernels decides, once, whether Triton interprets them.
CAPACITIES = (1, 2, 4)
HEAD_DIMS = (64, 128)
GATE_MODES = ("precomputed", "sigmoid", "softplus")
MIN_LOWER_BOUND = -5.0
OFFSET_MODES = ("aligned", "unaligned", "first", "last")
INDEX_DTYPES = ("int32", "int64")

DEFAULT_TOLERANCES = {"output": 5e-3, "state": 3e-3}
DEFAULT_TIMING = {"warmup": 3, "reps": 15}


class MatrixError(ValueError):
    """A matrix file, a shard or a filter the tool cannot use; the message is one line."""


# --------------------------------------------------------------------------- axes


@dataclass(frozen=True)
class Axis:
    """One axis: its default and how a value reads in a case id ('' leaves it out)."""

    name: str
    default: Any
    label: Any  # callable value -> str


def _lower_bound_label(value: float) -> str:
    return f"lb{abs(value):g}"


#: Every axis, in expansion and case-id order.
AXES: dict[str, Axis] = {
    axis.name: axis
    for axis in (
        Axis("variant", None, str),
        Axis("capacity", 1, lambda v: f"C{v}"),
        Axis("heads", 4, lambda v: f"H{v}"),
        Axis("head_dim", 64, lambda v: f"K{v}"),
        Axis("layout", None, str),
        Axis("offsets", "unaligned", str),
        Axis("gate", "precomputed", str),
        Axis("lower_bound", -5.0, _lower_bound_label),
        Axis("qk_l2norm", False, lambda v: "l2" if v else ""),
        Axis("beta_sigmoid", False, lambda v: "bsig" if v else ""),
        Axis("index_dtype", "int32", lambda v: "i64" if v == "int64" else ""),
        Axis("seed", 0, lambda v: f"s{v}" if v else ""),
    )
}

KERNEL_AXES = (
    "capacity", "heads", "head_dim", "layout", "offsets", "gate", "lower_bound",
    "qk_l2norm", "beta_sigmoid", "index_dtype", "seed",
)
GATE_AXES = ("gate", "lower_bound", "qk_l2norm", "beta_sigmoid")

#: Fault variants: name -> the smallest capacity the fault can be built with.
FAULT_VARIANTS = {
    "duplicate-final": 1,           # two sequences write one final slot
    "duplicate-final-checkpoint": 1,  # a checkpoint slot is its sequence's final slot
    "duplicate-checkpoint": 2,      # two checkpoints of one sequence share a slot
    "write-aliases-initial": 1,     # a final slot is another sequence's initial slot
    "lengths-decreasing": 1,        # cu_seqlens goes down
    "lengths-nonzero-start": 1,     # cu_seqlens[0] != 0
    "lengths-past-capacity": 1,     # cu_seqlens[-1] > the bound tokens
    "live-count-zero": 1,           # planned run with num_seqs = 0
    "live-count-over-capacity": 1,  # planned run with num_seqs > the metadata capacity
    "slot-range-initial": 1,        # an initial slot == num_slots
    "slot-range-final": 1,          # a final slot past the pool
    "slot-range-checkpoint": 1,     # a checkpoint slot == num_slots
    "slot-negative": 1,             # a final slot of -2 (only -1 is null)
    "offset-zero": 1,               # an active checkpoint at offset 0
    "offset-at-length": 1,          # an active checkpoint at offset len
    "offset-past-length": 1,        # an active checkpoint past the sequence
    "offset-not-increasing": 2,     # active offsets going down
    "offset-equal": 2,              # two active checkpoints at one offset
}
#: Variants built across two sequences, by scenario: their layouts need at least two.
TWO_SEQUENCE_VARIANTS = {
    "fault": frozenset({"duplicate-final", "write-aliases-initial"}),
    "invalid-fourth": frozenset({"aliases-initial"}),
}
INVALID_FOURTH_VARIANTS = (
    "out-of-range", "negative", "duplicate-final", "duplicate-checkpoint", "aliases-initial",
)
CONTRACT_VARIANTS = (
    "plan-refuses-capacity-3", "plan-refuses-head-dim-96", "plan-refuses-lower-bound-6",
    "plan-refuses-unknown-backend", "bind-refuses-wrong-heads",
    "bind-refuses-vector-metadata-for-capacity-2", "decode-names-every-bit",
)


@dataclass(frozen=True)
class Scenario:
    """A scenario: the axes it reads, its variants, its options, and where it can run."""

    name: str
    axes: tuple[str, ...]
    variants: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    gpu_only: bool = False
    capacities: tuple[int, ...] = CAPACITIES


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        # outputs, final states and every checkpoint against the float64 recurrence
        Scenario("accuracy", KERNEL_AXES),
        # checkpoints against kernel runs over each prefix (bitwise where aligned)
        Scenario("prefix", KERNEL_AXES),
        # inactive (-1) checkpoint entries and final slots: ignored, nothing written
        Scenario("inactive", KERNEL_AXES),
        # an output poisoned with NaN before a valid run: every live row written
        Scenario("poisoned", KERNEL_AXES),
        # capacity 4 with a bad fourth destination: rejected, pool untouched, output NaN
        Scenario("invalid-fourth", ("variant", *KERNEL_AXES), INVALID_FOURTH_VARIANTS,
                 capacities=(4,)),
        # one fault class per case: its bit, pool untouched, output NaN
        Scenario("fault", ("variant", *KERNEL_AXES), tuple(FAULT_VARIANTS)),
        # a planned binding captured once in a CUDA graph, replayed with new metadata
        Scenario("graph", KERNEL_AXES, options={"replays": 6}, gpu_only=True),
        # written and read slots past the 2^31-element line of the pool
        Scenario("int32-boundary", KERNEL_AXES, gpu_only=True),
        # seeded random metadata sets, a share of them invalid
        Scenario("fuzz", ("capacity", "heads", "head_dim", *GATE_AXES, "seed"),
                 options={"sets": 24, "invalid_share": 0.35, "max_seqs": 6, "max_len": 48}),
        # the chunk mirror (fp32) against the float64 recurrence: no kernel
        Scenario("mirror", ("heads", "head_dim", "layout", "offsets", *GATE_AXES, "seed")),
        # host-side contracts of plan/bind and the error decoding
        Scenario("contract", ("variant",), CONTRACT_VARIANTS),
    )
}

_GROUP_KEYS = {"scenario", "tiers", "tolerances"}
_TOP_KEYS = {"schema", "name", "description", "seed", "backends", "tolerances", "timing",
             "layouts", "group"}
_LAYOUT_KEYS = {"lengths", "count", "random", "seed"}
_LAYOUT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9.]*")


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Case:
    """One expanded case.

    params: every axis of its scenario (with defaults filled in); lengths: the layout's
    sequence lengths (empty when the scenario reads no layout); options: the scenario's
    options and the tolerances; index: position in the tier's expansion.
    """

    index: int
    id: str
    scenario: str
    group: int
    params: Mapping[str, Any]
    lengths: tuple[int, ...]
    options: Mapping[str, Any]
    tiers: tuple[str, ...]

    def describe(self) -> dict[str, Any]:
        """The case as receipt fields."""
        return {"id": self.id, "index": self.index, "scenario": self.scenario,
                "params": dict(self.params), "group": self.group}


@dataclass(frozen=True)
class Matrix:
    """A parsed, validated matrix. ``document`` is the TOML as read (it goes into receipts)."""

    origin: str
    sha256: str
    document: Mapping[str, Any]
    name: str
    seed: int
    backends: tuple[str, ...]
    tolerances: Mapping[str, float]
    timing: Mapping[str, int]
    layouts: Mapping[str, tuple[int, ...]]
    groups: tuple[Mapping[str, Any], ...]

    def expand(self, tier: str) -> list[Case]:
        """Every case of `tier`, in matrix order, with stable ids and indices."""
        if tier not in TIERS:
            raise MatrixError(f"unknown tier {tier!r}; expected one of {', '.join(TIERS)}")
        cases: list[Case] = []
        seen: dict[str, int] = {}
        for number, group in enumerate(self.groups, start=1):
            if tier not in group["tiers"]:
                continue
            for params, options in _expand_group(group, self.tolerances):
                case_id = case_id_for(group["scenario"], params)
                if case_id in seen:
                    raise MatrixError(
                        f"{self.origin}: case {case_id!r} appears in group {seen[case_id]} "
                        f"and again in group {number}"
                    )
                seen[case_id] = number
                layout = params.get("layout")
                cases.append(Case(
                    index=len(cases), id=case_id, scenario=group["scenario"], group=number,
                    params=params, lengths=self.layouts[layout] if layout else (),
                    options=options, tiers=tuple(group["tiers"]),
                ))
        return cases


def case_id_for(scenario: str, params: Mapping[str, Any]) -> str:
    """The id of a case: the scenario, then each axis's label in :data:`AXES` order."""
    parts = [scenario]
    for name, axis in AXES.items():
        if name in params:
            label = axis.label(params[name])
            if label:
                parts.append(label)
    return "-".join(parts)


def _expand_group(group: Mapping[str, Any], tolerances: Mapping[str, float]):
    scenario = SCENARIOS[group["scenario"]]
    lists = [group["axes"].get(name, [AXES[name].default]) for name in scenario.axes]
    options = {**scenario.options, **group["options"],
               "tolerances": {**tolerances, **group.get("tolerances", {})}}
    for values in itertools.product(*lists):
        yield dict(zip(scenario.axes, values, strict=True)), options


# --------------------------------------------------------------------------- loading


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


# --------------------------------------------------------------------------- selection


def parse_shard(text: str) -> tuple[int, int]:
    """(I, N) from "I/N" with 1 <= I <= N."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match:
        raise MatrixError(f"shard {text!r} is not I/N (for example 1/2)")
    index, count = int(match.group(1)), int(match.group(2))
    if not 1 <= index <= count:
        raise MatrixError(f"shard {text!r}: I must lie in 1..N")
    return index, count


def select_cases(
    cases: Iterable[Case], *, shard: tuple[int, int] | None = None, contains: str | None = None
) -> list[Case]:
    """The cases of shard I/N (index % N == I - 1) whose ids contain `contains`."""
    selected = list(cases)
    if shard is not None:
        index, count = shard
        selected = [case for case in selected if case.index % count == index - 1]
    if contains:
        selected = [case for case in selected if contains in case.id]
    return selected
