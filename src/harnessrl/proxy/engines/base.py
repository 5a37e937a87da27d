"""The engine protocol: what the proxy needs from anything that samples tokens."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from harnessrl.types import ChatRequest, EngineEvent


class Engine(Protocol):
    """Samples a completion for a canonical request.

    Both methods produce the same events (`Started`, `Chunk`s, `Finished`); `complete`
    returns them at once for clients that do not stream, so the engine can make a single
    non-streamed upstream call.
    """

    name: str
    weight_version: str | None

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def models(self) -> list[str]: ...

    async def count_tokens(self, request: ChatRequest) -> int:
        """Tokens in the prompt the engine would render for `request`."""
        ...

    async def complete(self, request: ChatRequest) -> list[EngineEvent]: ...

    def stream(self, request: ChatRequest) -> AsyncGenerator[EngineEvent, None]: ...
