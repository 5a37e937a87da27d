"""One HTTP call and its whole answer over the project's own client (`http/client.py`), for the
calls that are not model calls: the proxy's control routes (`/rollouts`, `/weights/*`) and
vLLM's own (`/health`, `/v1/models`, the weight reload and version routes). `fetch` runs on
the caller's event loop; `call` is the same from synchronous code (a trainer thread between
optimizer steps, vLLM's start-up wait, a Ray node's reach check), on an event loop of its
own for the call. One client for everything the project calls, so framing, timeouts and
errors are the same everywhere.

Errors: `TransportError` when the server cannot be reached or breaks off (its cause, e.g.
ConnectionRefusedError, is kept as `__cause__`), `TimeoutError` when it does not connect or
goes silent for `timeout` seconds, `ValueError` for a URL that is not http(s). A status is
never an error here: the caller says what a 404 means.
"""

from __future__ import annotations

import asyncio
import errno
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgspec

from harnessrl.http.client import Client, TransportError

CONNECT_TIMEOUT = 10.0  # seconds; client.Client's own default


@dataclass(frozen=True)
class Reply:
    """An answer, read whole."""

    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def text(self, limit: int | None = None) -> str:
        return self.body[:limit].decode(errors="replace")

    def json(self) -> Any:
        """The body as JSON (None when it is empty); msgspec's DecodeError if it is not."""
        return msgspec.json.decode(self.body) if self.body else None


async def fetch(method: str, url: str, body: Any = None, *, timeout: float = 60.0,
                headers: list[tuple[str, str]] | None = None) -> Reply:
    """`method` on `url` with `body` sent as JSON (None: no body), on this event loop. The
    connection is given at most 10 s (`timeout` if shorter), as every engine's is."""
    client = Client(connect_timeout=min(timeout, CONNECT_TIMEOUT), read_timeout=timeout)
    payload = b"" if body is None else msgspec.json.encode(body)
    sent = [("Content-Type", "application/json"), *(headers or [])]
    try:
        async with await client.request(method, url, payload, headers=sent) as resp:
            return Reply(resp.status, await resp.read())
    finally:
        await client.close()


def call(method: str, url: str, body: Any = None, *, timeout: float = 60.0,
         headers: list[tuple[str, str]] | None = None) -> Reply:
    """`fetch` from synchronous code, blocking until the answer is whole. On a thread that
    already runs an event loop the call gets a thread of its own (asyncio.run cannot nest),
    as blocking there as the standard library's client was."""
    def run() -> Reply:
        return asyncio.run(fetch(method, url, body, timeout=timeout, headers=headers))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    with ThreadPoolExecutor(1, thread_name_prefix="harnessrl-http-call") as pool:
        return pool.submit(run).result()


def refused(error: BaseException) -> bool:
    """Whether `error` (raised by `fetch` or `call`) is a connection refused at every
    address of the host: nothing listens there (yet). asyncio tries each address a name
    resolves to (localhost: ::1, then 127.0.0.1) and, when they all fail, raises one
    OSError that names each failure by its errno in words only."""
    cause = error.__cause__ if isinstance(error, TransportError) else error
    if isinstance(cause, ConnectionRefusedError):
        return True
    codes = re.findall(r"\[Errno (\d+)\]", str(cause)) if isinstance(cause, OSError) else []
    return bool(codes) and all(int(c) == errno.ECONNREFUSED for c in codes)
