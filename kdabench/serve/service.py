"""What the HTTP handler needs of the server it answers for, as a Protocol.

:class:`~kdabench.serve.server.LocalServer` meets it; the handler depends on this, not on the
server module (which builds the handler), so the two do not import each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .engine import GeneratedToken, PromptPrefill
    from .metrics import Metrics
    from .protocol import GenerationRequest


class RequestServer(Protocol):
    """The model, cache and counters behind the routes."""

    max_prompt_tokens: int
    metrics: Metrics

    def log(self, line: str) -> None:
        """Write one log line."""

    def models(self) -> dict[str, Any]:
        """The /v1/models answer."""

    def version(self) -> dict[str, Any]:
        """The /version answer."""

    def tokenize(self, body: Any) -> dict[str, Any]:
        """The /tokenize answer for a request body."""

    def generate(
        self, request: GenerationRequest, started: float, before_prefill: Any = None
    ) -> Iterator[tuple[str, PromptPrefill, GeneratedToken]]:
        """Prefill, then yield (request id, the prompt's prefill, token) per greedy token."""
