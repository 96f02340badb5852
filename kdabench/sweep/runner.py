"""The sweep: every arm's server up at once, measured in interleaved rounds, one receipt;
or, with the blocks schedule, one server at a time.

Order of work, interleaved (docs/DESIGN.md §10)::

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
    shared prefix: per case, `warmups` uncounted pairs, then the repeats: P1 (unique) then
             P2 = P1's shared head + another continuation
    decode:  output tokens/s over a fixed window, normalised by the speculative
             acceptance length read from /metrics
    per arm: activation patterns again, and `activation_after` over the log written
             while measuring

The blocks schedule is for deployments that hold one server at a time: the arms run in
blocks, passes over the arms alternating direction (A B B A, then again as asked), each
block with a server of its own: start it, wait for /health, read its info, activation
patterns, warmups, ``samples`` cold samples per prompt size, then (the arm's last block)
probes, shared prefix, decode and activation after over that block's log, stop it. Every
sample records its block; the receipt lists the blocks (server, start and stop times) and
a ``block-drift`` case per arm and size compares the blocks' medians.

Attached servers are checked before anything is sent: an endpoint where nothing listens,
or arms that differ in server settings sharing one, are bad input (SweepError). Arms that
share an attached server wait for its /health once.

Prompt token counts come from :func:`~kdabench.sweep.tokens.choose_counter`: the user's
tokenizer, the server's /tokenize, or calibration on the server's usage; the receipt
records the source per arm (``config.servers.<arm>.token_counts``).

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
from kdabench.sweep.cases import block_cases, case_ok, live_rows, sweep_cases
from kdabench.sweep.client import ServerClient, ServerError, ServerGone
from kdabench.sweep.contrasts import Contrast, contrasts
from kdabench.sweep.limits import check_attached_arms, check_context, endpoint_groups
from kdabench.sweep.options import SweepError, SweepOptions
from kdabench.sweep.prompts import PromptError, PromptFactory
from kdabench.sweep.servers import (
    EMBEDDED_MAX_MODEL_LEN,
    AttachedServer,
    EmbeddedServer,
    LaunchedServer,
    ServerStartError,
    check_reachable,
)
from kdabench.sweep.state import ArmState
from kdabench.sweep.tokens import TokenCounter, choose_counter, load_tokenizer

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

    def contrasts(self) -> list[Contrast]:
        """Every arm against the sweep's baseline arm (none without a baseline)."""
        options = self.receipt["config"]["options"]
        if options.get("baseline") is None:
            return []
        return contrasts(self.cases, options["baseline"], seed=options.get("seed", 0))

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "status": self.receipt["status"],
                "receipt": str(self.receipt_path), "sha256": self.receipt["sha256"],
                "summary": self.receipt["summary"], "failures": self.failures,
                "contrasts": [row.to_dict() for row in self.contrasts()],
                "cases": self.receipt["cases"]}


class Sweep:
    """One serve-sweep run. Build it (which validates), then :meth:`run` it."""

    def __init__(self, arms: ArmsFile, options: SweepOptions, *, mode: str = "embedded",
                 launch: str | None = None, endpoint: str | None = None,
                 out_dir: str | Path | None = None, api_key: str | None = None,
                 api_key_env: str | None = None, command_line: list[str] | None = None,
                 device: Any = None, tokenizer: str | None = None,
                 model: str | None = None) -> None:
        if mode not in MODES:
            raise SweepError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        if mode == "launch" and not launch:
            raise SweepError("launch mode needs a command (--launch CMD)")
        if mode == "attach" and not endpoint and not all(a.endpoint for a in arms.arms):
            raise SweepError("attach mode needs --endpoint URL or an endpoint for every arm")
        options.validate()
        options.check_arms([arm.name for arm in arms.arms])
        if model is not None and mode == "attach":
            raise SweepError(f"--model {model}: an attached server runs the model it was "
                             "started with; --model applies to the embedded server or --launch")
        if options.blocks_schedule and mode == "attach":
            raise SweepError("--schedule blocks starts a server for every block: give "
                             "--launch CMD, or neither --launch nor --endpoint for the embedded "
                             "server")
        if mode == "embedded":
            check_context(options, EMBEDDED_MAX_MODEL_LEN, "the embedded server")
        if mode == "attach":
            for url in endpoint_groups(arms, endpoint):
                check_reachable(url)
            check_attached_arms(arms, endpoint)
        self._tokenizer = None if tokenizer is None else load_tokenizer(tokenizer)
        self.arms = arms
        self.options = options
        self.mode = mode
        self.launch = launch
        self.endpoint = endpoint
        self.model = model
        self._api_key = api_key
        config = {
            "arms": arms.to_receipt(),
            "options": {k: (list(v) if isinstance(v, tuple) else v)
                        for k, v in dataclasses.asdict(options).items()},
            "rounds": options.round_count,
            "schedule": options.schedule,
            "mode": mode,
            "launch": launch,
            "endpoint": endpoint,
            "api_key": {"env": api_key_env, "sent": bool(api_key)},
            "client_host": client_host(),
            "ttft_definition": TTFT_DEFINITION,
            "model": model,
            "shared_prefix_skipped": options.shared_prefix_skipped(),
            "servers": {},
        }
        if device is None:
            from kdabench.environment import device_identity

            device = device_identity(None if mode == "embedded" else "cpu")
        self._builder = new_receipt("serve-sweep", config=config, command_line=command_line,
                                    device=device)
        self.path = receipt_dir(out_dir) / self._builder.filename()
        self.log_dir = self.path.with_suffix("").with_name(self.path.stem + "-logs")
        self.states = [ArmState(arm=arm, server=None) for arm in arms.arms]
        self.blocks: list[dict[str, Any]] = []  # blocks schedule: one record per block
        self._counters: dict[str, TokenCounter] = {}
        self.on_event: Callable[[str], None] = lambda message: None
        self.on_update: Callable[[], None] = lambda: None

    # ---------------------------------------------------------------- the run

    def run(self) -> SweepResult:
        """Run the sweep; returns the result with the final receipt (written). Raises
        SweepError, before any receipt is written, when a server's max_model_len is too
        short for the sweep's requests (the blocks schedule: the first block's server)."""
        try:
            if self.options.blocks_schedule:
                self._run_blocks()
            else:
                self._run_interleaved()
        except KeyboardInterrupt:
            self._snapshot("partial")
            raise
        finally:
            self._stop_servers()
        failures = [s.failure for s in self.states if s.failure]
        complete = not failures
        receipt = self._snapshot("complete" if complete else "partial")
        ok = complete and all(case_ok(case) for case in receipt["cases"])
        return SweepResult(receipt=receipt, receipt_path=self.path, ok=ok, complete=complete,
                           failures=failures)

    def _run_interleaved(self) -> None:
        """Every arm's server up at once, samples in rounds A B ..., then ... B A."""
        self._start_servers()
        for state in self._active():
            self._phase(state, "server info", phases.server_info)
        self._check_context(self._active())
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
        for warmup in range(self.options.warmups):
            for state in self._order(warmup):
                self._phase(state, "shared-prefix warmup",
                            lambda s: phases.shared_prefix(s, self.options, warmup=True))
        for repeat in range(self.options.shared_prefix_repeats):
            for state in self._order(repeat):
                self._phase(state, "shared prefix",
                            lambda s: phases.shared_prefix(s, self.options))
        for state in self._active():
            self._phase(state, "decode", lambda s: phases.decode(s, self.options))
        for state in self._active():
            self._phase(state, "activation after timing", phases.activation_after)

    def _run_blocks(self) -> None:
        """One server at a time: each arm's blocks in the order of :func:`block_order`."""
        plan = [state.arm.name for state in block_order(self.states, self.options.blocks)]
        by_name = {state.arm.name: state for state in self.states}
        for index, name in enumerate(plan):
            if by_name[name].active:
                self._block(index, by_name[name], last=name not in plan[index + 1:])

    def _block(self, index: int, state: ArmState, *, last: bool) -> None:
        """One block: the arm's own server started, measured and stopped; recorded."""
        block: dict[str, Any] = {"block": index, "arm": state.arm.name,
                                 "started_at": time.time()}
        self.blocks.append(block)
        self._start_server(state, f"{state.arm.name}-block{index}")
        if state.active:
            block["server"] = state.server.describe()
            block["healthy_at"] = time.time()
            self._block_phases(index, state, last=last)
        self._stop_server(state)
        block["stopped_at"] = time.time()
        self._snapshot("partial")

    def _block_phases(self, index: int, state: ArmState, *, last: bool) -> None:
        """A block's steps; the arm's last block also probes, shares a prefix and decodes,
        so that the log its activation_after patterns are checked over shows them."""
        self._phase(state, "server info", phases.server_info)
        self._check_block_context(index, state)
        self._phase(state, "activation before timing", _activation_before)
        self._phase(state, "warmups", lambda s: phases.warmups(s, self.options))
        for round_index in range(self.options.samples):
            for size in self.options.prompt_tokens:
                self._phase(state, f"block {index + 1} {size}-token sample",
                            lambda s, r=round_index, n=size: self._block_sample(s, n, r, index))
        if last:
            self._phase(state, "probes", lambda s: phases.probes(s, self.options))
            for _ in range(self.options.warmups):
                self._phase(state, "shared-prefix warmup",
                            lambda s: phases.shared_prefix(s, self.options, warmup=True))
            for _ in range(self.options.shared_prefix_repeats):
                self._phase(state, "shared prefix",
                            lambda s: phases.shared_prefix(s, self.options))
            self._phase(state, "decode", lambda s: phases.decode(s, self.options))
            self._phase(state, "activation after timing", phases.activation_after)

    def _check_block_context(self, index: int, state: ArmState) -> None:
        """The first block's server too short for the sweep is bad input (nothing is written
        yet); a later block's ends its arm."""
        try:
            self._check_context([state])
        except SweepError as error:
            if index == 0:
                raise
            state.failure = {"arm": state.arm.name, "phase": "server info",
                             "message": str(error), "kind": type(error).__name__}
            self.on_event(f"{state.arm.name}: FAILED during server info: {error}")

    def _check_context(self, states: list[ArmState]) -> None:
        """SweepError when a request would not fit the max_model_len a server reported."""
        for state in states:
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
        self._report_discarded(state, size, phases.cold_sample(state, size, round_index,
                                                               position))

    def _block_sample(self, state: ArmState, size: int, round_index: int, block: int) -> None:
        record = phases.cold_sample(state, size, round_index, 0)
        record.update(block=block, arm=state.arm.name)
        self._report_discarded(state, size, record)

    def _report_discarded(self, state: ArmState, size: int, record: dict[str, Any]) -> None:
        if record["cached_reasons"]:
            self.on_event(f"{state.arm.name}: {size}-token sample discarded: "
                          f"{'; '.join(record['cached_reasons'])}")

    # ---------------------------------------------------------------- servers

    def _start_servers(self) -> None:
        if self.mode == "attach":
            self._attach_servers()
            return
        for state in self.states:
            self._start_server(state, state.arm.name)

    def _start_server(self, state: ArmState, log_name: str) -> None:
        """Start the arm's own server (launched or embedded) and connect to it."""
        arm = state.arm
        env = self.arms.arm_env(arm)
        if self.mode == "launch":
            model_args = [] if self.model is None else ["--model", self.model]
            state.server = LaunchedServer(self.launch or "", self.arms.arm_args(arm) + model_args,
                                          env, self.log_dir / f"{log_name}.log")
        else:
            state.server = EmbeddedServer(env, seed=self.options.seed, model=self.model)
        self.on_event(f"{arm.name}: starting the server ({self.mode})")
        self._start_group([state])

    def _attach_servers(self) -> None:
        """One /health wait per attached server, shared by its arms: one timeout, one
        message."""
        by_name = {state.arm.name: state for state in self.states}
        for url, arms in endpoint_groups(self.arms, self.endpoint).items():
            group = [by_name[arm.name] for arm in arms]
            for state in group:
                state.server = AttachedServer(url, state.arm.log)
            self.on_event(f"{_names(group)}: attaching to {url}")
            self._start_group(group)

    def _start_group(self, group: list[ArmState]) -> None:
        """Start the server the arms of ``group`` share, then connect each arm to it."""
        try:
            group[0].server.start(self.options.health_timeout_s)
            for state in group:
                self._connect(state)
        except (ServerStartError, ServerError) as error:
            for state in group:
                state.failure = {"arm": state.arm.name, "phase": "server start",
                                 "message": str(error), "kind": type(error).__name__}
            self.on_event(f"{_names(group)}: FAILED to start: {error}")

    def _connect(self, state: ArmState) -> None:
        """The arm's client, its token counter and its prompt factory."""
        state.client = ServerClient(state.server.url, api_key=self._api_key,
                                    request_timeout_s=self.options.request_timeout_s,
                                    api=self.options.api)
        counter = choose_counter(state.client, self._tokenizer, seed=self.options.seed)
        self._counters[state.arm.name] = counter
        state.prompts = PromptFactory(counter, seed=self.options.seed)

    def _stop_servers(self) -> None:
        for state in self.states:
            self._stop_server(state)

    def _stop_server(self, state: ArmState) -> None:
        """Close the arm's client and stop its server (an attached one is left running)."""
        if state.client is not None:
            state.client.close()
            state.client = None
        if state.server is not None:
            try:
                state.server.stop()
            except Exception as error:  # noqa: BLE001 - stopping must not hide results
                self.on_event(f"{state.arm.name}: could not stop the server: {error}")
            state.server = None

    # ---------------------------------------------------------------- cases and receipt

    def live_rows(self) -> list[dict[str, Any]]:
        """Rows of the live table: one per arm and prompt size."""
        return live_rows(self.states, self.options)

    def _snapshot(self, status: str) -> dict[str, Any]:
        meta = self._builder
        config = dict(meta.config)
        config["servers"] = {s.arm.name: self._server_record(s) for s in self.states if s.info}
        if self.options.blocks_schedule:
            config["blocks"] = self.blocks
        builder = ReceiptBuilder(meta.kind, config=config, command_line=meta.command_line,
                                 device=meta.device, toolchain=meta.toolchain, git=meta.git,
                                 sources=meta.sources, tool_version=meta.tool_version,
                                 created_at=meta.created_at)
        cases = sweep_cases(self.states, self.options)
        if self.options.blocks_schedule:
            cases += block_cases(self.states, self.options)
        for case in cases:
            builder.add_case(case)
        builder.write(self.path, status=status)
        return builder.document(status)

    def _server_record(self, state: ArmState) -> dict[str, Any]:
        """What the receipt keeps of an arm's server: its info and its token counts' source."""
        counter = self._counters.get(state.arm.name)
        return {**state.info, **({} if counter is None else {"token_counts": counter.describe()})}


# -------------------------------------------------------------------- helpers


def block_order(states: list[ArmState], blocks: int) -> list[ArmState]:
    """Each arm ``blocks`` times, in passes over the arms that alternate direction:
    A B B A for two arms and two blocks, A B B A A B for three blocks."""
    return [state for turn in range(blocks)
            for state in (states if turn % 2 == 0 else states[::-1])]


def _activation_before(state: ArmState) -> None:
    """The activation patterns over this block's server log; an earlier block's failure
    stays the arm's."""
    earlier = state.activation_before
    phases.activation_before(state)
    if earlier is not None and earlier["status"] == "failed":
        state.activation_before = earlier


def _names(group: list[ArmState]) -> str:
    return ", ".join(state.arm.name for state in group)


def client_host() -> dict[str, Any]:
    """Who measured: the client's host name, platform and Python."""
    return {"hostname": socket.gethostname(), "platform": platform.platform(),
            "python": platform.python_version(), "clock": "time.perf_counter"}


