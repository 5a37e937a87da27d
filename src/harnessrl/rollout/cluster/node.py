"""One rollout node: what runs inside the Ray actor placed on each node of the cluster.

It hosts a capture-proxy shard (engine -> its own durable store on the node -> proxy on
the node's loopback, which is where that node's harnesses call it) and runs the rollouts
the driver hands it with the ordinary `Runner` (sandbox, harness, verifier, its infra
retries). Each finished rollout goes back to the driver whole: outcome, rollout record
and every turn with its exact token ids, packed as msgpack; the driver writes it into
the run's store, the one source of truth. The shard's store stays on the node as that
node's own record.

This module imports no Ray: the driver (`cluster/driver.py`) wraps the class as an actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from harnessrl.http.call import call
from harnessrl.http.client import TransportError
from harnessrl.proxy.engines.base import Engine
from harnessrl.proxy.engines.routed import routed
from harnessrl.rollout.runner import Planned, RunSettings
from harnessrl.rollout.serving import serving
from harnessrl.types import Outcome, Rollout, Sampling, Turn

# Builds the shard's engine(s) on the node: picklable (Ray ships it), one engine or a list.
EngineFactory = Callable[[], "Engine | list[Engine]"]


class NodeResult(msgspec.Struct, frozen=True):
    """A finished rollout as a node returns it to the driver."""

    node: str
    outcome: Outcome
    rollout: Rollout | None
    turns: list[Turn]


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(NodeResult).decode


def decode_result(blob: bytes) -> NodeResult:
    return _decode(blob)


def reach(engine_factory: EngineFactory) -> dict[str, str | None]:
    """Run on a node before its actor is placed: each engine's URL and why this node cannot
    reach it (None: it can), from a listing of its models. A node that reaches none can
    run no rollout (its shard's proxy would not even start)."""
    from concurrent.futures import ThreadPoolExecutor

    made = engine_factory()
    engines = made if isinstance(made, list) else [made]
    urls = [u for u in (getattr(e, "base_url", None) for e in engines) if u]
    if not urls:
        return {"(in-process engine)": None}
    with ThreadPoolExecutor(len(urls)) as pool:
        return dict(zip(urls, pool.map(_unreachable, urls), strict=True))


def _unreachable(url: str, timeout: float = 10.0) -> str | None:
    """Why `url`'s model listing cannot be had from here; None when it answers (or asks for
    a key: it is there)."""
    try:
        reply = call("GET", f"{url}/v1/models", timeout=timeout)
    except (TransportError, TimeoutError, OSError, ValueError) as error:
        return f"{type(error).__name__}: {str(error)[:200]}"
    return None if reply.status < 400 or reply.status in (401, 403) else f"HTTP {reply.status}"


class RolloutNode:
    """The actor's class (see the module doc). Methods are async: Ray runs them on one
    event loop, several at once (the driver keeps at most `slots` rollouts in flight)."""

    def __init__(self, node_id: str, shard_dir: str, engine_factory: EngineFactory,
                 config: RunSettings, sampling: Sampling | None) -> None:
        self.node_id = node_id
        self.shard_dir = Path(shard_dir)
        self._stack = contextlib.ExitStack()
        made = engine_factory()
        self.engine = routed(made if isinstance(made, list) else [made])
        served = self._stack.enter_context(serving(config, self.engine, self.shard_dir,
                                                   sampling=sampling))
        self.store = served.store
        self.url = served.url
        self.gate = served.proxy.gate  # held by the driver during every weight swap
        self.runner = served.runner
        self._installs: dict[str, asyncio.Task[Any]] = {}

    async def where(self) -> dict[str, Any]:
        return {"node": self.node_id, "host": socket.gethostname(), "pid": os.getpid(),
                "proxy": self.url, "store": str(self.store.path)}

    async def install(self, names: list[str]) -> None:
        """Installs the harnesses named (once per node, shared by concurrent callers)."""
        harnesses = {h.name: h for h in self.runner.config.harnesses}
        for name in names:
            if name not in self._installs:
                harness = harnesses[name]
                self._installs[name] = asyncio.ensure_future(asyncio.to_thread(
                    harness.install, self.runner.settings.tools, lambda _line: None))
            await self._installs[name]

    async def run(self, planned: Planned) -> bytes:
        """One planned rollout, retried on this node as the runner does; the result."""
        await self.install([planned.harness.name])
        [outcome] = await self.runner.run([planned])
        key = outcome.rollout
        rollout = await asyncio.to_thread(self.store.rollout, key) if key else None
        turns = await asyncio.to_thread(self.store.turns, key) if key else []
        return _encode(NodeResult(self.node_id, outcome, rollout, turns))

    async def set_weight_version(self, version: str | None) -> str | None:
        """The version every later turn of this shard records (after every engine of the
        cluster has the weights: the driver announces only then)."""
        self.engine.weight_version = version  # a router sets every engine's
        return self.engine.weight_version

    async def hold(self, timeout: float) -> int:
        """Hold this shard's weight gate: new calls wait, running ones finish (the async
        trainer swaps the weights once every shard answers); the calls held so far."""
        await asyncio.to_thread(self.gate.hold, timeout)
        return self.gate.waiting

    async def release(self) -> None:
        """Open the gate (the version later calls stamp was set before it)."""
        self.gate.release()

    async def retire_server(self, url: str) -> bool:
        """Route no call of this shard to the vLLM at `url` (it failed a weight reload)."""
        retire = getattr(self.engine, "retire_server", None)  # routers only: one engine
        return bool(retire(url)) if callable(retire) else False  # is not taken out

    def close(self) -> None:
        self._stack.close()
