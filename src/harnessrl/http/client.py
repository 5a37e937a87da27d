"""A small HTTP/1.1 client, the project's one: asyncio protocols, httptools' response parser
and keep-alive connections per origin. Model calls to engines use it directly; control
calls (the proxy's /rollouts, vLLM's health, weight and version routes) through
`http/call.py`, from async or synchronous code.

Why not aiohttp, which this replaced on the engine side: a streamed call gets one socket
read per token from an engine no faster than the proxy, and aiohttp's read path (its
StreamReader, a read timeout re-armed on every read, flow-control bookkeeping) cost 40-50 µs
of CPU per read on this machine, about as much as the rest of the proxy's work on a token
(bench/proxy/stream.md). Here a read is one parser feed and, when the caller waits, one future.

Every response framing HTTP/1.1 allows is read (RFC 9112 section 6): Content-Length,
chunked (extensions and trailers too), a body that ends when the server closes the
connection (neither length nor chunked: HTTP/1.0 servers, Python's http.server, some
gateways), HTTP/1.0 replies, and 1xx interim responses (100, 103) before the final one. A
close-delimited connection is never reused. What fails is what is really broken: bytes that
are not HTTP, a length or chunk never reached before the connection closed, a switch of
protocols nobody asked for; the error says which.

Limits on waiting: `connect_timeout` for the TCP (and TLS) connection; `read_timeout` for
any silence once the request is sent (one timer per call, moved on only when it fires, not
per read). Only the engine's silence counts: while reading is paused because the caller has
not taken what came (its own client reads slowly), or held by a pace, the clock stands and
starts again when the proxy reads on.

A connection taken from the pool that the server has closed meanwhile (its keep-alive
timer is often shorter than ours) is retried once on a new one, when nothing of the answer
had arrived: almost always a server that closed it idle and never read the request. If it
had read it and then dropped the connection, a model call is sampled anew; nothing of the
first sample reached us, so nothing of it is recorded twice.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import select
import socket
import ssl
import struct
import termios
import time
from collections import deque
from types import TracebackType
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 1 << 20  # bytes of unread body before the socket is paused
# A paced hold: the socket's low-water mark, bytes the kernel keeps before it says readable.
HOLD_LOWAT = 1 << 16


@functools.cache
def lowat_holds() -> bool:
    """Whether a paced hold can be a raised SO_RCVLOWAT instead of paused reading (probed
    once, on a loopback pair): bytes under the mark must not wake an epoll waiter, and
    lowering the mark over bytes already queued must (Linux 4.18+). Pausing costs more:
    uvloop drops a paused socket from epoll lazily, on its next readable event, so each
    hold costs one more wake-up, and on a small VM a wake-up (~50-100 µs) is the larger
    part of a paced read's cost."""
    if not hasattr(select, "epoll") or not hasattr(socket, "SO_RCVLOWAT"):
        return False
    try:
        with socket.create_server(("127.0.0.1", 0)) as listener, \
                socket.create_connection(listener.getsockname()) as ours, \
                listener.accept()[0] as theirs, select.epoll() as poller:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, HOLD_LOWAT)
            poller.register(ours.fileno(), select.EPOLLIN)
            theirs.sendall(b"x")
            held = _queued(ours) == 1 and not poller.poll(0)
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
            return held and bool(poller.poll(1.0))
    except OSError:
        return False


def _queued(sock: socket.socket, wait: float = 1.0) -> int:
    """Bytes the kernel holds for `sock` once some have arrived (FIONREAD), 0 if none do
    within `wait` s. Loopback delivers within the sender's call, so this rarely waits."""
    deadline = time.monotonic() + wait
    while not (size := struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, b"\0" * 4))[0]):
        if time.monotonic() > deadline:
            break
        time.sleep(0.001)
    return size


Origin = tuple[str, str, int]  # scheme, host, port


class TransportError(Exception):
    """The connection could not be made, or broke off before the answer was whole."""


class Response:
    """One answer: status and headers once it has begun, then its body as it arrives.
    `release()` (or leaving `async with`) gives a finished connection back to the pool
    and closes an unfinished one, which tells the engine to stop."""

    def __init__(self, conn: Connection) -> None:
        self._conn: Connection | None = conn
        self.status = conn.status
        self.headers = conn.headers  # lower-cased names; the last of a repeated one
        self.raw_headers = conn.raw_headers  # every (name, value) as it came
        self.trailers = conn.trailers  # fields after a chunked body, filled in at its end

    def pace(self, interval: float) -> None:
        """Read the rest of the body at most once per `interval` seconds: after each read
        the socket is left alone for that long, so the tokens an engine streams meanwhile
        wait in the kernel and come in with one read (one wake-up, one parse feed, one
        write on) instead of one each. 0: every piece as soon as it arrives."""
        if self._conn is not None:
            self._conn.pace = interval

    async def readany(self) -> bytes:
        """What has arrived of the body since the last read (waiting for some); b"" at its
        end, which also releases the connection."""
        conn = self._conn
        if conn is None:
            return b""
        if not conn.chunks and not conn.complete:
            await conn.wait()
        piece = conn.take()
        if not piece:
            self.release()
        return piece

    async def read(self) -> bytes:
        parts = []
        while piece := await self.readany():
            parts.append(piece)
        return b"".join(parts)

    def release(self) -> None:
        if self._conn is not None:
            self._conn.finish()
            self._conn = None  # the connection may already serve another call

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.release()


class Connection(asyncio.Protocol):
    """One keep-alive connection; one request on it at a time."""

    def __init__(self, client: Client, origin: Origin) -> None:
        self.client, self.origin = client, origin
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        # How a pace holds the socket: True, a raised SO_RCVLOWAT; False, paused reading;
        # None until the first hold.
        self._lowat: bool | None = None
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: dict[str, str] = {}
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.trailers: list[tuple[bytes, bytes]] = []
        self.until_close = False  # the body ends when the server closes (RFC 9112 6.3)
        self.chunks: list[bytes] = []
        self.size = 0
        self.begun = False  # status and headers are in
        self.keep_alive = False  # known once the headers are in; httptools forgets it after
        self.complete = False
        self.received = False  # any byte of the answer
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False  # reading is paused: unread body over HIGH_WATER, or held
        self.pace = 0.0  # Response.pace
        self._held: asyncio.TimerHandle | None = None  # the pace's pause, until it fires
        self._timer: asyncio.TimerHandle | None = None
        self._silence = 0.0
        self._last = 0.0

    # ---------------------------------------------------------------- the caller's side
    def send(self, head: bytes, body: bytes, silence: float) -> None:
        self._reset()
        self._silence, self._last = silence, self.loop.time()
        self._timer = self.loop.call_at(self._last + silence, self._check_silence)
        assert self.transport is not None
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)  # no copy of a large prompt into the head

    async def wait(self) -> None:
        """Until something happens: body bytes, the end, or a failure (raised)."""
        if self.error is None:
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self.error is not None:
            raise self.error

    def take(self) -> bytes:
        chunks = self.chunks
        if not chunks:
            if self.error is not None:
                raise self.error
            return b""
        piece = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks, self.size = [], 0
        if self.pace and not self.complete and self._held is None:
            self._hold()
        self._flow()
        return piece

    def finish(self) -> None:
        self._stop_timer()
        self._unhold()  # a connection goes back to the pool with its low-water mark at 1
        if self.complete and self.keep_alive and self.error is None and not self.closed:
            self.client.give_back(self)
        else:
            self.abort()

    def abort(self) -> None:
        self.closed = True
        self._stop_timer()
        self._unhold()
        if self.transport is not None:
            self.transport.abort()

    # ---------------------------------------------------------------- asyncio's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.complete:  # bytes after a whole answer: not a connection to use again
            self.abort()
            return
        self.received = True
        self._last = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if not self.complete:
                self._fail(TransportError(f"the engine's answer is not valid HTTP: {exc}"))
            self.abort()  # after a whole answer (on_message_begin): it stands, unreused

    def on_message_begin(self) -> None:
        if self.complete:  # a second answer to one request: stop, and never reuse this
            raise TransportError("bytes after the whole answer")

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        self.client.forget(self)
        if self.until_close and exc is None and self.error is None and not self.complete:
            self.on_message_complete()  # the server's close is the end of this body
        if not self.complete:
            reason = f": {exc}" if exc else ""
            self._fail(TransportError(f"the connection was closed before the answer was "
                                      f"whole{reason}"))

    # ---------------------------------------------------------------- httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.begun:  # after a chunked body: a trailer field, not one of the head's
            self.trailers.append((name, value))
            return
        self.raw_headers.append((name, value))
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:
            self._interim(status)
            return
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()
        self.until_close = _until_close(status, self.headers)
        self.begun = True
        self._wake()

    def _interim(self, status: int) -> None:
        """A 1xx answer before the final one (100 Continue, 103 Early Hints): its headers
        are not the answer's. 101 switches protocols, which a call here never asks for."""
        self.headers, self.raw_headers = {}, []
        if status == 101:
            self._fail(TransportError("the engine answered 101 and switched protocols, "
                                      "which this call did not ask for"))
            self.abort()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.size += len(body)
        if self.size > HIGH_WATER and not self._paused:
            self._flow()
        self._wake()

    def on_message_complete(self) -> None:
        if not self.begun:  # the end of a 1xx answer: the final one is still to come
            return
        self.complete = True
        self._stop_timer()
        self._wake()

    # ---------------------------------------------------------------- inside
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _flow(self) -> None:
        """Pause reading while the unread body is over HIGH_WATER or the pace holds it."""
        pause = (self._held is not None and not self._lowat) or self.size > HIGH_WATER
        if pause != self._paused and self.transport is not None and not self.closed:
            self._paused = pause
            if pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()
                # what the engine sent while we did not read is in the kernel: its
                # silence counts from when we read again, not from the last byte we took
                self._last = max(self._last, self.loop.time())

    def _hold(self) -> None:
        """Leave the socket alone for `pace` s: the kernel keeps what arrives meanwhile
        (under a raised low-water mark where it can, else with reading paused)."""
        self._held = self.loop.call_later(self.pace, self._unhold)
        # the engine's silence counts from when we look again, not from our own hold
        self._last = self.loop.time() + self.pace
        if self._lowat is None:
            self._lowat = lowat_holds()
        if self._lowat and not self._set_lowat(HOLD_LOWAT):
            self._lowat = False

    def _unhold(self) -> None:
        if self._held is not None:
            self._held.cancel()  # a no-op when it is the timer firing
            self._held = None
            if self._lowat:
                self._set_lowat(1)  # the kernel wakes us now for what it kept
            self._flow()

    def _set_lowat(self, size: int) -> bool:
        sock = None if self.closed or self.transport is None else \
            self.transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, size)
        except OSError:  # closed meanwhile
            return False
        return True

    def _check_silence(self) -> None:
        now = self.loop.time()
        if self._paused:  # we are not reading (the caller is behind): nothing to judge
            self._last = max(self._last, now)
        due = self._last + self._silence
        if now < due:
            self._timer = self.loop.call_at(due, self._check_silence)
            return
        self._timer = None
        self._fail(TimeoutError(f"no answer for {self._silence:g} s"))
        self.abort()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Client:
    """Keep-alive HTTP/1.1 to any number of origins; `headers` go on every request."""

    def __init__(self, *, connect_timeout: float = 10.0, read_timeout: float = 600.0,
                 headers: dict[str, str] | None = None) -> None:
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self._extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._idle: dict[Origin, deque[Connection]] = {}
        self._open: set[Connection] = set()
        self._ssl: ssl.SSLContext | None = None

    async def request(self, method: str, url: str, body: bytes = b"", *,
                      headers: list[tuple[str, str]] | None = None,
                      read_timeout: float | None = None) -> Response:
        """The answer once it has begun (status and headers in). `headers` go with this
        request only, after the client's own; Host and Content-Length are written here."""
        origin, authority, target = split(url)
        extra = self._extra + "".join(f"{k}: {v}\r\n" for k, v in headers or ())
        head = (f"{method} {target} HTTP/1.1\r\nHost: {authority}\r\n"
                f"{extra}Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
        silence = self.read_timeout if read_timeout is None else read_timeout
        conn = await self._connection(origin)
        try:
            return await self._exchange(conn, head, body, silence)
        except TransportError:
            if not conn.reused or conn.received:
                raise
        conn = await self._connection(origin, fresh=True)  # the server had closed it
        return await self._exchange(conn, head, body, silence)

    async def close(self) -> None:
        for conn in list(self._open):
            conn.abort()
        self._open.clear()
        self._idle.clear()

    def give_back(self, conn: Connection) -> None:
        conn.reused = True
        self._idle.setdefault(conn.origin, deque()).append(conn)

    def forget(self, conn: Connection) -> None:
        """A closed connection leaves the pool."""
        self._open.discard(conn)
        idle = self._idle.get(conn.origin)
        if idle is not None and conn in idle:
            idle.remove(conn)

    async def _exchange(self, conn: Connection, head: bytes, body: bytes,
                        silence: float) -> Response:
        try:
            conn.send(head, body, silence)
            while not conn.begun:
                await conn.wait()
        except BaseException:
            conn.abort()
            raise
        return Response(conn)

    async def _connection(self, origin: Origin, *, fresh: bool = False) -> Connection:
        idle = self._idle.get(origin)
        while idle and not fresh:
            conn = idle.pop()  # the most recently used: the least likely to be closed
            if not conn.closed:
                return conn
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Connection(self, origin), host, port,
                    ssl=self._tls() if scheme == "https" else None)
        except TimeoutError as exc:
            raise TimeoutError(f"no connection to {host}:{port} within "
                               f"{self.connect_timeout:g} s") from exc
        except OSError as exc:
            raise TransportError(f"cannot connect to {host}:{port}: {exc}") from exc
        self._open.add(conn)
        return conn

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl


def _until_close(status: int, headers: dict[str, str]) -> bool:
    """Whether a final answer's body runs until the server closes the connection (RFC
    9112 6.3): it may have a body (not 204 or 304; we send no HEAD) and is framed neither
    by chunked as its last transfer coding nor by a Content-Length."""
    if status in (204, 304):
        return False
    coding = headers.get("transfer-encoding")
    if coding is not None:
        return coding.rsplit(",", 1)[-1].strip().lower() != "chunked"
    return "content-length" not in headers


def split(url: str) -> tuple[Origin, str, str]:
    """(scheme, host, port), the authority (the Host header) and the request target of an
    absolute http(s) URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    authority = parts.netloc.rpartition("@")[2]
    return (parts.scheme, parts.hostname, port), authority, target
