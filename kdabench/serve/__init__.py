"""The embedded reference server (`kdabench serve-local`): a small seeded KDA model over HTTP.

    from kdabench.serve import start_local_server

    with start_local_server(port=0, env={"KDABENCH_LOCAL_CHECKPOINT_EXPORT": "0"}) as server:
        httpx.get(f"{server.url}/health")

`model` holds the weights, `engine` prefill (kernel / chunk path / mirror) and decode,
`prefix_cache` the cache and its KDABENCH_LOCAL_* settings, `protocol` the OpenAI-compatible
request parsing and response bodies, `metrics` the /metrics counters, `handler` the HTTP
routes and streams, and `server` the server itself (model, lock, log, thread) with its
endpoints documented.
"""

from .engine import Engine, PromptPrefill, plan_prefill_calls
from .model import MODEL_ID, KdaModel, ModelConfig
from .prefix_cache import CacheSettings, PrefixCache, SettingsError
from .protocol import SERVER_NAME
from .server import LocalServer, start_local_server

__all__ = [
    "MODEL_ID",
    "SERVER_NAME",
    "CacheSettings",
    "Engine",
    "KdaModel",
    "LocalServer",
    "ModelConfig",
    "PrefixCache",
    "PromptPrefill",
    "SettingsError",
    "plan_prefill_calls",
    "start_local_server",
]
