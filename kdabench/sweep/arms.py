"""The arms file of `kdabench serve-sweep`: which server configurations to compare.

An arms file is TOML::

    schema = "kdabench.arms.v1"
    name = "local"
    description = "what the arms compare"

    [sweep]                      # defaults of this file; command-line options override
    prompt_tokens = [1024, 4096]
    samples = 3                  # cold samples per arm and prompt size
    warmups = 1                  # shape warmups per arm and prompt size, and uncounted
                                 # pairs per shared-prefix case
    decode_window_s = 2.0
    shared_prefix = [[8192, 4096], [65536, 57344]]  # (P1 tokens, tokens P2 shares); or
    # shared_prefix_tokens = 8192  # one case: P1's length, P2 shares its first half
    drift_bound = 0.05           # max |logprob(cold) - logprob(cached)|
    baseline = "final-only"      # the arm the others are read against (contrasts.py)

    [common]                     # given to every arm's server
    env = { KDABENCH_LOCAL_BLOCK_TOKENS = "512" }
    args = []

    [[arms]]
    name = "checkpoints"
    description = "prefix cache on, checkpoint export on"
    env = { KDABENCH_LOCAL_CHECKPOINT_EXPORT = "1" }
    args = []                    # appended to the --launch command
    prefix_cache = true          # the repeat probe must (true) / must not (false) hit the cache
    activation = ['checkpoint_export=on']        # in the server log before timing and after
    activation_after = ['checkpoints_exported=[1-9]']  # in the log written while measuring
    log = "/var/log/vllm-arm.log"  # attach mode only: where this arm's server logs
    endpoint = "http://host:8000"  # attach mode only: this arm's own server

Patterns are Python regular expressions searched (multi-line) over the server log.
:func:`load_arms` validates everything up front and raises :class:`ArmsError` with one
line naming the file, the arm and the key at fault.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from kdabench.datafiles import tomllib

SCHEMA = "kdabench.arms.v1"

#: Arms files shipped with kdabench: name -> file under kdabench/data/.
PACKAGED = {"local": "arms-local.toml", "vllm-seed": "arms-vllm-seed.toml"}

#: Keys of [sweep] and their types (command-line options override them).
SWEEP_KEYS: dict[str, type | tuple[type, ...]] = {
    "prompt_tokens": list,
    "samples": int,
    "rounds": int,
    "warmups": int,
    "decode_window_s": (int, float),
    "decode_prompt_tokens": int,
    "decode_max_tokens": int,
    "probe_tokens": int,
    "probe_prompt_tokens": int,
    "drift_bound": (int, float),
    "shared_prefix_tokens": int,
    "shared_prefix": list,
    "shared_prefix_repeats": int,
    "health_timeout_s": (int, float),
    "request_timeout_s": (int, float),
    "baseline": str,
}

_TOP_KEYS = {"schema", "name", "description", "sweep", "common", "arms"}
_COMMON_KEYS = {"env", "args"}
_ARM_KEYS = {"name", "description", "env", "args", "prefix_cache", "activation",
             "activation_after", "log", "endpoint"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)


class ArmsError(ValueError):
    """An arms file that cannot be used; the message is one line for the user."""


@dataclass(frozen=True)
class Arm:
    """One server configuration: its environment, extra arguments and activation checks."""

    name: str
    description: str = ""
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    prefix_cache: bool = True
    activation: tuple[str, ...] = ()
    activation_after: tuple[str, ...] = ()
    log: str | None = None
    endpoint: str | None = None

    def to_receipt(self) -> dict[str, Any]:
        """The arm as the receipt records it: secret-looking env values redacted."""
        return {
            "name": self.name,
            "description": self.description,
            "env": redact_env(self.env),
            "args": list(self.args),
            "prefix_cache": self.prefix_cache,
            "activation": list(self.activation),
            "activation_after": list(self.activation_after),
            "log": self.log,
            "endpoint": self.endpoint,
        }


@dataclass(frozen=True)
class ArmsFile:
    """A loaded, validated arms file."""

    name: str
    description: str
    source: str
    arms: tuple[Arm, ...]
    sweep: dict[str, Any] = field(default_factory=dict)
    common_env: dict[str, str] = field(default_factory=dict)
    common_args: tuple[str, ...] = ()

    def arm_env(self, arm: Arm) -> dict[str, str]:
        """The common environment with the arm's own on top."""
        return {**self.common_env, **arm.env}

    def arm_args(self, arm: Arm) -> list[str]:
        """The common server arguments followed by the arm's own."""
        return [*self.common_args, *arm.args]

    def to_receipt(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "sweep": dict(self.sweep),
            "common": {"env": redact_env(self.common_env), "args": list(self.common_args)},
            "arms": [arm.to_receipt() for arm in self.arms],
        }


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the values of secret-looking names (…KEY, …TOKEN, …) replaced."""
    return {name: ("<redacted>" if _SECRET_NAME.search(name) else value)
            for name, value in env.items()}


def load_arms(spec: str | Path) -> ArmsFile:
    """Load an arms file: a packaged name ("local", "vllm-seed") or a path to a TOML file."""
    spec_text = str(spec)
    if spec_text in PACKAGED:
        resource = resources.files("kdabench") / "data" / PACKAGED[spec_text]
        text = resource.read_text(encoding="utf-8")
        label = f"packaged arms '{spec_text}'"
        source = f"kdabench/data/{PACKAGED[spec_text]}"
    else:
        path = Path(spec_text)
        if not path.exists():
            names = ", ".join(sorted(PACKAGED))
            raise ArmsError(f"{path}: no such arms file (packaged arms: {names})")
        if path.is_dir():
            raise ArmsError(f"{path}: is a folder; give an arms TOML file")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ArmsError(f"{path}: cannot read ({error})") from error
        label = source = str(path)
    return parse_arms(text, label=label, source=source)


def parse_arms(text: str, *, label: str = "<arms>", source: str | None = None) -> ArmsFile:
    """Parse and validate the TOML text of an arms file (see the module docstring)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ArmsError(f"{label}: not valid TOML ({error})") from error
    _no_unknown(doc, _TOP_KEYS, label)
    schema = doc.get("schema")
    if schema != SCHEMA:
        found = "no 'schema'" if schema is None else f"schema {schema!r}"
        raise ArmsError(f'{label}: {found}; an arms file starts with schema = "{SCHEMA}"')
    name = _string(doc.get("name", "arms"), f"{label}: 'name'")
    description = _string(doc.get("description", ""), f"{label}: 'description'")
    sweep = _sweep(doc.get("sweep", {}), label)
    common = doc.get("common", {})
    if not isinstance(common, dict):
        raise ArmsError(f"{label}: [common] must be a table with 'env' and 'args'")
    _no_unknown(common, _COMMON_KEYS, f"{label}: [common]")
    common_env = _env(common.get("env", {}), f"{label}: [common] env")
    common_args = _args(common.get("args", []), f"{label}: [common] args")

    raw_arms = doc.get("arms")
    if raw_arms is None:
        raise ArmsError(f"{label}: no arms; add at least one [[arms]] table with a name")
    if not isinstance(raw_arms, list) or not all(isinstance(a, dict) for a in raw_arms):
        raise ArmsError(f"{label}: 'arms' must be an array of tables ([[arms]])")
    if not raw_arms:
        raise ArmsError(f"{label}: no arms; add at least one [[arms]] table with a name")
    arms: list[Arm] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_arms):
        arm = _arm(raw, index, label)
        if arm.name in seen:
            raise ArmsError(f"{label}: arm name {arm.name!r} is used twice; names must be unique")
        seen.add(arm.name)
        arms.append(arm)
    return ArmsFile(name=name, description=description, source=source or label,
                    arms=tuple(arms), sweep=sweep, common_env=common_env,
                    common_args=tuple(common_args))


def _arm(raw: dict[str, Any], index: int, label: str) -> Arm:
    where = f"{label}: arm #{index + 1}"
    if "name" not in raw:
        raise ArmsError(f"{where} has no 'name'")
    name = _string(raw["name"], f"{where}: 'name'")
    if not _NAME.match(name):
        raise ArmsError(f"{where}: name {name!r} must be letters, digits, '.', '_' or '-'")
    where = f"{label}: arm {name!r}"
    _no_unknown(raw, _ARM_KEYS, where)
    prefix_cache = raw.get("prefix_cache", True)
    if not isinstance(prefix_cache, bool):
        raise ArmsError(f"{where}: 'prefix_cache' must be true or false")
    log = raw.get("log")
    endpoint = raw.get("endpoint")
    if endpoint is not None:
        endpoint = _string(endpoint, f"{where}: 'endpoint'")
        if not endpoint.startswith(("http://", "https://")):
            raise ArmsError(f"{where}: endpoint {endpoint!r} must start with http:// or https://")
    return Arm(
        name=name,
        description=_string(raw.get("description", ""), f"{where}: 'description'"),
        env=_env(raw.get("env", {}), f"{where}: 'env'"),
        args=tuple(_args(raw.get("args", []), f"{where}: 'args'")),
        prefix_cache=prefix_cache,
        activation=tuple(_patterns(raw.get("activation", []), f"{where}: 'activation'")),
        activation_after=tuple(_patterns(raw.get("activation_after", []),
                                         f"{where}: 'activation_after'")),
        log=None if log is None else _string(log, f"{where}: 'log'"),
        endpoint=endpoint,
    )


def _sweep(raw: Any, label: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ArmsError(f"{label}: [sweep] must be a table")
    _no_unknown(raw, set(SWEEP_KEYS), f"{label}: [sweep]")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        expected = SWEEP_KEYS[key]
        if isinstance(value, bool) or not isinstance(value, expected):
            raise ArmsError(f"{label}: [sweep] {key} = {value!r} has the wrong type")
        if key == "prompt_tokens":
            if not value or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                    for v in value):
                raise ArmsError(f"{label}: [sweep] prompt_tokens must be positive integers")
        elif key == "shared_prefix":
            if not value or not all(
                    isinstance(pair, list) and len(pair) == 2 and all(
                        isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in pair)
                    for pair in value):
                raise ArmsError(f"{label}: [sweep] shared_prefix must be [[P1 tokens, shared "
                                "tokens], ...] of positive integers")
        elif key == "baseline":
            _string(value, f"{label}: [sweep] baseline")
        elif value < 0 or (value == 0 and key not in ("warmups",)):
            raise ArmsError(f"{label}: [sweep] {key} = {value!r} must be positive")
        out[key] = value
    return out


def _no_unknown(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ArmsError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
                        f"allowed: {', '.join(sorted(allowed))}")


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ArmsError(f"{where} must be a string, got {value!r}")
    return value


def _env(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ArmsError(f"{where} must be a table of NAME = \"value\"")
    env: dict[str, str] = {}
    for key, item in value.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise ArmsError(f"{where}: {key!r} is not an environment variable name")
        if isinstance(item, bool):
            item = "1" if item else "0"
        elif isinstance(item, (int, float)):
            item = str(item)
        if not isinstance(item, str):
            raise ArmsError(f"{where}: {key} must be a string or number, got {item!r}")
        env[key] = item
    return env


def _args(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise ArmsError(f"{where} must be a list of strings")
    return list(value)


def _patterns(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise ArmsError(f"{where} must be a list of regular expressions (strings)")
    for pattern in value:
        try:
            re.compile(pattern, re.MULTILINE)
        except re.error as error:
            raise ArmsError(f"{where}: {pattern!r} is not a valid regular expression "
                            f"({error})") from error
    return list(value)


def check_patterns(patterns: tuple[str, ...] | list[str], log_text: str | None) -> dict[str, Any]:
    """Search each pattern in ``log_text``.

    Returns {"status": "passed" | "failed" | "not checked", "missing": [patterns],
    "matches": {pattern: first matching line}}. With no log (None) the status is
    "not checked"; with no patterns it is "passed".
    """
    if log_text is None:
        return {"status": "not checked", "missing": [], "matches": {}}
    missing: list[str] = []
    matches: dict[str, str] = {}
    for pattern in patterns:
        found = re.search(pattern, log_text, re.MULTILINE)
        if found is None:
            missing.append(pattern)
        else:
            start = log_text.rfind("\n", 0, found.start()) + 1
            end = log_text.find("\n", found.end())
            matches[pattern] = log_text[start:end if end >= 0 else None][:300]
    return {"status": "failed" if missing else "passed", "missing": missing,
            "matches": matches}
