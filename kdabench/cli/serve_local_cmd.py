"""`kdabench serve-local`: run the embedded reference server in the foreground."""

from __future__ import annotations

import signal
import threading

import click

from kdabench.cli.errors import user_errors

# kdabench.serve.model.PRESETS' names, listed here so that --help imports no torch
PRESET_NAMES = ("tiny", "kimi-linear-tp1", "kimi-linear-tp2", "kimi-linear-tp4", "kimi-linear-tp8")


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
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="auto: cuda where a GPU is visible, else cpu. cpu: the chunked fp32 torch path; "
    "cuda: kdabench's Triton kernel.",
)
@click.option(
    "--model",
    "preset",
    type=click.Choice(PRESET_NAMES),
    default=None,
    help="Model preset: tiny (2 layers, 2 heads of 64), or kimi-linear-tpN, the 20 KDA layers "
    "of Kimi Linear 48B as one GPU of N-way tensor parallelism holds them (32/N heads of 128, "
    "d_model 2304, bf16). Default: kimi-linear-tp4 on cuda, tiny on cpu. A preset that does "
    "not fit the device's free memory is refused before loading.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the random model's weights (its revision is PRESET-seed-N).",
)
@click.option(
    "--max-tokens-per-prompt",
    type=click.IntRange(min=1),
    default=131072,
    show_default=True,
    help="Longer prompts are refused with HTTP 400.",
)
def serve_local(host: str, port: int, device: str, preset: str | None, seed: int,
                max_tokens_per_prompt: int) -> None:
    """Serve a seeded random KDA model over OpenAI-compatible HTTP until SIGINT/SIGTERM.

    Endpoints: /health, /version (device, backend, model preset and geometry, retention
    settings), /v1/models, /tokenize, /v1/completions and /v1/chat/completions (streaming,
    usage, logprobs; decoding is always greedy, whatever the temperature), and /metrics with
    vLLM's prefix-cache names and the state cache's occupancy and evictions.

    Prefill runs in calls of at most KDABENCH_LOCAL_MAX_BATCHED_TOKENS tokens (chunked, as a
    serving engine's --max-num-batched-tokens); with checkpoint export each call retains up
    to 4 block-boundary states, evenly spread, and always the last block boundary before the
    prompt's end; without it only each prompt's final state is cached.

    \b
    Environment, read at start:
      KDABENCH_LOCAL_PREFIX_CACHE=1|0        cache recurrent states by token prefix (1)
      KDABENCH_LOCAL_CHECKPOINT_EXPORT=1|0   retain block-boundary states (1);
                                             0 caches only each prompt's final state
      KDABENCH_LOCAL_BLOCK_TOKENS=N          block size in tokens (1024)
      KDABENCH_LOCAL_MAX_BATCHED_TOKENS=N    tokens per prefill call (8192)
      KDABENCH_LOCAL_CACHE_GIB=X             state cache size on the device, LRU (4)
      KDABENCH_LOCAL_CUDA_GRAPHS=1|0         replay each prefill call as a CUDA graph per
                                             token bucket (on for the kernel on CUDA;
                                             1 elsewhere is an error)

    It prints one 'kdabench-local: listening on http://HOST:PORT ...' line on stderr at
    start and one 'kdabench-local: request id=... ttft_ms=...' line per request.
    """
    from kdabench.serve import start_local_server  # torch import: only when serving

    with user_errors(ValueError, OSError):
        server = start_local_server(
            host, port, device, seed, model=preset, max_tokens_per_prompt=max_tokens_per_prompt
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
