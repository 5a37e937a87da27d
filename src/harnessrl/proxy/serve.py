"""The one assembly of the capture proxy (engine -> store -> sessions -> proxy), served in
the foreground (`harnessrl serve`) or in a thread (the runner, training, conformance,
benchmarks, tests)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
import uvloop

from harnessrl.proxy.app import Proxy
from harnessrl.proxy.config import ProxySettings
from harnessrl.proxy.engines.base import Engine
from harnessrl.proxy.engines.vllm_server import free_port
from harnessrl.proxy.sessions import Sessions
from harnessrl.store.writer import TraceStore
from harnessrl.types import Sampling


def build(engine: Engine, run_dir: Path, *, sampling: Sampling | None = None,
          unset_sampling: frozenset[str] = frozenset(),
          config: ProxySettings | None = None, max_model_calls: int | None = None) -> Proxy:
    """The proxy in front of `engine`, recording into RUN_DIR/trace.db with the server-wide
    sampling policy and step cap (each rollout may set its own). The caller closes
    `proxy.store`, a context manager (`running` and `serve` do)."""
    sessions = Sessions(TraceStore(run_dir), sampling=sampling, unset_sampling=unset_sampling,
                        max_model_calls=max_model_calls)
    return Proxy(engine, sessions, config)


class Server(uvicorn.Server):
    """uvicorn's server, ticking once a second instead of ten times. Its tick only
    refreshes the Date header (to the second anyway) and looks at `should_exit`, but
    every wake-up of an idle process costs 0.1-0.2 ms of CPU on a small VM: 1-2 ms a
    second per proxy, and about four wake-ups inside each 400 ms streamed reply. Setting
    `should_exit` (a signal, `in_thread`, a test) wakes the loop at once, so stopping is
    as quick as before."""

    TICK = 1.0  # seconds; uvicorn's own is 0.1

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        super().__init__(config)

    @property  # type: ignore[override]
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value and self._exit is not None:  # from any thread, or a signal handler
            loop, event = self._exit
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(event.set)

    async def main_loop(self) -> None:
        event = asyncio.Event()
        self._exit = (asyncio.get_running_loop(), event)
        ticks = round(self.TICK / 0.1)  # on_tick counts uvicorn's 0.1 s ticks
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + ticks) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), self.TICK)
            should_exit = await self.on_tick(counter)


@dataclass(frozen=True)
class Running:
    """A proxy being served: where (`url`), and its store."""

    proxy: Proxy
    url: str
    server: Server

    @property
    def store(self) -> TraceStore:
        return self.proxy.store


@contextlib.contextmanager
def running(engine: Engine, run_dir: Path, *, host: str = "127.0.0.1", port: int | None = None,
            **options: Any) -> Iterator[Running]:
    """`build` served in a thread for the block; the store is closed after it. `options`
    are `build`'s."""
    proxy = build(engine, run_dir, **options)
    with proxy.store, in_thread(proxy.app(), host, port) as (url, server):
        yield Running(proxy, url, server)


async def serve(proxy: Proxy, host: str, port: int, *,
                wrap: Callable[[Any], Any] = lambda app: app,
                on_server: Callable[[Server], None] = lambda _s: None,
                sockets: list[socket.socket] | None = None) -> None:
    """Serve `proxy` on this event loop until the server exits, then close its store.
    `wrap` wraps the ASGI app (a benchmark's probe, a worker's relay); `on_server` sees
    the server (to stop it from a signal handler); `sockets`, if given, are listened on
    instead of `host`:`port` (`serve --workers`: the shared port and the worker's own)."""
    server = Server(config(wrap(proxy.app()), host, port))
    on_server(server)
    with proxy.store:
        await server.serve(sockets=sockets)


def config(app: Any, host: str, port: int) -> uvicorn.Config:
    # httptools: the proxy's own CPU per call is what the benchmark measures.
    return uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                          http="httptools", timeout_keep_alive=75, lifespan="on")


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run `main` on uvloop. uvicorn applies its `loop` setting only in `Server.run`, not
    when we drive `Server.serve` ourselves, so the loop is chosen here."""
    uvloop.run(main)


@contextlib.contextmanager
def in_thread(app: Any, host: str = "127.0.0.1", port: int | None = None,
              timeout: float = 60.0) -> Iterator[tuple[str, Server]]:
    """Serve `app` on its own event loop in a thread; yields (url, server)."""
    port = port or free_port(host)
    server = Server(config(app, host, port))
    thread = threading.Thread(target=lambda: run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError(f"the server on {host}:{port} did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}", server
    finally:
        server.should_exit = True
        thread.join(10)
