"""The tuning run: per query, time every candidate, check the fastest against float64, and
write the device's profile with the measurements behind each choice.

    from kdabench.tune import Tune, load_queries

    result = Tune(load_queries(None)).run()       # needs a CUDA GPU (or an injected runner)
    result.profile_path, result.ok

Per query: the candidates (kdabench.tune.grid; with a ``shortlist``, a shape's later queries
take only the heuristic and the fastest configs of its first) are timed one after the other
on the same input sets (kdabench.tune.runner); the one with the lowest median, unless it beats
the heuristic by less than ``timing.min_gain`` (then the heuristic), is checked against the
float64 recurrence on a smaller instance of the query, and if its errors pass the queries
file's tolerances it is the entry's config; otherwise the next fastest is checked (at most
MAX_ORACLE_TRIES). A query whose candidates all fail gets no entry and fails the run.

The other backends (``backends``, default every one in kdabench.kernels.BACKENDS) are timed
beside the Triton candidates, on the same input sets, one config each (the CuTe DSL backend
has no tunables). The entry's config is always the Triton winner (what a plan that asks for
Triton runs); its ``backend`` is another backend only where that one is at least
``timing.min_gain`` faster than the Triton winner and passes the same float64 check, and a
plan with ``Caps.backend = "auto"`` (the default) then runs it. A backend that cannot run a
query here (kdabench.kernels.ineligibility) is skipped with a note.

The profile (format of kdabench.kernels.profiles) is rewritten after every query (status
"partial", then "complete"); entries already in the file for queries this run does not tune
are kept, a file that does not load (an older schema) is replaced, and a profile of another
device is refused (TuneError).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdabench.stats import median
from kdabench.tune.grid import candidates, narrowed, shared_memory_limit
from kdabench.tune.queries import TuneQueries, TuneQuery
from kdabench.tune.runner import Runner, Timed, backend_of

MAX_ORACLE_TRIES = 3
BACKEND_TRITON = "triton"  # the backend whose configs the grid holds and entries keep


class TuneError(ValueError):
    """A tuning run that cannot start (no GPU, bad options); one line."""


@dataclass
class TuneResult:
    """What a run found and where it left the profile."""

    profile_path: Path
    profile: dict[str, Any]
    records: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.records) and all(r["verdict"] == "pass" for r in self.records)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "profile": str(self.profile_path),
                "device": self.profile["device"].get("name"),
                "status": self.profile["status"], "entries": len(self.profile["entries"]),
                "notes": self.notes, "queries": self.records}


class Tune:
    """One tuning run: checks the options on construction (raises TuneError), then `run()`."""

    def __init__(self, queries: TuneQueries, *, runner: Runner | None = None,
                 out: str | os.PathLike | None = None, reps: int | None = None,
                 command_line: Sequence[str] | None = None,
                 created_at: str | None = None,
                 backends: Sequence[str] | None = None) -> None:
        from kdabench.kernels.contract import BACKENDS
        from kdabench.kernels.profiles import device_slug, profile_path

        if reps is not None and reps < 1:
            raise TuneError(f"--reps must be >= 1, got {reps}")
        backends = tuple(BACKENDS if backends is None else dict.fromkeys(backends))
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown or BACKENDS[0] not in backends:
            raise TuneError(f"--backends {','.join(backends) or '(none)'}: give some of "
                            f"{', '.join(BACKENDS)}, {BACKENDS[0]} among them (profile entries "
                            f"hold its configs)")
        self.backends = backends
        if runner is None:
            from kdabench.tune.runner import KernelRunner

            runner = KernelRunner()
        reason = runner.unavailable()
        if reason:
            raise TuneError(reason)
        self.queries, self.runner = queries, runner
        self.timing = dict(queries.timing, **({"reps": reps} if reps is not None else {}))
        self.device = dict(runner.identity())
        name = runner.device_name()  # what plans look the profile up by
        self.device.update(profile_name=name, slug=device_slug(name))
        self.out = Path(out) if out is not None else profile_path(name)
        if self.out.is_dir():
            raise TuneError(f"--out {self.out} is a folder; name the profile file "
                            f"({self.device['slug']}.json)")
        self.command_line, self.created_at = command_line, created_at
        self.notes: list[str] = []
        if self.out.name != f"{self.device['slug']}.json":
            self.notes.append(f"the catalog looks for {self.device['slug']}.json; this profile "
                              f"is named {self.out.name}")
        self.kept = self._existing_entries()
        self.shortlists: dict[Any, tuple[str, list[Any]]] = {}  # shape -> (first query, configs)
        self.skipped: dict[str, str] = {}  # backend -> why it was not timed (first query)

    def _existing_entries(self) -> dict[Any, dict[str, Any]]:
        """Entries of the profile at `out` for queries this run does not tune."""
        from kdabench.kernels import KdaPolicyError, KdaQuery
        from kdabench.kernels.catalog import config_to_dict
        from kdabench.kernels.profiles import load_profile

        if not self.out.exists():
            return {}
        try:
            profile = load_profile(self.out)
        except KdaPolicyError as error:  # stale or broken: this run replaces it
            self.notes.append(f"replacing {self.out}: {error}")
            return {}
        if profile.device.get("slug") != self.device["slug"]:
            raise TuneError(f"{self.out} is the profile of {profile.device.get('profile_name')!r}"
                            f", not of this device ({self.device['profile_name']!r}); choose "
                            "another --out")
        tuned = {query.catalog_query() for query in self.queries.queries}
        kept = {}
        for raw in profile.document["entries"]:
            query = KdaQuery.from_dict(raw["query"])
            if query not in tuned:  # as loaded: an older config schema's fields filled in
                entry = profile.entries[query]
                kept[query] = {**raw, "config": config_to_dict(entry.config),
                               "backend": entry.backend}
        if kept:
            self.notes.append(f"kept {len(kept)} entries of {self.out} for queries this run "
                              "does not tune")
        return kept

    # ----------------------------------------------------------------------- the run

    def run(self, *, on_start: Callable[[TuneQuery], None] | None = None,
            on_case: Callable[[dict[str, Any]], None] | None = None) -> TuneResult:
        records: list[dict[str, Any]] = []
        entries: list[dict[str, Any]] = []
        document: dict[str, Any] = {}
        for query in self.queries.queries:
            if on_start:
                on_start(query)
            record, entry = self.tune_query(query)
            records.append(record)
            if entry is not None:
                entries.append(entry)
            document = self.write(entries, "partial")
            if on_case:
                on_case(record)
        document = self.write(entries, "complete")
        return TuneResult(self.out, document, records, self.notes)

    def tune_query(self, query: TuneQuery) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Time the candidates of one query and check the winner: (record, entry or None)."""
        started = time.perf_counter()
        found = candidates(query, self.queries.grid, self.runner.target())
        if query.shape in self.shortlists:
            found = narrowed(found, *self.shortlists[query.shape])
        others = self._other_backend_configs(query)
        timed = self.runner.measure(query, found.configs + others, self.timing["warmup"],
                                    self.timing["reps"], self.queries.seed)
        if len(timed) != len(found.configs) + len(others):
            raise RuntimeError(f"the runner timed {len(timed)} of "
                               f"{len(found.configs) + len(others)} configs")
        rows = [self._row(config, t, config == found.heuristic)
                for config, t in zip(found.configs, timed, strict=False)]
        other_rows = [self._row(config, t, False)
                      for config, t in zip(others, timed[len(found.configs):], strict=True)]
        ranked = self._ranked(rows)
        if self.queries.shortlist and query.shape not in self.shortlists:
            self.shortlists[query.shape] = (
                query.id, [found.configs[i] for i in ranked[:self.queries.shortlist]])
        winner, oracle, rejected = None, None, []
        for index in ranked[:MAX_ORACLE_TRIES]:
            oracle = self._check(query, found.configs[index])
            if oracle["ok"]:
                winner = index
                break
            rejected.append({"config": rows[index]["config"], **oracle})
        heuristic_ms = rows[0]["median_ms"]
        backend, backend_config, compared = BACKEND_TRITON, None, []
        if winner is not None:
            backend, backend_config, compared = self._fastest_backend(query, rows[winner],
                                                                      others, other_rows)
        measurements = {
            "id": query.id,
            "shape": {"tokens": query.shape.tokens, "heads": query.shape.heads,
                      "seqs": query.shape.seqs, "seq_len": query.shape.seq_len},
            "timing": {**self.timing, "input_sets": timed[0].input_sets if timed else None,
                       "statistic": "median of the samples, calls rotating among input sets"},
            "candidates": rows,
            "refused": [{"config": dataclasses.asdict(c), "reason": reason}
                        for c, reason in found.refused],
            "rule": found.rule,
            "min_gain": self.timing["min_gain"],
            "winner": None if winner is None else {
                "index": winner, "median_ms": rows[winner]["median_ms"],
                "heuristic_median_ms": heuristic_ms,
                "speedup_over_heuristic": (heuristic_ms / rows[winner]["median_ms"]
                                           if heuristic_ms and rows[winner]["median_ms"]
                                           else None)},
            "oracle": oracle if winner is not None else None,
            "oracle_rejected": rejected,
            "backends": compared,
            "backend": backend,
        }
        record = {
            "id": query.id, "query": query.catalog_query().to_dict(),
            "candidates": len(rows), "refused": len(found.refused),
            "timed": len(ranked), "config": None if winner is None else rows[winner]["config"],
            "median_ms": None if winner is None else rows[winner]["median_ms"],
            "heuristic_median_ms": heuristic_ms,
            "speedup_over_heuristic": (measurements["winner"] or {}).get(
                "speedup_over_heuristic"),
            "oracle_errors": None if winner is None else oracle["errors"],
            "backend": None if winner is None else backend,
        }
        if winner is None:
            record["verdict"] = "error" if not ranked else "fail"
            record["message"] = self._failure(rows, ranked, rejected)
            entry = None
        else:
            record["verdict"], record["message"] = "pass", None
            entry = {"query": record["query"], "config": rows[winner]["config"],
                     "backend": backend, "measurements": measurements}
            if backend_config is not None:
                from kdabench.kernels.profiles import cute_config_to_dict

                entry["cute_config"] = cute_config_to_dict(backend_config)
        record["wall_s"] = round(time.perf_counter() - started, 3)
        return record, entry

    def _other_backend_configs(self, query: TuneQuery) -> list[Any]:
        """The configs of each other backend that can run `query` here (the cute backend: its
        chunk algorithm at every key split the head dim takes, and on WGMMA_ARCHS its pass on
        warpgroup MMA); the others are noted."""
        import torch

        from kdabench.kernels.config import CuteConfig
        from kdabench.kernels.cute.manifest import arch_of
        from kdabench.kernels.cute.variants import KEY_SPLITS, WGMMA_ARCHS, key_split_divides

        target = self.runner.target()
        wgmma = target.type == "cuda" \
            and arch_of(torch.cuda.get_device_capability(target)) in WGMMA_ARCHS
        found = []
        for backend in self.backends[1:]:
            reason = self.runner.backend_unavailable(backend, query)
            if reason is None:
                found += [CuteConfig(key_split=split) for split in KEY_SPLITS
                          if key_split_divides(split, query.head_dim)]
                if wgmma:
                    found.append(CuteConfig(algorithm="wgmma"))
            elif backend not in self.skipped:
                self.skipped[backend] = reason
                self.notes.append(f"the {backend} backend was not timed for {query.id}: "
                                  f"{reason}")
        return found

    def _fastest_backend(self, query: TuneQuery, triton: dict[str, Any], configs: list[Any],
                         rows: list[dict[str, Any]]
                         ) -> tuple[str, Any, list[dict[str, Any]]]:
        """The backend an "auto" plan of `query` runs and its config there: another backend's
        fastest config only where it is at least min_gain faster than the Triton winner
        `triton` and passes the float64 check. Returns them (the config None for Triton) and
        a record per other config timed."""
        chosen, chosen_config, best_ms, compared = BACKEND_TRITON, None, triton["median_ms"], []
        for config, row in zip(configs, rows, strict=True):
            ms = row["median_ms"]
            record = {**row, "backend": backend_of(config), "oracle": None,
                      "speedup_over_triton": triton["median_ms"] / ms if ms else None}
            if ms is not None and ms < best_ms and \
                    ms <= triton["median_ms"] * (1 - self.timing["min_gain"]):
                record["oracle"] = self._check(query, config)
                if record["oracle"]["ok"]:
                    chosen, chosen_config, best_ms = record["backend"], config, ms
            compared.append(record)
        return chosen, chosen_config, compared

    def _ranked(self, rows: list[dict[str, Any]]) -> list[int]:
        """Indices of the timed rows, fastest first; the heuristic (row 0) goes first when the
        fastest beats it by less than timing.min_gain."""
        ranked = sorted((i for i, row in enumerate(rows) if row["median_ms"] is not None),
                        key=lambda i: rows[i]["median_ms"])
        heuristic_ms = rows[0]["median_ms"] if rows else None
        if ranked and ranked[0] != 0 and heuristic_ms is not None and \
                rows[ranked[0]]["median_ms"] > heuristic_ms * (1 - self.timing["min_gain"]):
            ranked.remove(0)
            ranked.insert(0, 0)
        return ranked

    @staticmethod
    def _row(config: Any, timed: Timed, heuristic: bool) -> dict[str, Any]:
        samples = timed.samples_ms
        return {"config": dataclasses.asdict(config), "heuristic": heuristic,
                "median_ms": median(samples) if not timed.error else None,
                "min_ms": min(samples) if samples else None,
                "max_ms": max(samples) if samples else None,
                "samples": len(samples), "error": timed.error}

    def _check(self, query: TuneQuery, config: Any) -> dict[str, Any]:
        check = self.queries.check
        tolerances = {"output": check["tolerances"]["output"],
                      "final_state": check["tolerances"]["state"],
                      "checkpoint": check["tolerances"]["state"]}
        try:
            found = self.runner.check(query, config, check, self.queries.seed)
        except Exception as error:  # noqa: BLE001 - a crash fails this candidate, not the run
            return {"ok": False, "errors": {}, "tolerances": tolerances,
                    "error": f"{type(error).__name__}: {error}"}
        errors = found.get("errors", {})
        ok = all(isinstance(errors.get(name), (int, float)) and errors[name] <= limit
                 for name, limit in tolerances.items())
        return {"ok": ok, "instance": found.get("instance"), "errors": errors,
                "tolerances": tolerances}

    @staticmethod
    def _failure(rows: list[dict[str, Any]], ranked: list[int],
                 rejected: list[dict[str, Any]]) -> str:
        if not ranked:
            first = next((row["error"] for row in rows if row["error"]), "no candidates")
            return f"no candidate config ran: {first}"
        worst = "; ".join(f"{r.get('error') or r['errors']}" for r in rejected[:2])
        return (f"the {len(rejected)} fastest candidates failed the float64 check "
                f"({worst})")

    # ----------------------------------------------------------------------- the profile

    def document(self, entries: list[dict[str, Any]], status: str) -> dict[str, Any]:
        from kdabench.environment import toolchain
        from kdabench.kernels.profiles import profile_document
        from kdabench.receipts.encoding import utc_now
        from kdabench.sources import source_hashes

        if self.created_at is None:
            self.created_at = utc_now()
        tune = {
            "queries_name": self.queries.name,
            "queries_origin": "default" if self.queries.origin == "default" else "file",
            "queries_sha256": self.queries.sha256,
            "timing": self.timing, "check": self.queries.check, "grid": self.queries.grid,
            "seed": self.queries.seed,
            "shared_memory_limit_bytes": shared_memory_limit(self.runner.target()),
            "command_line": list(self.command_line) if self.command_line else None,
            "kept_entries": len(self.kept),
        }
        return profile_document(self.device["profile_name"], entries + list(self.kept.values()),
                                status=status, device=self.device, tools=toolchain(),
                                sources=source_hashes(), created_at=self.created_at, tune=tune)

    def write(self, entries: list[dict[str, Any]], status: str) -> dict[str, Any]:
        """Check the document as the catalog will read it, then write it atomically."""
        from kdabench.kernels.profiles import parse_profile
        from kdabench.receipts import sanitize
        from kdabench.receipts.write import atomic_write_bytes

        document = sanitize(self.document(entries, status))  # inf errors as "inf"
        text = json.dumps(document, indent=1, allow_nan=False) + "\n"
        parse_profile(text, self.out)  # a document the catalog refuses is a bug here
        atomic_write_bytes(self.out, text.encode("utf-8"))
        return document
