"""The sweep: every arm's server up at once, measured in interleaved rounds, one receipt.

Order of work (DESIGN section 6)::

    start or attach every arm's server, wait for /health, read /version and /v1/models
    per arm: activation patterns over the log so far ("before timing")
    per arm: shape warmups (one unique prompt per size and warmup; never counted)
    per arm: probes: a cold prompt, its exact repeat and its extension by the first half
             of its own greedy answer must answer alike; logprob drift under the bound;
             the repeat or the extension must (prefix cache on) report cached tokens, or
             neither may (off)
    rounds:  A B C ..., then ... C B A: one cold sample per arm and prompt size each;
             a sample that reports cached tokens (usage or /metrics) is discarded
    shared prefix: P1 (unique) then P2 = P1's first half + another continuation
    decode:  output tokens/s over a fixed window, normalised by the speculative
             acceptance length read from /metrics
    per arm: activation patterns again, and `activation_after` over the log written
             while measuring

A server that fails mid-sweep ends its arm: the failure is a case, every sample so far is
kept, the receipt is left "partial" and the result is not ok. The receipt is rewritten
after every phase and round, so an interrupted sweep leaves a partial receipt too.
"""

from __future__ import annotations

import dataclasses
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdabench.receipts import ReceiptBuilder, new_receipt
from kdabench.sweep import stats
from kdabench.sweep.arms import Arm, ArmsFile, check_patterns
from kdabench.sweep.client import (
    PREFIX_CACHE_HITS,
    SPEC_ACCEPTED,
    SPEC_DRAFTS,
    Completion,
    ServerClient,
    ServerError,
    ServerGone,
)
from kdabench.sweep.prompts import PromptError, PromptFactory
from kdabench.sweep.servers import (
    AttachedServer,
    EmbeddedServer,
    LaunchedServer,
    ServerStartError,
)

MODES = ("embedded", "launch", "attach")
DEATH_GRACE_S = 2.0  # how long a dropped connection waits for its process to exit
SAMPLE_MAX_TOKENS = 4  # a cold sample needs only its first token; a few guard empty ones
TTFT_DEFINITION = ("monotonic time (time.perf_counter) from sending the request to the first "
                   "streamed chunk carrying generated text; role-only, empty and usage chunks "
                   "do not stop the clock")


class SweepError(ValueError):
    """Options that cannot make a sweep; one line for the user."""


@dataclass(frozen=True)
class SweepOptions:
    """What to measure; defaults come from the arms file's [sweep], then from here."""

    prompt_tokens: tuple[int, ...] = (8192, 16384, 32768)
    samples: int = 3  # cold samples per arm and prompt size
    rounds: int | None = None  # rounds they are spread over (default: samples)
    warmups: int = 1
    decode_window_s: float = 2.0
    decode_prompt_tokens: int = 256
    decode_max_tokens: int = 1024
    probe_tokens: int = 16
    probe_prompt_tokens: int | None = None  # default: the smallest prompt size + 16
    drift_bound: float = 0.05
    shared_prefix_tokens: int = 8192
    shared_prefix_repeats: int = 1
    health_timeout_s: float = 120.0
    request_timeout_s: float = 600.0
    seed: int = 0

    @classmethod
    def resolve(cls, file_defaults: dict[str, Any], overrides: dict[str, Any]) -> SweepOptions:
        """Options from the arms file's [sweep], overridden by non-None ``overrides``."""
        values = {**file_defaults, **{k: v for k, v in overrides.items() if v is not None}}
        if "prompt_tokens" in values:
            values["prompt_tokens"] = tuple(int(v) for v in values["prompt_tokens"])
        options = cls(**values)
        options.validate()
        return options

    @property
    def round_count(self) -> int:
        return self.rounds if self.rounds is not None else self.samples

    @property
    def probe_prompt_size(self) -> int:
        """The probes' prompt length. A server computes at least the last token of a
        repeated prompt, so a block-aligned prompt finds its last block uncached; 16 tokens
        past the smallest size let the repeat of a block-aligned size hit the cache."""
        if self.probe_prompt_tokens is not None:
            return self.probe_prompt_tokens
        return min(self.prompt_tokens) + 16

    @property
    def samples_per_round(self) -> int:
        return self.samples // self.round_count

    def validate(self) -> None:
        if not self.prompt_tokens or any(n < 16 for n in self.prompt_tokens):
            raise SweepError("prompt sizes must be at least 16 tokens each")
        if len(set(self.prompt_tokens)) != len(self.prompt_tokens):
            raise SweepError("prompt sizes must not repeat")
        for name in ("samples", "probe_tokens", "decode_prompt_tokens", "decode_max_tokens",
                     "shared_prefix_repeats"):
            if getattr(self, name) < 1:
                raise SweepError(f"{name.replace('_', ' ')} must be at least 1")
        if self.warmups < 0:
            raise SweepError("warmups must be 0 or more")
        if self.probe_prompt_tokens is not None and self.probe_prompt_tokens < 16:
            raise SweepError("probe prompt tokens must be at least 16")
        if self.probe_tokens < 2:
            raise SweepError("probe tokens must be at least 2 (the extension uses half)")
        if self.round_count < 1 or self.samples % self.round_count:
            raise SweepError(f"{self.samples} samples cannot be spread evenly over "
                             f"{self.round_count} rounds; make rounds divide samples")
        if self.shared_prefix_tokens < 32 or self.shared_prefix_tokens % 2:
            raise SweepError("shared prefix tokens must be an even number, at least 32")
        for name in ("decode_window_s", "drift_bound", "health_timeout_s", "request_timeout_s"):
            if getattr(self, name) <= 0:
                raise SweepError(f"{name.replace('_', ' ')} must be positive")


@dataclass
class ArmState:
    """Everything measured for one arm so far (raw; cases are derived from it)."""

    arm: Arm
    server: Any
    client: ServerClient | None = None
    prompts: PromptFactory | None = None
    info: dict[str, Any] = field(default_factory=dict)
    activation_before: dict[str, Any] | None = None
    activation_after: dict[str, Any] | None = None
    log_offset: int = 0
    warmups: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    probe: dict[str, Any] | None = None
    samples: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    discarded: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    shared_prefix: list[dict[str, Any]] = field(default_factory=list)
    decode: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None

    @property
    def active(self) -> bool:
        return self.failure is None

    @property
    def activation_status(self) -> str:
        statuses = [a["status"] for a in (self.activation_before, self.activation_after) if a]
        if "failed" in statuses:
            return "failed"
        if not statuses or all(s == "not checked" for s in statuses):
            return "not checked"
        return "passed"


@dataclass
class SweepResult:
    """The sealed receipt, where it was written, and whether every check passed."""

    receipt: dict[str, Any]
    receipt_path: Path
    ok: bool
    complete: bool
    failures: list[dict[str, Any]]

    @property
    def cases(self) -> list[dict[str, Any]]:
        return self.receipt["cases"]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "status": self.receipt["status"],
                "receipt": str(self.receipt_path), "sha256": self.receipt["sha256"],
                "summary": self.receipt["summary"], "failures": self.failures,
                "cases": self.receipt["cases"]}


class Sweep:
    """One serve-sweep run. Build it (which validates), then :meth:`run` it."""

    def __init__(self, arms: ArmsFile, options: SweepOptions, *, mode: str = "embedded",
                 launch: str | None = None, endpoint: str | None = None,
                 out_dir: str | Path = "results", api_key: str | None = None,
                 api_key_env: str | None = None, command_line: list[str] | None = None,
                 device: Any = None) -> None:
        if mode not in MODES:
            raise SweepError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        if mode == "launch" and not launch:
            raise SweepError("launch mode needs a command (--launch CMD)")
        if mode == "attach" and not endpoint and not all(a.endpoint for a in arms.arms):
            raise SweepError("attach mode needs --endpoint URL or an endpoint for every arm")
        options.validate()
        self.arms = arms
        self.options = options
        self.mode = mode
        self.launch = launch
        self.endpoint = endpoint
        self._api_key = api_key
        config = {
            "arms": arms.to_receipt(),
            "options": {k: (list(v) if isinstance(v, tuple) else v)
                        for k, v in dataclasses.asdict(options).items()},
            "rounds": options.round_count,
            "mode": mode,
            "launch": launch,
            "endpoint": endpoint,
            "api_key": {"env": api_key_env, "sent": bool(api_key)},
            "client_host": client_host(),
            "ttft_definition": TTFT_DEFINITION,
            "servers": {},
        }
        if device is None:
            from kdabench.environment import device_identity

            device = device_identity("cpu")
        self._builder = new_receipt("serve-sweep", config=config, command_line=command_line,
                                    device=device)
        self.path = Path(out_dir) / self._builder.filename()
        self.log_dir = self.path.with_suffix("").with_name(self.path.stem + "-logs")
        self.states = [ArmState(arm=arm, server=None) for arm in arms.arms]
        self.on_event: Callable[[str], None] = lambda message: None
        self.on_update: Callable[[], None] = lambda: None

    # ---------------------------------------------------------------- the run

    def run(self) -> SweepResult:
        """Run the sweep; returns the result with the final receipt (written)."""
        self._snapshot("partial")
        try:
            self._start_servers()
            for state in self._active():
                self._phase(state, "server info", self._server_info)
            for state in self._active():
                self._phase(state, "activation before timing", self._activation_before)
            for state in self._active():
                self._phase(state, "warmups", self._warmups)
            for state in self._active():
                self._phase(state, "probes", self._probes)
            self._snapshot("partial")
            for round_index in range(self.options.round_count):
                for size in self.options.prompt_tokens:
                    for state in self._order(round_index):
                        for _ in range(self.options.samples_per_round):
                            self._phase(state, f"round {round_index + 1} {size}-token sample",
                                        lambda s, r=round_index, n=size: self._cold(s, n, r))
                self._snapshot("partial")
            for repeat in range(self.options.shared_prefix_repeats):
                for state in self._order(repeat):
                    self._phase(state, "shared prefix", self._shared_prefix)
            for state in self._active():
                self._phase(state, "decode", self._decode)
            for state in self._active():
                self._phase(state, "activation after timing", self._activation_after)
        except KeyboardInterrupt:
            self._snapshot("partial")
            raise
        finally:
            self._stop_servers()
        failures = [s.failure for s in self.states if s.failure]
        complete = not failures
        receipt = self._snapshot("complete" if complete else "partial")
        ok = complete and all(case["verdict"] == "pass" for case in receipt["cases"])
        return SweepResult(receipt=receipt, receipt_path=self.path, ok=ok, complete=complete,
                           failures=failures)

    def _active(self) -> list[ArmState]:
        return [state for state in self.states if state.active]

    def _order(self, round_index: int) -> list[ArmState]:
        order = self.states if round_index % 2 == 0 else list(reversed(self.states))
        return [state for state in order if state.active]

    def _phase(self, state: ArmState, name: str, step: Callable[[ArmState], None]) -> None:
        if not state.active:
            return
        self.on_event(f"{state.arm.name}: {name}")
        try:
            step(state)
        except (ServerError, PromptError) as error:
            message = str(error)
            if isinstance(error, ServerGone) and state.server is not None:
                deadline = time.monotonic() + DEATH_GRACE_S  # let a dying process finish
                while state.server.alive() and time.monotonic() < deadline:
                    time.sleep(0.05)
                if not state.server.alive():
                    message = f"{message}; {state.server.failure()}"
            state.failure = {"arm": state.arm.name, "phase": name, "message": message,
                             "kind": type(error).__name__}
            self.on_event(f"{state.arm.name}: FAILED during {name}: {message}")
        self.on_update()

    # ---------------------------------------------------------------- servers

    def _start_servers(self) -> None:
        for state in self.states:
            arm = state.arm
            env = self.arms.arm_env(arm)
            if self.mode == "launch":
                log = self.log_dir / f"{arm.name}.log"
                state.server = LaunchedServer(self.launch or "", self.arms.arm_args(arm), env,
                                              log)
            elif self.mode == "attach":
                state.server = AttachedServer(arm.endpoint or self.endpoint or "", arm.log)
            else:
                state.server = EmbeddedServer(env, seed=self.options.seed)
            self.on_event(f"{arm.name}: starting the server ({self.mode})")
            try:
                state.server.start(self.options.health_timeout_s)
            except ServerStartError as error:
                state.failure = {"arm": arm.name, "phase": "server start",
                                 "message": str(error), "kind": type(error).__name__}
                self.on_event(f"{arm.name}: FAILED to start: {error}")
                continue
            state.client = ServerClient(state.server.url, api_key=self._api_key,
                                        request_timeout_s=self.options.request_timeout_s)
            state.prompts = PromptFactory(state.client.tokenize, seed=self.options.seed)

    def _stop_servers(self) -> None:
        for state in self.states:
            if state.client is not None:
                state.client.close()
            if state.server is not None:
                try:
                    state.server.stop()
                except Exception as error:  # noqa: BLE001 - stopping must not hide results
                    self.on_event(f"{state.arm.name}: could not stop the server: {error}")

    def _server_info(self, state: ArmState) -> None:
        client = state.client
        assert client is not None
        state.info = {
            "server": state.server.describe(),
            "health": client.health(),
            "version": client.get_json("/version"),
            "models": client.resolve_model(),
            "metrics_served": client.metrics() is not None,
        }

    # ---------------------------------------------------------------- activation

    def _activation_before(self, state: ArmState) -> None:
        log = state.server.log_text()
        state.log_offset = len(log or "")
        state.activation_before = check_patterns(state.arm.activation, log)

    def _activation_after(self, state: ArmState) -> None:
        log = state.server.log_text()
        whole = check_patterns(state.arm.activation, log)
        during = check_patterns(state.arm.activation_after,
                                None if log is None else log[state.log_offset:])
        if log is None:
            status = "not checked"
        else:
            status = "failed" if "failed" in (whole["status"], during["status"]) else "passed"
        state.activation_after = {"status": status, "missing": whole["missing"] +
                                  during["missing"], "matches": {**whole["matches"],
                                                                 **during["matches"]}}

    # ---------------------------------------------------------------- measurements

    def _measure(self, state: ArmState, text: str, max_tokens: int,
                 logprobs: bool = False) -> tuple[Completion, float | None]:
        """One completion with the /metrics prefix-cache hit delta around it."""
        client = state.client
        assert client is not None
        before = client.metrics()
        completion = client.complete(text, max_tokens=max_tokens, logprobs=logprobs)
        after = client.metrics()
        delta = None
        if before is not None and after is not None and PREFIX_CACHE_HITS in after:
            delta = after[PREFIX_CACHE_HITS] - before.get(PREFIX_CACHE_HITS, 0.0)
        return completion, delta

    def _timed_record(self, state: ArmState, size: int, **extra: Any) -> dict[str, Any]:
        assert state.prompts is not None
        prompt = state.prompts.unique(size)
        completion, hits_delta = self._measure(state, prompt.text, SAMPLE_MAX_TOKENS)
        record = {
            **extra,
            "ttft_ms": _ms(completion.ttft_s),
            "total_ms": _ms(completion.total_s),
            "prompt_tokens": completion.prompt_tokens,
            "tokenized_tokens": prompt.tokens,
            "cached_tokens": completion.cached_tokens,
            "metrics_hits_delta": hits_delta,
            "nonce": prompt.nonce,
        }
        record["cached_reasons"] = _cached_reasons(completion, hits_delta)
        return record

    def _warmups(self, state: ArmState) -> None:
        for size in self.options.prompt_tokens:
            for index in range(self.options.warmups):
                record = self._timed_record(state, size, warmup=index)
                state.warmups.setdefault(size, []).append(record)

    def _cold(self, state: ArmState, size: int, round_index: int) -> None:
        position = [s.arm.name for s in self._order(round_index)].index(state.arm.name)
        record = self._timed_record(state, size, round=round_index, position=position,
                                    at=time.time())
        if record["ttft_ms"] is None:
            record["cached_reasons"].append("no generated text (no TTFT)")
        if record["cached_reasons"]:
            state.discarded.setdefault(size, []).append(record)
            self.on_event(f"{state.arm.name}: {size}-token sample discarded: "
                          f"{'; '.join(record['cached_reasons'])}")
        else:
            state.samples.setdefault(size, []).append(record)

    def _probes(self, state: ArmState) -> None:
        assert state.prompts is not None
        size = self.options.probe_prompt_size
        n = self.options.probe_tokens
        prompt = state.prompts.unique(size)
        cold, cold_hits = self._measure(state, prompt.text, n, logprobs=True)
        repeat, repeat_hits = self._measure(state, prompt.text, n, logprobs=True)
        prefix_tokens, prefix_text = _clean_prefix(cold, n // 2)
        if prefix_tokens:
            extension_text = prompt.text + prefix_text
        else:  # no clean answer text to extend with: extend with fresh text, no comparison
            extension_text = prompt.text + " " + state.prompts.unique(16).text
        extension, extension_hits = self._measure(state, extension_text, n, logprobs=True)

        expected_rest = cold.text[len(prefix_text):] if prefix_tokens else None
        checks: dict[str, Any] = {
            "cold_uncached": _cached_reasons(cold, cold_hits) == [],
            "repeat_same_answer": repeat.text == cold.text and bool(cold.text),
            "extension_same_answer": (None if expected_rest is None
                                      else _same_start(extension.text, expected_rest)),
        }
        repeat_cached = _cached_count(repeat, repeat_hits)
        extension_cached = _cached_count(extension, extension_hits)
        if state.arm.prefix_cache:  # a cache of final states only serves the extension
            checks["cache_reused"] = bool(repeat_cached) or bool(extension_cached)
        else:
            checks["cache_unused"] = repeat_cached == 0 and extension_cached == 0
        drift_repeat = _drift(cold.token_logprobs, repeat.token_logprobs)
        drift_extension = (_drift(cold.token_logprobs[prefix_tokens:], extension.token_logprobs)
                           if prefix_tokens else None)
        drifts = [d for d in (drift_repeat, drift_extension) if d is not None]
        drift = max(drifts) if drifts else None
        checks["drift_within_bound"] = None if drift is None else drift <= self.options.drift_bound
        state.probe = {
            "prompt_tokens": cold.prompt_tokens, "tokenized_tokens": prompt.tokens,
            "answer_tokens": n, "extension_answer_tokens": prefix_tokens,
            "cold": _answer(cold, cold_hits), "repeat": _answer(repeat, repeat_hits),
            "extension": _answer(extension, extension_hits),
            "repeat_cached_tokens": repeat_cached, "extension_cached_tokens": extension_cached,
            "drift_repeat": drift_repeat, "drift_extension": drift_extension,
            "drift": drift, "drift_bound": self.options.drift_bound, "checks": checks,
        }

    def _shared_prefix(self, state: ArmState) -> None:
        assert state.prompts is not None
        total = self.options.shared_prefix_tokens
        head = state.prompts.unique(total // 2)
        first = state.prompts.extend(head.text, total)
        second = state.prompts.extend(head.text, total)
        p1, p1_hits = self._measure(state, first.text, SAMPLE_MAX_TOKENS)
        p2, p2_hits = self._measure(state, second.text, SAMPLE_MAX_TOKENS)
        state.shared_prefix.append({
            "shared_tokens": head.tokens, "total_tokens": total,
            "p1_ttft_ms": _ms(p1.ttft_s), "p1_prompt_tokens": p1.prompt_tokens,
            "p1_cached_tokens": p1.cached_tokens, "p1_metrics_hits_delta": p1_hits,
            "p2_ttft_ms": _ms(p2.ttft_s), "p2_prompt_tokens": p2.prompt_tokens,
            "p2_cached_tokens": p2.cached_tokens, "p2_metrics_hits_delta": p2_hits,
        })

    def _decode(self, state: ArmState) -> None:
        assert state.prompts is not None and state.client is not None
        prompt = state.prompts.unique(self.options.decode_prompt_tokens)
        before = state.client.metrics() or {}
        window = state.client.decode_window(prompt.text, window_s=self.options.decode_window_s,
                                            max_tokens=self.options.decode_max_tokens)
        after = state.client.metrics() or {}
        drafts = after.get(SPEC_DRAFTS, 0.0) - before.get(SPEC_DRAFTS, 0.0)
        accepted = after.get(SPEC_ACCEPTED, 0.0) - before.get(SPEC_ACCEPTED, 0.0)
        acceptance = 1.0 + accepted / drafts if drafts > 0 else 1.0
        tokens_per_s = window.tokens_per_s
        state.decode = {
            "window_s": window.window_s, "elapsed_s": window.elapsed_s,
            "output_tokens": window.tokens, "ended_early": window.ended_early,
            "ttft_ms": _ms(window.ttft_s), "prompt_tokens": prompt.tokens,
            "spec_drafts": drafts, "spec_accepted_tokens": accepted,
            "acceptance_length": acceptance, "tokens_per_s": tokens_per_s,
            "steps_per_s": None if tokens_per_s is None else tokens_per_s / acceptance,
        }

    # ---------------------------------------------------------------- cases and receipt

    def live_rows(self) -> list[dict[str, Any]]:
        """Rows of the live table: one per arm and prompt size."""
        rows = []
        for state in self.states:
            for size in self.options.prompt_tokens:
                ttfts = [r["ttft_ms"] for r in state.samples.get(size, [])]
                median_ms = stats.median(ttfts)
                tokens = _median_tokens(state.samples.get(size, []), size)
                rows.append({
                    "arm": state.arm.name, "prompt_tokens": size, "n": len(ttfts),
                    "discarded": len(state.discarded.get(size, [])), "median_ms": median_ms,
                    "rate_tok_s": _rate(tokens, median_ms),
                    "status": ("failed" if state.failure else
                               "not activated" if state.activation_status == "failed" else ""),
                })
        return rows

    def cases(self) -> list[dict[str, Any]]:
        """The receipt's cases for everything measured so far."""
        cases: list[dict[str, Any]] = []
        for index, state in enumerate(self.states):
            cases.extend(self._arm_cases(state, index))
        return cases

    def _arm_cases(self, state: ArmState, index: int) -> list[dict[str, Any]]:
        arm = state.arm.name
        activation = state.activation_status
        invalid = activation == "failed"
        flag = ({"valid": False, "message": "arm not activated: its activation patterns "
                 "failed, so its numbers are not valid"} if invalid else {"valid": True})
        cases = [{
            "id": f"server/{arm}", "kind": "server", "arm": arm,
            "verdict": "fail" if invalid or state.failure else "pass",
            "activation": activation, "activation_before": state.activation_before,
            "activation_after": state.activation_after, **state.info,
            "message": (state.failure["message"] if state.failure else
                        "activation patterns failed" if invalid else
                        "activation not checked (no server log)"
                        if activation == "not checked" else "activated"),
        }]
        if state.failure:
            cases.append({"id": f"failure/{arm}", "kind": "failure", "arm": arm,
                          "verdict": "error", **state.failure})
        if state.probe is not None:
            failed = [name for name, ok in state.probe["checks"].items() if ok is False]
            cases.append({"id": f"probe/{arm}", "kind": "probe", "arm": arm,
                          "verdict": "fail" if failed else "pass",
                          "message": f"failed: {', '.join(failed)}" if failed else "passed",
                          **state.probe})
        for size in self.options.prompt_tokens:
            samples = state.samples.get(size, [])
            discarded = state.discarded.get(size, [])
            warmups = state.warmups.get(size, [])
            if not samples and not discarded and not warmups:
                continue
            ttfts = [r["ttft_ms"] for r in samples]
            summary = stats.summarize_samples(ttfts, seed=self.options.seed + index * 1009 + size)
            tokens = _median_tokens(samples, size)
            ci = summary["ci95"]
            verdict, message = "pass", f"{len(samples)} cold samples"
            if discarded:
                verdict = "fail"
                message = (f"{len(discarded)} sample(s) found cached or empty and discarded; "
                           f"{len(samples)} counted")
            elif len(samples) < self.options.samples:
                verdict = "error" if state.failure else "fail"
                message = f"{len(samples)} of {self.options.samples} samples taken"
            if invalid:
                verdict, message = "fail", flag["message"]
            cases.append({
                "id": f"cold/{arm}/{size}", "kind": "cold-ttft", "arm": arm,
                "prompt_tokens_requested": size, "prompt_tokens": tokens,
                "samples_ms": ttfts, "median_ms": summary["median"], "ci95_ms": ci,
                "min_ms": summary["min"], "max_ms": summary["max"], "n": summary["n"],
                "rate_tok_s": _rate(tokens, summary["median"]),
                "rate_ci95_tok_s": (None if ci is None or tokens is None else
                                    [_rate(tokens, ci[1]), _rate(tokens, ci[0])]),
                "samples": samples, "discarded": discarded,
                "warmups_ms": [r["ttft_ms"] for r in warmups], "warmups": warmups,
                "activation": activation, **flag, "verdict": verdict, "message": message,
            })
        if state.shared_prefix:
            p2 = [r["p2_ttft_ms"] for r in state.shared_prefix if r["p2_ttft_ms"] is not None]
            p1 = [r["p1_ttft_ms"] for r in state.shared_prefix if r["p1_ttft_ms"] is not None]
            cached = [r["p2_cached_tokens"] for r in state.shared_prefix]
            cases.append({
                "id": f"shared-prefix/{arm}", "kind": "shared-prefix", "arm": arm,
                "total_tokens": self.options.shared_prefix_tokens,
                "shared_tokens": state.shared_prefix[0]["shared_tokens"],
                "p1_ttft_ms": p1, "p2_ttft_ms": p2, "p2_median_ms": stats.median(p2),
                "p1_median_ms": stats.median(p1), "p2_cached_tokens": cached,
                "samples": state.shared_prefix, "activation": activation, **flag,
                "verdict": "fail" if invalid or not p2 else "pass",
                "message": flag.get("message", f"P2 cached tokens {cached}"),
            })
        if state.decode is not None:
            decode_ok = bool(state.decode["output_tokens"])
            cases.append({
                "id": f"decode/{arm}", "kind": "decode", "arm": arm, **state.decode,
                "activation": activation, **flag,
                "verdict": "pass" if decode_ok and not invalid else "fail",
                "message": flag.get("message", "" if decode_ok else "no tokens in the window"),
            })
        return cases

    def _snapshot(self, status: str) -> dict[str, Any]:
        meta = self._builder
        config = dict(meta.config)
        config["servers"] = {s.arm.name: s.info for s in self.states if s.info}
        builder = ReceiptBuilder(meta.kind, config=config, command_line=meta.command_line,
                                 device=meta.device, toolchain=meta.toolchain, git=meta.git,
                                 sources=meta.sources, tool_version=meta.tool_version,
                                 created_at=meta.created_at)
        for case in self.cases():
            builder.add_case(case)
        builder.write(self.path, status=status)
        return builder.document(status)


# -------------------------------------------------------------------- helpers


def client_host() -> dict[str, Any]:
    """Who measured: the client's host name, platform and Python."""
    return {"hostname": socket.gethostname(), "platform": platform.platform(),
            "python": platform.python_version(), "clock": "time.perf_counter"}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _rate(tokens: float | None, median_ms: float | None) -> float | None:
    if tokens is None or not median_ms:
        return None
    return tokens / (median_ms / 1000.0)


def _median_tokens(samples: list[dict[str, Any]], fallback: int) -> float | None:
    counts = [r["prompt_tokens"] for r in samples if r.get("prompt_tokens") is not None]
    if not samples:
        return None
    return stats.median(counts) if counts else float(fallback)


def _cached_reasons(completion: Completion, hits_delta: float | None) -> list[str]:
    reasons = []
    if completion.cached_tokens:
        reasons.append(f"usage reports {completion.cached_tokens} cached tokens")
    if hits_delta:
        reasons.append(f"/metrics prefix-cache hits rose by {hits_delta:g} tokens")
    return reasons


def _cached_count(completion: Completion, hits_delta: float | None) -> float | None:
    if completion.cached_tokens is not None:
        return completion.cached_tokens
    return hits_delta


def _answer(completion: Completion, hits_delta: float | None) -> dict[str, Any]:
    return {"text": completion.text, "token_logprobs": completion.token_logprobs,
            "ttft_ms": _ms(completion.ttft_s), "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "cached_tokens": completion.cached_tokens, "metrics_hits_delta": hits_delta}


def _clean_prefix(completion: Completion, want: int) -> tuple[int, str]:
    """The first ``want`` answer tokens as text, cut before any token that is not plain
    printable ASCII (which might not tokenize back to itself); (tokens, text)."""
    pieces = completion.tokens
    if len(pieces) < want:  # no token strings: one character per token (byte-level)
        pieces = list(completion.text)
    taken: list[str] = []
    for piece in pieces[:want]:
        if not piece or not all(32 <= ord(ch) < 127 for ch in piece):
            break
        taken.append(piece)
    return len(taken), "".join(taken)


def _same_start(got: str, expected: str) -> bool:
    common = min(len(got), len(expected))
    return common > 0 and got[:common] == expected[:common]


def _drift(first: list[float | None], second: list[float | None]) -> float | None:
    pairs = [(a, b) for a, b in zip(first, second) if a is not None and b is not None]
    if not pairs:
        return None
    return max(abs(float(a) - float(b)) for a, b in pairs)
