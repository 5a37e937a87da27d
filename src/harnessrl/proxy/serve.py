"""Run an ASGI app with uvicorn: in the foreground (the CLI) or in a thread (the demo, tests)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import uvicorn
import uvloop

from harnessrl.proxy.engines.managed import free_port


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
              timeout: float = 60.0) -> Iterator[tuple[str, uvicorn.Server]]:
    """Serve `app` on its own event loop in a thread; yields (url, server)."""
    port = port or free_port(host)
    server = uvicorn.Server(config(app, host, port))
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
