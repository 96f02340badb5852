"""`kdabench serve-local`: run the embedded reference server in the foreground."""

from __future__ import annotations

import signal
import threading

import click

from kdabench.cli.errors import user_errors


@click.command("serve-local")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Port to bind; 0 picks a free one (the listening line says which).",
)
@click.option(
    "--device",
    type=click.Choice(["cpu", "cuda"]),
    default="cpu",
    show_default=True,
    help="cpu: the chunked fp32 torch path; cuda: kdabench's Triton kernel.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the random model's weights (its revision is seed-N).",
)
@click.option(
    "--max-tokens-per-prompt",
    type=click.IntRange(min=1),
    default=65536,
    show_default=True,
    help="Longer prompts are refused with HTTP 400.",
)
def serve_local(host: str, port: int, device: str, seed: int, max_tokens_per_prompt: int) -> None:
    """Serve a small seeded KDA model over OpenAI-compatible HTTP until SIGINT/SIGTERM.

    Endpoints: /health, /version, /v1/models, /tokenize, /v1/completions and
    /v1/chat/completions (streaming, usage, logprobs; decoding is always greedy, whatever
    the temperature), and /metrics with vLLM's prefix-cache counter names.

    \b
    Environment, read at start:
      KDABENCH_LOCAL_PREFIX_CACHE=1|0       cache recurrent states by token prefix (1)
      KDABENCH_LOCAL_CHECKPOINT_EXPORT=1|0  export every block boundary's state (1);
                                            0 caches only each prompt's final state
      KDABENCH_LOCAL_BLOCK_TOKENS=N         block size in tokens (1024)
      KDABENCH_LOCAL_CACHE_ENTRIES=N        LRU bound on cached states (256)

    It prints one 'kdabench-local: listening on http://HOST:PORT ...' line on stderr at
    start and one 'kdabench-local: request id=... ttft_ms=...' line per request.
    """
    from kdabench.serve import start_local_server  # torch import: only when serving

    with user_errors(ValueError, OSError):
        server = start_local_server(
            host, port, device, seed, max_tokens_per_prompt=max_tokens_per_prompt
        )
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.log("stopped")
