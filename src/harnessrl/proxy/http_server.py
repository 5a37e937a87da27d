"""uvicorn's HTTP/1.1 protocol (httptools), with a response's head sent in the same write as
its first body bytes.

uvicorn writes the status line and headers as soon as the app sends `http.response.start`,
and the body in a write of its own. On loopback every write is a segment the client may wake
for, and each wake-up of a small VM costs 50-200 µs: a non-streamed answer would reach its
client in two pieces where the engine sent one, and a streamed one would send its headers
apart from its first token (the proxy waits for the engine's first event before it answers,
so the two are ready together). Here the head waits for the first body write or for the
event loop's next turn, whichever comes first, so an app that pauses between the two (a
stream whose first event is slow) still sends its headers at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

# A body this large goes in a write of its own rather than be copied behind the head.
JOIN_LIMIT = 1 << 16


class _HeadWithBody:
    """The transport one request's response is written through: the head (the first write
    after `hold`) waits for the next write, or for the loop's next turn."""

    __slots__ = ("_head", "_holding", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._head: bytes | None = None
        self._holding = False

    def hold(self) -> None:
        self._holding = True

    def write(self, data: bytes) -> None:
        if self._holding:
            self._holding = False
            self._head = data
            self._loop.call_soon(self.flush)
            return
        head, self._head = self._head, None
        if head is None:
            self._transport.write(data)
        elif len(data) < JOIN_LIMIT:
            self._transport.write(head + data)
        else:
            self._transport.write(head)
            self._transport.write(data)

    def flush(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self._transport.is_closing():
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, ...
        return getattr(self._transport, name)


class _Cycle(RequestResponseCycle):
    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            self.transport.hold()  # type: ignore[attr-defined]  (a _HeadWithBody)
        await super().send(message)


class HttpProtocol(HttpToolsProtocol):
    """`uvicorn.Config(http=HttpProtocol)`: each request's cycle writes through a
    `_HeadWithBody`."""

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        cycle.__class__ = _Cycle
        cycle.transport = _HeadWithBody(cycle.transport, self.loop)  # type: ignore[assignment]
        super()._start_asgi_task(cycle, app)
