"""A real third-party OpenAI-compatible server for the serve-sweep tests: `transformers serve`
over a tiny random Llama built here, offline, with no download.

:func:`require_serving` skips the calling test module where the ``transformers[serving]``
extra is not installed. :func:`build_tiny_model` writes the model and its tokenizer into a
folder; :func:`running_server` starts `transformers serve` on a free loopback port, waits
for ``/health`` and stops the server (its whole process group) on the way out.

The tokenizer is word-level over ``w0`` .. ``w499`` (each whitespace-separated word is one
token; any other word is ``<unk>``, also one token), so a prompt's token count is its word
count. The generation config has no ``eos_token_id`` and suppresses the special tokens, so
every request generates exactly ``max_tokens`` tokens, each with text.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

SERVING_EXTRA = "transformers[serving]"
#: Modules `transformers serve` needs: transformers itself and the extra's web stack.
SERVING_MODULES = ("transformers", "fastapi", "uvicorn", "openai")
HOST = "127.0.0.1"
MAX_POSITIONS = 4096  # the model's context: prompts of this many tokens or more answer 400
WORDS = 500  # w0 .. w499
READY_TIMEOUT_S = 60.0  # about 7 s on a 2-core CPU
STOP_GRACE_S = 10.0
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|> ' + m['content'] + ' ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|> ' }}{% endif %}"
)


def require_serving() -> None:
    """Skip the calling test module unless `transformers serve` can be imported; fail
    instead where $KDABENCH_REQUIRE_SERVE=1 (CI, which installs it with the dev extra)."""
    for module in SERVING_MODULES:
        try:
            importlib.import_module(module)
        except ImportError as error:
            reason = (f"`transformers serve` needs the {SERVING_EXTRA} extra "
                      f"(pip install '{SERVING_EXTRA}'); {module} is missing: {error}")
            if os.environ.get("KDABENCH_REQUIRE_SERVE") == "1":
                pytest.fail(f"KDABENCH_REQUIRE_SERVE=1 but {reason}")
            pytest.skip(reason, allow_module_level=True)


def server_env(home: Path) -> dict[str, str]:
    """The environment a test server runs with: offline, one thread, caches under ``home``."""
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "HF_HOME": str(home), "TOKENIZERS_PARALLELISM": "false"}


def build_tiny_model(out_dir: Path, *, timeout_s: float = 120.0) -> Path:
    """Write a tiny random Llama and its word-level tokenizer into ``out_dir``; returns it.

    Built in a child Python started on this file: in-process, ``python -m pytest`` from the
    repository root has the root on sys.path, where kdabench's own ``kernels`` folder hides
    the ``kernels`` package that transformers imports."""
    out_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, __file__, str(out_dir)], cwd=out_dir,
                          env={**os.environ, **server_env(out_dir / "hf-home")},
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the tiny model failed: {done.stderr[-2000:]}")
    return out_dir


def write_tiny_model(out_dir: Path, *, seed: int = 0) -> None:
    """The model and tokenizer :func:`build_tiny_model` writes (run in a child Python)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    torch.manual_seed(seed)
    special = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
    vocab = {token: index for index, token in enumerate(special)}
    for index in range(WORDS):
        vocab[f"w{index}"] = len(vocab)
    # transformers' stop-string criteria tokenize the probe word "abcdef" to clean the
    # vocabulary; a vocabulary without it fails every request that names a stop string
    vocab["abcdef"] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins tokens with spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        unk_token="<unk>", additional_special_tokens=special[4:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = MAX_POSITIONS
    tokenizer.save_pretrained(out_dir)

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=None,  # a random model would stop at a random point: run to max_tokens
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        # special tokens decode to "" and would stream chunks with no text: forbid them
        suppress_tokens=list(range(len(special))),
    )
    model.save_pretrained(out_dir)


def transformers_cli() -> Path:
    """The `transformers` console script of this Python's environment."""
    script = Path(sys.executable).parent / "transformers"
    if not script.exists():
        raise FileNotFoundError(f"{script}: no `transformers` script next to {sys.executable}; "
                                f"reinstall '{SERVING_EXTRA}'")
    return script


def serve_argv(model: Path, port: int | str) -> list[str]:
    """The command line serving ``model`` on ``port`` of the loopback interface."""
    return [str(transformers_cli()), "serve", str(model), "--host", HOST, "--port", str(port),
            "--device", "cpu"]


def launch_command(model: Path) -> str:
    """``serve_argv`` as a `serve-sweep --launch` command, the port left as ``{port}``."""
    return shlex.join(serve_argv(model, "{port}"))


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen, log: Path, timeout_s: float) -> None:
    """Poll ``url``/health until 200; fail with the log's tail if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"`transformers serve` exited with code {process.returncode}:"
                                   f" {log_tail(log)}")
            with contextlib.suppress(httpx.HTTPError):
                if http.get(f"{url}/health").status_code == 200:
                    return
            time.sleep(0.2)
    raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s:g} s: "
                       f"{log_tail(log)}")


def log_tail(log: Path, lines: int = 8) -> str:
    """The last lines of a server log, on one line."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"


def stop(process: subprocess.Popen) -> None:
    """Stop the server's process group (it started one): SIGTERM, then SIGKILL."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_GRACE_S)


@contextlib.contextmanager
def running_server(model: Path, log: Path, *,
                   timeout_s: float = READY_TIMEOUT_S) -> Iterator[str]:
    """`transformers serve` of ``model`` on a free loopback port; yields its base URL."""
    port = free_port()
    env = {**os.environ, **server_env(log.parent / "hf-home")}
    with open(log, "wb") as sink:
        process = subprocess.Popen(serve_argv(model, port), stdout=sink,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   cwd=log.parent, start_new_session=True)
    try:
        url = f"http://{HOST}:{port}"
        wait_ready(url, process, log, timeout_s)
        yield url
    finally:
        stop(process)


if __name__ == "__main__":
    write_tiny_model(Path(sys.argv[1]))
