"""The sweep: every arm's server up at once, measured in interleaved rounds, one receipt.

Order of work (DESIGN section 6)::

    start or attach every arm's server, wait for /health, read /version and /v1/models
    check every request fits each server's max_model_len (else SweepError, no receipt)
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdabench.receipts import ReceiptBuilder, new_receipt, receipt_dir
from kdabench.sweep import phases
from kdabench.sweep.arms import ArmsFile
from kdabench.sweep.cases import live_rows, sweep_cases
from kdabench.sweep.client import ServerClient, ServerError, ServerGone
from kdabench.sweep.limits import check_context
from kdabench.sweep.options import SweepError, SweepOptions
from kdabench.sweep.prompts import PromptError, PromptFactory
from kdabench.sweep.servers import (
    EMBEDDED_MAX_MODEL_LEN,
    AttachedServer,
    EmbeddedServer,
    LaunchedServer,
    ServerStartError,
)
from kdabench.sweep.state import ArmState

MODES = ("embedded", "launch", "attach")
DEATH_GRACE_S = 2.0  # how long a dropped connection waits for its process to exit
TTFT_DEFINITION = ("monotonic time (time.perf_counter) from sending the request to the first "
                   "streamed chunk carrying generated text; role-only, empty and usage chunks "
                   "do not stop the clock")


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
                 out_dir: str | Path | None = None, api_key: str | None = None,
                 api_key_env: str | None = None, command_line: list[str] | None = None,
                 device: Any = None) -> None:
        if mode not in MODES:
            raise SweepError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        if mode == "launch" and not launch:
            raise SweepError("launch mode needs a command (--launch CMD)")
        if mode == "attach" and not endpoint and not all(a.endpoint for a in arms.arms):
            raise SweepError("attach mode needs --endpoint URL or an endpoint for every arm")
        options.validate()
        if mode == "embedded":
            check_context(options, EMBEDDED_MAX_MODEL_LEN, "the embedded server")
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
        self.path = receipt_dir(out_dir) / self._builder.filename()
        self.log_dir = self.path.with_suffix("").with_name(self.path.stem + "-logs")
        self.states = [ArmState(arm=arm, server=None) for arm in arms.arms]
        self.on_event: Callable[[str], None] = lambda message: None
        self.on_update: Callable[[], None] = lambda: None

    # ---------------------------------------------------------------- the run

    def run(self) -> SweepResult:
        """Run the sweep; returns the result with the final receipt (written). Raises
        SweepError, before any receipt is written, when a server's max_model_len is too
        short for the sweep's requests."""
        try:
            self._start_servers()
            for state in self._active():
                self._phase(state, "server info", phases.server_info)
            self._check_context()
            self._snapshot("partial")
            for state in self._active():
                self._phase(state, "activation before timing", phases.activation_before)
            for state in self._active():
                self._phase(state, "warmups", lambda s: phases.warmups(s, self.options))
            for state in self._active():
                self._phase(state, "probes", lambda s: phases.probes(s, self.options))
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
                    self._phase(state, "shared prefix",
                                lambda s: phases.shared_prefix(s, self.options))
            for state in self._active():
                self._phase(state, "decode", lambda s: phases.decode(s, self.options))
            for state in self._active():
                self._phase(state, "activation after timing", phases.activation_after)
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

    def _check_context(self) -> None:
        """SweepError when a request would not fit the max_model_len a server reported."""
        for state in self._active():
            limit = state.info.get("max_model_len")
            if limit is not None:
                check_context(self.options, limit,
                              f"the server of arm {state.arm.name!r} ({state.server.url})")

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

    def _cold(self, state: ArmState, size: int, round_index: int) -> None:
        position = [s.arm.name for s in self._order(round_index)].index(state.arm.name)
        record = phases.cold_sample(state, size, round_index, position)
        if record["cached_reasons"]:
            self.on_event(f"{state.arm.name}: {size}-token sample discarded: "
                          f"{'; '.join(record['cached_reasons'])}")

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

    # ---------------------------------------------------------------- cases and receipt

    def live_rows(self) -> list[dict[str, Any]]:
        """Rows of the live table: one per arm and prompt size."""
        return live_rows(self.states, self.options)

    def _snapshot(self, status: str) -> dict[str, Any]:
        meta = self._builder
        config = dict(meta.config)
        config["servers"] = {s.arm.name: s.info for s in self.states if s.info}
        builder = ReceiptBuilder(meta.kind, config=config, command_line=meta.command_line,
                                 device=meta.device, toolchain=meta.toolchain, git=meta.git,
                                 sources=meta.sources, tool_version=meta.tool_version,
                                 created_at=meta.created_at)
        for case in sweep_cases(self.states, self.options):
            builder.add_case(case)
        builder.write(self.path, status=status)
        return builder.document(status)


# -------------------------------------------------------------------- helpers


def client_host() -> dict[str, Any]:
    """Who measured: the client's host name, platform and Python."""
    return {"hostname": socket.gethostname(), "platform": platform.platform(),
            "python": platform.python_version(), "clock": "time.perf_counter"}


