"""Profiles: measured kernel configs for one device, as JSON files in the profile folder.

A profile is `<device slug>.json` (`NVIDIA H200` -> `nvidia-h200.json`), written by
`kdabench tune` on that device. The folder is, in order: the `directory` a caller passes,
$KDABENCH_PROFILE_DIR, or the folder shipped with the package (the repository's profiles/,
installed as kdabench/profiles/).

    {"format": "kdabench.profile.v1", "operator": "kda_prefill",
     "schema": {"query": {"version": 1, "fields": [...]},
                "config": {"version": 1, "fields": {"block_v": {"type": "int", ...}, ...}}},
     "device": {"name": "NVIDIA H200", "slug": "nvidia-h200", ...},
     "tools": {"python": ..., "torch": ..., "triton": ..., "kdabench": ...},
     "status": "complete", "created_at": ..., "tune": {...},
     "entries": [{"query": {...}, "config": {...}, "backend": "triton", "measurements": {...}},
                 ...]}

An entry's config is the fastest Triton config for its query; its optional "backend" names
the backend `kdabench tune` measured fastest for the query ("triton" when absent, as in
profiles made before backends were timed), the one a plan with `Caps.backend = "auto"` runs;
where that is "cute", its optional "cute_config" holds the CuteConfig that measured fastest
(its fields but "backend", e.g. {"algorithm": "chunk", "key_split": 2, ...}; when absent,
as in profiles made before key splits were timed, the default CuteConfig()).

Loading checks all of it; a profile whose format, schema versions or field names differ from
the catalog's (kernels/catalog.py), whose device is not the one its file name says, or whose
entries do not parse is refused with KdaPolicyError, one message naming the file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .catalog import (
    CONFIG_ADDITIONS,
    CONFIG_VERSION,
    KDA_PREFILL,
    QUERY_FIELDS,
    QUERY_VERSION,
    KdaPolicyError,
    KdaQuery,
    config_fields,
    config_from_dict,
    config_problems,
    config_to_dict,
    same_type,
)
from .config import BACKENDS, CuteConfig, KernelConfig

PROFILE_FORMAT = "kdabench.profile.v1"
PROFILE_DIR_ENV = "KDABENCH_PROFILE_DIR"
STATUSES = ("complete", "partial")

_cache: dict[tuple[str, int, int], Profile] = {}


def packaged_profile_dir() -> Path:
    """The profiles shipped with the package (the repository's profiles/ folder)."""
    return Path(__file__).resolve().parent.parent / "profiles"


def profile_dir(directory: str | os.PathLike | None = None) -> Path:
    """`directory`, else $KDABENCH_PROFILE_DIR, else the packaged folder."""
    if directory is not None:
        return Path(directory)
    from_env = os.environ.get(PROFILE_DIR_ENV)
    return Path(from_env) if from_env else packaged_profile_dir()


def device_slug(name: str) -> str:
    """A device name as a file name: lower case, (R)/(TM)/(C) dropped, runs of other
    characters as one '-' ("NVIDIA H200" -> "nvidia-h200"; receipts name devices alike)."""
    name = re.sub(r"\((r|tm|c)\)", " ", str(name).lower())
    slug = re.sub(r"[^a-z0-9]+", "-", name).strip("-")
    if not slug:
        raise KdaPolicyError(f"device name {name!r} gives no profile name")
    return slug


def profile_path(device_name: str, directory: str | os.PathLike | None = None) -> Path:
    """Where the profile of `device_name` lives."""
    return profile_dir(directory) / f"{device_slug(device_name)}.json"


@dataclass(frozen=True)
class ProfileEntry:
    """One measured choice: the query, the config chosen for it, and why."""

    query: KdaQuery
    config: KernelConfig  # the fastest Triton config
    measurements: dict[str, Any] = field(default_factory=dict, compare=False)
    backend: str = BACKENDS[0]  # the fastest backend for the query
    cute_config: CuteConfig | None = None  # the fastest cute config, where backend is "cute"


@dataclass(frozen=True)
class Profile:
    """A loaded, checked profile."""

    path: Path
    device: dict[str, Any]
    tools: dict[str, Any]
    status: str
    entries: dict[KdaQuery, ProfileEntry]
    document: dict[str, Any] = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.path.name

    def lookup(self, query: KdaQuery) -> ProfileEntry | None:
        return self.entries.get(query)


def entry_document(query: KdaQuery, config: KernelConfig,
                   measurements: dict[str, Any] | None = None, backend: str = BACKENDS[0],
                   cute_config: CuteConfig | None = None) -> dict[str, Any]:
    """One entry as a profile stores it."""
    document = {"query": query.to_dict(), "config": config_to_dict(config), "backend": backend,
                "measurements": dict(measurements or {})}
    if cute_config is not None:
        document["cute_config"] = cute_config_to_dict(cute_config)
    return document


def cute_config_to_dict(config: CuteConfig) -> dict[str, Any]:
    """A CuteConfig's fields but the backend, as a profile entry stores them."""
    return {name: value for name, value in dataclasses.asdict(config).items()
            if name != "backend"}


def _cute_config(raw: Any, where: str, head_dim: int) -> CuteConfig:
    """An entry's "cute_config": some of CuteConfig's fields (but "backend"), of their types,
    naming a cute kernel for the head dim."""
    from .cute.launch import config_problems as cute_config_problems

    defaults = cute_config_to_dict(CuteConfig())
    if not isinstance(raw, dict):
        raise KdaPolicyError(f"{where}: 'cute_config' must be an object")
    unknown = sorted(set(raw) - set(defaults))
    if unknown:
        raise KdaPolicyError(f"{where}: cute_config fields {unknown} are not CuteConfig's "
                             f"({', '.join(sorted(defaults))})")
    for name, value in raw.items():
        if not same_type(value, defaults[name]):
            raise KdaPolicyError(f"{where}: cute_config field {name} must be "
                                 f"{type(defaults[name]).__name__}, found {value!r}")
    config = CuteConfig(**raw)
    problems = cute_config_problems(config, head_dim)
    if problems:
        raise KdaPolicyError(f"{where}: cute_config is not valid: " + "; ".join(problems))
    return config


def profile_document(device_name: str, entries: list[dict[str, Any]], *,
                     status: str = "complete", device: dict[str, Any] | None = None,
                     tools: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A profile document for `device_name` with the catalog's schemas (see the module
    docstring); `device` adds to the device record, `extra` to the top level."""
    return {
        "format": PROFILE_FORMAT,
        "operator": KDA_PREFILL.operator,
        "schema": KDA_PREFILL.schema(),
        "device": {**(device or {}), "profile_name": device_name,
                   "slug": device_slug(device_name)},
        "tools": dict(tools or {}),
        "status": status,
        **extra,
        "entries": list(entries),
    }


def load_profile(path: str | os.PathLike, *, expected_slug: str | None = None) -> Profile:
    """Read and check a profile file (cached until the file changes)."""
    path = Path(path)
    try:
        stat = path.stat()
    except FileNotFoundError as error:
        raise KdaPolicyError(f"profile {path}: no such file") from error
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    profile = _cache.get(key)
    if profile is None:
        try:
            raw = path.read_bytes()
        except OSError as error:
            raise KdaPolicyError(f"profile {path}: cannot read ({error.strerror})") from error
        profile = parse_profile(raw, path)
        _cache.clear()  # one file changed or another asked for: keep the cache small
        _cache[key] = profile
    if expected_slug is not None and profile.device.get("slug") != expected_slug:
        raise KdaPolicyError(f"profile {path.name} was measured on "
                             f"{profile.device.get('name')!r} (slug "
                             f"{profile.device.get('slug')!r}), not {expected_slug!r}")
    return profile


def find_profile(device_name: str, directory: str | os.PathLike | None = None
                 ) -> Profile | None:
    """The profile of `device_name` in the profile folder; None when there is no such file."""
    path = profile_path(device_name, directory)
    if not path.is_file():
        return None
    return load_profile(path, expected_slug=device_slug(device_name))


def parse_profile(raw: bytes | str, path: str | os.PathLike = "profile") -> Profile:
    """Check a profile's bytes against the catalog; KdaPolicyError names the file."""
    path = Path(path)
    label = f"profile {path.name}"
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise KdaPolicyError(f"{label}: not JSON ({error})") from error
    if not isinstance(document, dict):
        raise KdaPolicyError(f"{label}: a profile is a JSON object")
    if document.get("format") != PROFILE_FORMAT:
        raise KdaPolicyError(f"{label}: format {document.get('format')!r}, expected "
                             f"{PROFILE_FORMAT!r}")
    if document.get("operator") != KDA_PREFILL.operator:
        raise KdaPolicyError(f"{label}: operator {document.get('operator')!r}, expected "
                             f"{KDA_PREFILL.operator!r}")
    added = check_schema(document.get("schema"), label)
    device = document.get("device")
    if not isinstance(device, dict) or not isinstance(device.get("slug"), str):
        raise KdaPolicyError(f"{label}: 'device' must be an object with a 'slug'")
    status = document.get("status", "complete")
    if status not in STATUSES:
        raise KdaPolicyError(f"{label}: status {status!r}, expected one of {STATUSES}")
    raw_entries = document.get("entries")
    if not isinstance(raw_entries, list):
        raise KdaPolicyError(f"{label}: 'entries' must be a list")
    entries: dict[KdaQuery, ProfileEntry] = {}
    for number, item in enumerate(raw_entries, start=1):
        entry = _entry(item, f"{label}: entry {number}", added)
        if entry.query in entries:
            raise KdaPolicyError(f"{label}: entry {number}: {entry.query.describe()} is listed "
                                 "twice")
        entries[entry.query] = entry
    tools = document.get("tools")
    return Profile(path=path, device=device, tools=tools if isinstance(tools, dict) else {},
                   status=status, entries=entries, document=document)


def check_schema(schema: Any, label: str) -> dict[str, Any]:
    """Refuse schemas whose versions or field names differ from the catalog's (after the
    migration of an older config version); returns the fields that migration adds."""
    if not isinstance(schema, dict):
        raise KdaPolicyError(f"{label}: no 'schema' object (query and config versions)")
    query, config = schema.get("query"), schema.get("config")
    if not isinstance(query, dict) or not isinstance(config, dict):
        raise KdaPolicyError(f"{label}: 'schema' needs 'query' and 'config' objects")
    regenerate = "regenerate it with `kdabench tune` on that device"
    if query.get("version") != QUERY_VERSION or list(query.get("fields") or []) != \
            list(QUERY_FIELDS):
        raise KdaPolicyError(
            f"{label}: query schema v{query.get('version')} ({_names(query.get('fields'))}) "
            f"does not match this kdabench's v{QUERY_VERSION} ({', '.join(QUERY_FIELDS)}); "
            f"{regenerate}")
    fields = config.get("fields")
    names = sorted(fields) if isinstance(fields, dict) else []
    added = config_migration(config.get("version"))
    if added is None or sorted(names + list(added)) != sorted(config_fields()):
        raise KdaPolicyError(
            f"{label}: config schema v{config.get('version')} ({_names(names)}) does not "
            f"match this kdabench's v{CONFIG_VERSION} ({', '.join(sorted(config_fields()))}); "
            f"{regenerate}")
    return added


def config_migration(version: Any) -> dict[str, Any] | None:
    """The fields a config of schema `version` lacks, with the values its entries ran with
    ({} for the current version); None for a version this kdabench cannot read."""
    if not isinstance(version, int) or isinstance(version, bool) \
            or not 1 <= version <= CONFIG_VERSION:
        return None
    added: dict[str, Any] = {}
    for later in range(version + 1, CONFIG_VERSION + 1):
        added.update(CONFIG_ADDITIONS[later])
    return added


def _names(fields: Any) -> str:
    if isinstance(fields, dict):
        fields = sorted(fields)
    return ", ".join(map(str, fields)) if isinstance(fields, list) and fields else "no fields"


def _entry(item: Any, where: str, added: dict[str, Any]) -> ProfileEntry:
    if not isinstance(item, dict):
        raise KdaPolicyError(f"{where}: an entry is an object with query, config, measurements")
    missing = [key for key in ("query", "config") if key not in item]
    if missing:
        raise KdaPolicyError(f"{where}: lacks {', '.join(missing)}")
    query = KdaQuery.from_dict(item["query"], where)
    raw_config = item["config"]
    if isinstance(raw_config, dict):
        raw_config = {**added, **raw_config}
    config = config_from_dict(raw_config, where)
    problems = config_problems(config, query.head_dim)
    if problems:
        raise KdaPolicyError(f"{where}: config is not valid for {query.describe()}: "
                             + "; ".join(problems))
    measurements = item.get("measurements", {})
    if not isinstance(measurements, dict):
        raise KdaPolicyError(f"{where}: 'measurements' must be an object")
    backend = item.get("backend", BACKENDS[0])
    if backend not in BACKENDS:
        raise KdaPolicyError(f"{where}: backend {backend!r} is not one of {', '.join(BACKENDS)}")
    cute = item.get("cute_config")
    cute_config = None if cute is None else _cute_config(cute, where, query.head_dim)
    return ProfileEntry(query, config, measurements, backend, cute_config)
