"""The server's counters and state-cache gauges, as Prometheus text for ``/metrics``, under
vLLM's names where vLLM has one (its production-metrics docs: the prefix cache's queries and
hits in tokens, ``vllm:kv_cache_usage_perc`` as a fraction of the cache in use) and
``kdabench_local:`` names for what vLLM does not report (bytes and entries held, evictions)."""

from __future__ import annotations

import threading
from typing import ClassVar

from .model import MODEL_ID
from .prefix_cache import PrefixCache


class Metrics:
    """Counters for /metrics (vLLM's names), thread-safe; gauges read from the cache."""

    COUNTERS: ClassVar[dict[str, str]] = {
        "vllm:prefix_cache_queries_total": "Prefix-cache queries, in prompt tokens.",
        "vllm:prefix_cache_hits_total": "Prefix-cache hits, in cached prompt tokens.",
        "vllm:prompt_tokens_total": "Prompt tokens processed.",
        "vllm:generation_tokens_total": "Tokens generated.",
        "vllm:request_success_total": "Requests finished.",
        "vllm:spec_decode_num_drafts_total": "Speculative drafts (none: no speculative decoding).",
        "vllm:spec_decode_num_draft_tokens_total": "Speculative draft tokens (none).",
        "vllm:spec_decode_num_accepted_tokens_total": "Accepted draft tokens (none).",
        "kdabench_local:computed_prompt_tokens_total": "Prompt tokens run through prefill.",
        "kdabench_local:checkpoints_exported_total": "Block-boundary states retained in the cache.",
        "kdabench_local:state_cache_evictions_total": "States evicted from the cache (LRU).",
    }
    GAUGES: ClassVar[dict[str, str]] = {
        "vllm:kv_cache_usage_perc": "State-cache usage: the fraction of its slots in use.",
        "kdabench_local:state_cache_used_bytes": "Bytes of the state cache holding states.",
        "kdabench_local:state_cache_capacity_bytes": "Bytes of the state cache in all.",
        "kdabench_local:state_cache_entries": "Recurrent states in the cache.",
    }
    _KEYS: ClassVar[dict[str, str]] = {
        "queries": "vllm:prefix_cache_queries_total",
        "hits": "vllm:prefix_cache_hits_total",
        "prompt": "vllm:prompt_tokens_total",
        "generation": "vllm:generation_tokens_total",
        "success": "vllm:request_success_total",
        "computed": "kdabench_local:computed_prompt_tokens_total",
        "exported": "kdabench_local:checkpoints_exported_total",
    }

    def __init__(self, cache: PrefixCache | None = None) -> None:
        self._values = dict.fromkeys(self.COUNTERS, 0)
        self._cache = cache
        self._lock = threading.Lock()

    def add(self, **increments: int) -> None:
        with self._lock:
            for key, value in increments.items():
                self._values[self._KEYS[key]] += value

    def _current(self) -> tuple[dict[str, float], dict[str, float]]:
        with self._lock:
            counters = {name: float(value) for name, value in self._values.items()}
        gauges = dict.fromkeys(self.GAUGES, 0.0)
        if self._cache is not None:
            stats = self._cache.stats()
            counters["kdabench_local:state_cache_evictions_total"] = float(stats.evictions)
            gauges.update({
                "vllm:kv_cache_usage_perc": stats.usage,
                "kdabench_local:state_cache_used_bytes": float(stats.used_bytes),
                "kdabench_local:state_cache_capacity_bytes": float(stats.capacity_bytes),
                "kdabench_local:state_cache_entries": float(stats.entries),
            })
        return counters, gauges

    def render(self) -> str:
        counters, gauges = self._current()
        lines = []
        for kind, helps, values in (("counter", self.COUNTERS, counters),
                                    ("gauge", self.GAUGES, gauges)):
            for name, help_text in helps.items():
                lines += [
                    f"# HELP {name} {help_text}",
                    f"# TYPE {name} {kind}",
                    f'{name}{{model_name="{MODEL_ID}"}} {values[name]}',
                ]
        return "\n".join(lines) + "\n"
