"""The server's counters, rendered as Prometheus text for ``/metrics`` under vLLM's names."""

from __future__ import annotations

import threading
from typing import ClassVar

from .model import MODEL_ID


class Metrics:
    """Counters for /metrics (vLLM's names), thread-safe."""

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
        "kdabench_local:checkpoints_exported_total": "Block-boundary states exported to the cache.",
    }

    def __init__(self) -> None:
        self._values = dict.fromkeys(self.COUNTERS, 0)
        self._lock = threading.Lock()

    def add(self, **increments: int) -> None:
        names = {
            "queries": "vllm:prefix_cache_queries_total",
            "hits": "vllm:prefix_cache_hits_total",
            "prompt": "vllm:prompt_tokens_total",
            "generation": "vllm:generation_tokens_total",
            "success": "vllm:request_success_total",
            "computed": "kdabench_local:computed_prompt_tokens_total",
            "exported": "kdabench_local:checkpoints_exported_total",
        }
        with self._lock:
            for key, value in increments.items():
                self._values[names[key]] += value

    def render(self) -> str:
        with self._lock:
            values = dict(self._values)
        lines = []
        for name, help_text in self.COUNTERS.items():
            lines += [
                f"# HELP {name} {help_text}",
                f"# TYPE {name} counter",
                f'{name}{{model_name="{MODEL_ID}"}} {float(values[name])}',
            ]
        return "\n".join(lines) + "\n"
