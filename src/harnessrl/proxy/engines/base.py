"""The engine protocol: what the proxy needs from anything that samples tokens."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from harnessrl.types import ChatRequest, EngineEvent, Turn


class TurnSource(Protocol):
    """Where an engine finds a rollout's recorded turns (the trace store)."""

    def turns(self, key: str, offset: int = 0, limit: int = -1) -> list[Turn]: ...


class Engine(Protocol):
    """Samples a completion for a canonical request.

    Both calls produce the same events (`Started`, `Chunk`s, `Finished`); `complete`
    returns them at once for clients that do not stream, so the engine can make a single
    non-streamed upstream call. `rollout` is the key of the rollout the call belongs to
    (None outside one), for engines that keep per-rollout state (token mode's reusable
    prompt ids); `bind_store` and `forget_rollout` are no-ops for the others.
    """

    name: str
    weight_version: str | None

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def bind_store(self, store: TurnSource) -> None:
        """Where a rollout's earlier turns are found after a restart."""
        ...

    def forget_rollout(self, key: str) -> None:
        """The rollout is closed: any state kept for it can go."""
        ...

    async def models(self) -> list[str]: ...

    async def count_tokens(self, request: ChatRequest) -> int:
        """Tokens in the prompt the engine would render for `request`."""
        ...

    async def complete(self, request: ChatRequest, rollout: str | None = None
                       ) -> list[EngineEvent]: ...

    def stream(self, request: ChatRequest, rollout: str | None = None
               ) -> AsyncGenerator[EngineEvent, None]: ...


class Stateless:
    """`bind_store` and `forget_rollout` for engines that keep nothing per rollout."""

    def bind_store(self, store: TurnSource) -> None:
        return None

    def forget_rollout(self, key: str) -> None:
        return None
