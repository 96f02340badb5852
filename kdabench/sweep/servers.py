"""The server behind each arm: launched, attached to, or embedded.

Every handle has ``url``, ``log_text()`` (the server's log so far, or None when the
sweep cannot see it), ``alive()``, ``failure()`` (why it is not alive) and ``stop()``.

- :class:`LaunchedServer` starts ``--launch CMD`` in a new process group with the arm's
  environment and arguments, logs its stdout and stderr to a file, waits for ``/health``,
  and stops only that process group: SIGTERM, then SIGKILL after a grace period.
- :class:`AttachedServer` is a server somebody else runs; its log is the arm's ``log``
  file when the arms file names one. :func:`check_reachable` refuses, as bad input and
  without sending anything, an endpoint where nothing accepts a connection.
- :class:`EmbeddedServer` is kdabench's reference server (``kdabench.serve``), started
  in this process with the arm's environment over this process's (as a launched server's
  is), on the GPU where CUDA is present (else the CPU), taking prompts of up to
  :data:`EMBEDDED_MAX_MODEL_LEN` tokens.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from kdabench.sweep.options import SweepError

STOP_GRACE_S = 10.0
HEALTH_POLL_S = 0.2
#: The longest prompt the embedded server is started to take: room for the 65,536-token prompts
#: (and shared-prefix case) of a GPU sweep with their answers.
EMBEDDED_MAX_MODEL_LEN = 131072
CONNECT_TIMEOUT_S = 3.0  # how long check_reachable waits for a connection to open


class ServerStartError(RuntimeError):
    """A server did not come up healthy; the message says why (with its log's tail)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def check_reachable(url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """SweepError when nothing accepts a TCP connection at ``url`` (refused, unknown host,
    no route). Nothing is sent; a connection slow to open is left to the health wait."""
    parsed = httpx.URL(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.host, port), timeout=timeout_s):
            return
    except ConnectionRefusedError:
        reason = "connection refused: nothing listens there"
    except socket.gaierror as error:
        reason = f"unknown host ({error.strerror})"
    except TimeoutError:
        return
    except OSError as error:
        reason = error.strerror or str(error)
    raise SweepError(f"{url}: {reason}; start the server first, or give --launch CMD to let "
                     "kdabench start one")


def wait_healthy(url: str, timeout_s: float, *, alive=None, describe=None) -> None:
    """Poll ``url``/health until it answers 200; ServerStartError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as http:
        while True:
            if alive is not None and not alive():
                raise ServerStartError(describe() if describe else f"{url}: the server exited")
            try:
                if http.get(f"{url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                extra = f"; {describe()}" if describe else ""
                raise ServerStartError(f"{url}/health did not answer 200 within "
                                       f"{timeout_s:g} s{extra}")
            time.sleep(HEALTH_POLL_S)


def _tail(text: str | None, lines: int = 5) -> str:
    if not text:
        return "(empty log)"
    return " | ".join(text.strip().splitlines()[-lines:])


class LaunchedServer:
    """A server process started by the sweep (see the module docstring).

    ``command`` is the --launch command line; ``{port}`` in it or in ``args`` is replaced
    by a free port, and ``--port PORT`` is appended when neither holds ``{port}``.
    """

    def __init__(self, command: str, args: Sequence[str], env: Mapping[str, str],
                 log_path: Path, *, host: str = "127.0.0.1") -> None:
        self.port = free_port(host)
        words = shlex.split(command) + list(args)
        if not any("{port}" in word for word in words):
            words += ["--port", "{port}"]
        self.argv = [word.replace("{port}", str(self.port)) for word in words]
        self.url = f"http://{host}:{self.port}"
        self.log_path = log_path
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._env = {**os.environ, **env}
        self._process: subprocess.Popen | None = None

    def start(self, health_timeout_s: float) -> None:
        with open(self.log_path, "wb") as log:
            try:
                self._process = subprocess.Popen(
                    self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=self._env, start_new_session=True,
                )
            except OSError as error:
                raise ServerStartError(f"cannot start {self.argv[0]!r}: {error}") from error
        wait_healthy(self.url, health_timeout_s, alive=self.alive, describe=self.failure)

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def failure(self) -> str:
        code = None if self._process is None else self._process.poll()
        state = "is running" if code is None else f"exited with code {code}"
        return f"the server {state}; log {self.log_path}: {_tail(self.log_text())}"

    def log_text(self) -> str | None:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def stop(self) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        group = process.pid  # start_new_session: the group we made, and only it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
            process.wait(timeout=STOP_GRACE_S)

    def describe(self) -> dict[str, Any]:
        return {"mode": "launch", "argv": self.argv, "url": self.url, "port": self.port,
                "pid": None if self._process is None else self._process.pid,
                "log": str(self.log_path)}


class AttachedServer:
    """A running server at ``url``; ``log_path`` (optional) is where it logs."""

    def __init__(self, url: str, log_path: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.log_path = None if log_path is None else Path(log_path)

    def start(self, health_timeout_s: float) -> None:
        wait_healthy(self.url, health_timeout_s)

    def alive(self) -> bool:
        return True  # not ours to watch: a dead server shows as failed requests

    def failure(self) -> str:
        return f"the server at {self.url} stopped answering"

    def log_text(self) -> str | None:
        if self.log_path is None:
            return None
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        pass  # never stop what the sweep did not start

    def describe(self) -> dict[str, Any]:
        return {"mode": "attach", "url": self.url,
                "log": None if self.log_path is None else str(self.log_path)}


class EmbeddedServer:
    """kdabench's reference server in this process, with the arm's flags over this process's
    environment as its env (a KDABENCH_LOCAL_* setting the arms leave alone is inherited)."""

    def __init__(self, env: Mapping[str, str], *, seed: int = 0, device: str = "auto",
                 model: str | None = None) -> None:
        self._env = {**os.environ, **env}
        self._seed = seed
        self._device = device
        self._model = model
        self._server: Any = None
        self._log = io.StringIO()
        self._captures_log = False
        self.url = ""

    def start(self, health_timeout_s: float) -> None:
        try:
            from kdabench.serve import start_local_server
        except ImportError as error:
            raise ServerStartError(
                f"the embedded reference server is not available ({error}); give "
                "--endpoint URL or --launch CMD") from error
        kwargs: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "device": self._device,
                                  "seed": self._seed, "env": self._env, "model": self._model,
                                  "max_tokens_per_prompt": EMBEDDED_MAX_MODEL_LEN}
        self._captures_log = _accepts(start_local_server, "log")
        if self._captures_log:
            kwargs["log"] = self._log
        try:
            self._server = start_local_server(**kwargs)
        except (ValueError, OSError) as error:
            raise ServerStartError(f"the embedded server did not start: {error}") from error
        self.url = str(self._server.url).rstrip("/")
        wait_healthy(self.url, health_timeout_s)

    def alive(self) -> bool:
        alive = getattr(self._server, "alive", None)
        if callable(alive):
            return bool(alive())
        return self._server is not None

    def failure(self) -> str:
        return f"the embedded server at {self.url} stopped answering"

    def log_text(self) -> str | None:
        return self._log.getvalue() if self._captures_log else None

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    def describe(self) -> dict[str, Any]:
        server = self._server
        return {"mode": "embedded", "url": self.url,
                "device": self._device if server is None else server.device,
                "model": self._model if server is None else server.model.config.preset,
                "seed": self._seed, "python": sys.version.split()[0]}


def _accepts(function: Any, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
