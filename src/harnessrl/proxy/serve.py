"""Run an ASGI app with uvicorn: in the foreground (the CLI) or in a thread (the demo, tests)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from harnessrl.proxy.engines.managed import free_port


def config(app: Any, host: str, port: int) -> uvicorn.Config:
    # uvloop and httptools: the proxy's own CPU per call is what the benchmark measures.
    return uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                          loop="uvloop", http="httptools", timeout_keep_alive=75, lifespan="on")


@contextlib.contextmanager
def in_thread(app: Any, host: str = "127.0.0.1", port: int | None = None,
              timeout: float = 60.0) -> Iterator[tuple[str, uvicorn.Server]]:
    """Serve `app` on its own event loop in a thread; yields (url, server)."""
    port = port or free_port(host)
    server = uvicorn.Server(config(app, host, port))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
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
