"""The embedded reference server (`kdabench serve-local`): a seeded KDA model over HTTP.

    from kdabench.serve import start_local_server

    with start_local_server(port=0, env={"KDABENCH_LOCAL_CHECKPOINT_EXPORT": "0"}) as server:
        httpx.get(f"{server.url}/health")

`model` holds the weights and the presets (tiny; Kimi Linear's KDA layers per tensor-parallel
GPU), `engine` chunked prefill (kernel / chunk path / mirror) and decode, `retention` which
states a prefill keeps, `prefix_cache` the device state cache, `settings` the KDABENCH_LOCAL_*
settings, `runtime` the device, fit check and what /version reports, `protocol` the
OpenAI-compatible request parsing and response bodies, `metrics` /metrics, `handler` the HTTP
routes and streams, and `server` the server itself (model, lock, log, thread).
"""

from .engine import Engine, PromptPrefill
from .model import MODEL_ID, PRESETS, KdaModel, ModelConfig, preset_config
from .prefix_cache import PrefixCache
from .protocol import SERVER_NAME
from .retention import PrefillCall, plan_prefill_calls
from .runtime import FitError, build_runtime
from .server import LocalServer, start_local_server
from .settings import CacheSettings, SettingsError

__all__ = [
    "MODEL_ID",
    "PRESETS",
    "SERVER_NAME",
    "CacheSettings",
    "Engine",
    "FitError",
    "KdaModel",
    "LocalServer",
    "ModelConfig",
    "PrefillCall",
    "PrefixCache",
    "PromptPrefill",
    "SettingsError",
    "build_runtime",
    "plan_prefill_calls",
    "preset_config",
    "start_local_server",
]
