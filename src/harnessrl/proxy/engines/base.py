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

    @property
    def weight_version(self) -> str | None:
        """The weights this engine samples with (recorded on every turn)."""
        ...

    @weight_version.setter
    def weight_version(self, version: str | None) -> None:
        """Set once every server behind the engine serves `version` (a router sets each
        of its engines'): the one way a weight sync names the version, on any engine."""
        ...

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
