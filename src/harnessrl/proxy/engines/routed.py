"""Several engines behind one proxy shard: each rollout goes to one engine chosen by a
stable hash of its key (rendezvous hashing, so a rollout's calls meet the same prefix
cache and removing an engine moves only the rollouts that were on it), engines are
health-checked in the background, and a rollout whose engine is down moves to a healthy
one: the call that failed is recorded as failed (the error goes to the harness), the
harness's retry goes to the new engine.

Plain asyncio, no Ray: `harnessrl serve`, `run` and `train` over several engine URLs and
every Ray node's shard build it alike, from one `EngineSettings` naming several URLs
(`build.make`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from harnessrl.errors import EngineTimeout, EngineUnavailable
from harnessrl.proxy.engines.base import Engine, TurnSource
from harnessrl.types import ChatRequest, EngineEvent

# An engine that answers with one of these is down for routing until a health check
# finds it up again; an engine error of its own (a 4xx, a bad request) is not a reason.
_DOWN = (EngineUnavailable, EngineTimeout, OSError)


def rank(key: str, count: int) -> list[int]:
    """Engine indexes in the order `key` prefers them (highest rendezvous weight first)."""
    def weight(index: int) -> bytes:
        return hashlib.blake2b(f"{index}:{key}".encode(), digest_size=8).digest()

    return sorted(range(count), key=weight, reverse=True)


class RoutedEngine:
    """The `Engine` protocol over `engines` (at least one). `weight_version` is the one all
    engines serve (None while they differ); setting it sets every engine's, as on any
    engine, once the weight sync has reached each of them (see `train.weights`)."""

    def __init__(self, engines: Sequence[Engine], *, health_interval: float = 2.0,
                 health_timeout: float = 5.0) -> None:
        if not engines:
            raise ValueError("RoutedEngine needs at least one engine")
        self.engines = list(engines)
        self.healthy = [True] * len(self.engines)
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        self.name = "+".join(sorted({e.name for e in self.engines}))
        self.calls = [0] * len(self.engines)  # per engine, for tests and progress
        self._checker: asyncio.Task[None] | None = None
        self._version: str | None = None
        # Taken out of routing for good (a failed weight reload): health checks that find
        # such a server up do not bring it back, since it may serve other weights.
        self.retired: set[int] = set()

    @property
    def weight_version(self) -> str | None:
        return self._version

    @weight_version.setter
    def weight_version(self, version: str | None) -> None:
        """Every engine serves `version` now (the weight sync has reached them all)."""
        for engine in self.engines:
            engine.weight_version = version
        self._version = version

    def retire_server(self, url: str) -> bool:
        """Route no call to the engine serving `url` any more (its rollouts move to the
        others, as on a down engine); False when no engine here calls `url`."""
        found = {i for i, e in enumerate(self.engines)
                 if getattr(e, "base_url", None) == url.rstrip("/").removesuffix("/v1")}
        self.retired |= found
        return bool(found)

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        for engine in self.engines:
            await engine.start()
        versions = {e.weight_version for e in self.engines}
        self._version = versions.pop() if len(versions) == 1 else None
        await self.check_health()
        self._checker = asyncio.create_task(self._check_loop())

    async def close(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checker
        for engine in self.engines:
            await engine.close()

    def bind_store(self, store: TurnSource) -> None:
        for engine in self.engines:
            engine.bind_store(store)

    def forget_rollout(self, key: str) -> None:
        for engine in self.engines:
            engine.forget_rollout(key)

    # ---------------------------------------------------------------- health
    async def check_health(self) -> list[bool]:
        """Each engine is up when it lists its models within `health_timeout`."""
        self.healthy = list(await asyncio.gather(*(self._up(e) for e in self.engines)))
        return self.healthy

    async def _up(self, engine: Engine) -> bool:
        try:
            await asyncio.wait_for(engine.models(), self.health_timeout)
            return True
        except (TimeoutError, *_DOWN):
            return False

    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval)
            await self.check_health()

    def route(self, rollout: str | None) -> int:
        """The engine for `rollout`: its most preferred healthy one (the first preferred
        when none is healthy, so the call fails and says why)."""
        order = [i for i in rank(rollout or "", len(self.engines)) if i not in self.retired]
        if not order:
            raise EngineUnavailable("every engine was taken out of routing (failed weight "
                                    "reloads)")
        return next((i for i in order if self.healthy[i]), order[0])

    # ---------------------------------------------------------------- calls
    async def models(self) -> list[str]:
        names: list[str] = []
        for index, engine in enumerate(self.engines):
            if index in self.retired:
                continue
            if self.healthy[index] or len(self.engines) == 1:
                names += [n for n in await engine.models() if n not in names]
        return names

    async def count_tokens(self, request: ChatRequest) -> int:
        return await self.engines[self.route(None)].count_tokens(request)

    async def complete(self, request: ChatRequest, rollout: str | None = None
                       ) -> list[EngineEvent]:
        index = self.route(rollout)
        self.calls[index] += 1
        try:
            return await self.engines[index].complete(request, rollout)
        except _DOWN:
            self.healthy[index] = False
            raise

    def stream(self, request: ChatRequest, rollout: str | None = None
               ) -> AsyncGenerator[EngineEvent, None]:
        return self._stream(request, rollout)

    async def _stream(self, request: ChatRequest, rollout: str | None
                      ) -> AsyncGenerator[EngineEvent, None]:
        index = self.route(rollout)
        self.calls[index] += 1
        try:
            async for event in self.engines[index].stream(request, rollout):
                yield event
        except _DOWN:
            self.healthy[index] = False
            raise


def routed(engines: Sequence[Engine], **options: Any) -> Engine:
    """One engine as it is; several behind a `RoutedEngine`."""
    return engines[0] if len(engines) == 1 else RoutedEngine(engines, **options)
