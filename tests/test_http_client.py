"""The engine-side HTTP/1.1 client (`http/client.py`) against a raw loopback server
that answers each request the way a test tells it to: whole, chunked a piece at a time,
silent, cut off, or closing a kept-alive connection."""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from harnessrl.http import client as http_client
from harnessrl.http.client import HIGH_WATER, HOLD_LOWAT, Client, TransportError, split

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[bool]]


class Server:
    """Reads each request (head and Content-Length body) and hands it to `handler`, which
    answers and says whether to keep the connection open."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed = asyncio.Event()  # a connection ended (from the client's side or ours)
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                if not await self.handler(reader, writer, body):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self.closed.set()


def whole(body: bytes, status: int = 200) -> Handler:
    async def handler(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _b: bytes) -> bool:
        w.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body))
        await w.drain()
        return True
    return handler


def chunked(pieces: list[bytes], gap: float = 0.0, end: bool = True) -> Handler:
    async def handler(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _b: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in pieces:
            w.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await w.drain()
            await asyncio.sleep(gap)
        if end:
            w.write(b"0\r\n\r\n")
            await w.drain()
        return end
    return handler


async def test_a_whole_answer_and_the_connection_kept_alive() -> None:
    server = Server(whole(b'{"ok": true}'))
    async with server as url:
        client = Client()
        for _ in range(3):
            async with await client.request("POST", f"{url}/v1/x?a=1", b'{"q": 1}') as resp:
                assert resp.status == 200
                assert await resp.read() == b'{"ok": true}'
        await client.close()
    assert server.connections == 1  # one kept-alive connection for all three
    head = server.requests[0]
    assert head.startswith(b"POST /v1/x?a=1 HTTP/1.1\r\n")
    assert b"Content-Length: 8\r\n" in head and head.endswith(b'{"q": 1}')


async def test_a_chunked_answer_comes_as_it_arrives_and_whole() -> None:
    pieces = [b"data: %d\n\n" % i for i in range(20)]
    async with Server(chunked(pieces, gap=0.002)) as url:
        client = Client()
        got = []
        async with await client.request("POST", url + "/s") as resp:
            while piece := await resp.readany():
                got.append(piece)
        await client.close()
    assert b"".join(got) == b"".join(pieces)
    assert len(got) > 5  # read as it came, not only at the end


async def test_headers_are_read_and_a_status_is_passed_on() -> None:
    async with Server(whole(b"no", status=503)) as url:
        client = Client(headers={"Authorization": "Bearer k"})
        async with await client.request("GET", url + "/health") as resp:
            assert resp.status == 503
            assert resp.headers["content-length"] == "2"
        await client.close()


async def test_a_kept_alive_connection_the_server_closed_is_retried_once() -> None:
    """The race a keep-alive timer makes: the request goes out on a connection the server
    is closing, which it never reads. Nothing of an answer came, so a new connection gets
    it; a first request on a new connection that fails the same way is not retried."""
    answered: list[int] = []

    def closing_on_the_second_request_of_a_connection() -> Handler:
        seen: dict[int, int] = {}

        async def handler(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _b: bytes) -> bool:
            n = seen[id(w)] = seen.get(id(w), 0) + 1
            if n == 2:
                return False  # closes without a byte of answer
            answered.append(id(w))
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()
            return True
        return handler

    server = Server(closing_on_the_second_request_of_a_connection())
    async with server as url:
        client = Client()
        for _ in range(3):
            assert await (await client.request("GET", url)).read() == b"ok"
        await client.close()
    # Calls 2 and 3 each went out on a kept-alive connection that closed, then on a new one.
    assert len(answered) == 3 and len(server.requests) == 5 and server.connections == 3

    async def never(_r: asyncio.StreamReader, _w: asyncio.StreamWriter, _b: bytes) -> bool:
        return False

    server = Server(never)
    async with server as url:
        with pytest.raises(TransportError):
            await Client().request("GET", url)
    assert server.connections == 1


async def test_an_answer_cut_off_midway_is_a_transport_error() -> None:
    async with Server(chunked([b"data: 1\n\n"], end=False)) as url:
        client = Client()
        resp = await client.request("POST", url)
        assert await resp.readany() == b"data: 1\n\n"
        with pytest.raises(TransportError, match="before the answer was whole"):
            await resp.readany()
        await client.close()


async def test_silence_longer_than_the_read_timeout_is_a_timeout() -> None:
    async def silent(_r: asyncio.StreamReader, _w: asyncio.StreamWriter, _b: bytes) -> bool:
        await asyncio.sleep(5)
        return False

    async with Server(silent) as url:
        client = Client(read_timeout=0.3)
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            await client.request("POST", url)
        assert loop.time() - start < 2
        await client.close()


async def test_a_slow_stream_that_keeps_sending_is_not_timed_out() -> None:
    pieces = [b"x"] * 8
    async with Server(chunked(pieces, gap=0.1)) as url:  # 0.8 s in all, 0.1 s gaps
        client = Client(read_timeout=0.35)
        assert await (await client.request("POST", url)).read() == b"x" * 8
        await client.close()


async def test_nothing_listening_is_a_transport_error() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(TransportError, match="cannot connect"):
        await Client().request("GET", f"http://127.0.0.1:{port}/")


async def test_releasing_an_unfinished_answer_closes_its_connection() -> None:
    """Closing tells the engine to stop sampling; the next call gets a new connection."""
    server = Server(chunked([b"a"] * 50, gap=0.01))
    async with server as url:
        client = Client()
        async with await client.request("POST", url) as resp:
            assert await resp.readany()
        await asyncio.wait_for(server.closed.wait(), 5)
        assert await (await client.request("POST", url)).read() == b"a" * 50
        await client.close()
    assert server.connections == 2


async def test_an_unread_body_pauses_the_socket_and_nothing_is_lost() -> None:
    pieces = [bytes([65 + i % 26]) * 65536 for i in range(3 * HIGH_WATER // 65536)]
    async with Server(chunked(pieces)) as url:
        client = Client()
        resp = await client.request("POST", url)
        await asyncio.sleep(0.3)  # the server sends everything it can meanwhile
        conn = resp._conn
        assert conn is not None and conn.size <= HIGH_WATER + 2 * 65536  # paused near the mark
        assert await resp.read() == b"".join(pieces)
        await client.close()


async def _paced_reads(pace: float, pieces: list[bytes], gap: float
                      ) -> tuple[list[bytes], list[float]]:
    """Each read of a streamed answer read at `pace`, and when it came (from the request)."""
    async with Server(chunked(pieces, gap=gap)) as url:
        client = Client()
        loop = asyncio.get_running_loop()
        start = loop.time()
        got, times = [], []
        async with await client.request("POST", url) as resp:
            resp.pace(pace)
            while piece := await resp.readany():
                got.append(piece)
                times.append(loop.time() - start)
        await client.close()
    return got, times


@pytest.fixture(params=["lowat", "pause"])
def hold(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each paced test runs with both ways of holding a socket: a raised SO_RCVLOWAT where
    the kernel supports it (Linux 4.18+), paused reading where it does not."""
    if request.param == "lowat" and not http_client.lowat_holds():
        pytest.skip("this kernel's SO_RCVLOWAT does not hold a socket")
    monkeypatch.setattr(http_client, "lowat_holds", lambda: request.param == "lowat")
    return request.param


@pytest.mark.usefixtures("hold")
async def test_a_paced_stream_comes_in_fewer_reads_and_whole() -> None:
    """Pieces sent 2 ms apart, read at most every 50 ms: the first at once, then several
    per read; every byte in order, and the connection kept for the next call."""
    pieces = [b"data: %d\n\n" % i for i in range(100)]
    got, times = await _paced_reads(0.05, pieces, gap=0.002)
    assert b"".join(got) == b"".join(pieces)
    assert got[0] == pieces[0] and times[0] < 0.05  # the first token is not held
    assert len(got) <= 12  # ~0.25 s of stream in 50 ms reads, not 100 reads
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.045  # no read sooner than the pace (timer slack aside)


async def test_an_unpaced_stream_is_read_as_it_arrives() -> None:
    pieces = [b"data: %d\n\n" % i for i in range(30)]
    got, _ = await _paced_reads(0.0, pieces, gap=0.01)
    assert b"".join(got) == b"".join(pieces)
    assert len(got) > 20  # read as it came


@pytest.mark.usefixtures("hold")
async def test_a_paced_connection_is_reused_unpaced_and_aborts_cleanly() -> None:
    """The pace is the call's: the kept-alive connection's next call is read as it comes;
    an answer released while held closes its connection without a stray resume."""
    server = Server(chunked([b"a"] * 20, gap=0.005))
    async with server as url:
        client = Client()
        async with await client.request("POST", url) as resp:
            resp.pace(0.03)
            assert await resp.read() == b"a" * 20
        async with await client.request("POST", url) as resp:
            reads = 0
            while await resp.readany():
                reads += 1
        assert reads > 10 and server.connections == 1
        async with await client.request("POST", url) as resp:
            resp.pace(0.5)
            assert await resp.readany()  # now held for 0.5 s: leave it
        await asyncio.wait_for(server.closed.wait(), 5)
        await client.close()


async def _burst(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _b: bytes) -> bool:
    """One byte, then 50 ms later more than the hold's low-water mark and the end at once."""
    w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
    await w.drain()
    await asyncio.sleep(0.05)
    w.write(b"%x\r\n%s\r\n0\r\n\r\n" % (HOLD_LOWAT + 10, b"b" * (HOLD_LOWAT + 10)))
    await w.drain()
    return True


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_a_low_water_hold_keeps_reading_on_and_gives_the_mark_back(loop: str) -> None:
    """Held by the low-water mark, the socket is never paused (pausing costs uvloop an extra
    wake-up per hold) and more than the mark comes in at once; a connection given back to
    the pool while its hold is pending has its mark back at 1, so the next answer is read."""
    if not http_client.lowat_holds():
        pytest.skip("this kernel's SO_RCVLOWAT does not hold a socket")

    async def main() -> None:
        async with Server(_burst) as url:
            client = Client()
            async with await client.request("POST", url) as resp:
                resp.pace(5.0)
                assert await resp.readany() == b"a"
                conn = resp._conn
                assert conn is not None and conn.transport is not None
                assert _lowat(conn) == HOLD_LOWAT and conn.transport.is_reading()
                rest = await asyncio.wait_for(resp.read(), 2.0)  # not the 5 s hold
            assert rest == b"b" * (HOLD_LOWAT + 10) and _lowat(conn) == 1
            async with await client.request("POST", url) as resp:  # the same connection
                assert resp._conn is conn
                assert len(await asyncio.wait_for(resp.read(), 2.0)) == HOLD_LOWAT + 11
            await client.close()

    runner = asyncio.run if loop == "asyncio" else uvloop.run
    await asyncio.to_thread(runner, main())


def _lowat(conn: http_client.Connection) -> int:
    assert conn.transport is not None
    return conn.transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET,
                                                              socket.SO_RCVLOWAT)


@pytest.mark.parametrize(("url", "expected"), [
    ("http://127.0.0.1:8000/v1/chat?x=1", (("http", "127.0.0.1", 8000), "127.0.0.1:8000",
                                           "/v1/chat?x=1")),
    ("https://api.example.test", (("https", "api.example.test", 443), "api.example.test", "/")),
    ("http://[::1]:9/h", (("http", "::1", 9), "[::1]:9", "/h")),
])
def test_split(url: str, expected: tuple[object, ...]) -> None:
    assert split(url) == expected


def test_split_refuses_what_is_not_http() -> None:
    with pytest.raises(ValueError, match="not an http"):
        split("ftp://host/x")


def test_an_engine_url_the_client_cannot_use_is_refused_before_anything_starts() -> None:
    import subprocess
    import sys

    from harnessrl.proxy.engines.upstream import Upstream

    with pytest.raises(ValueError, match="'localhost:8000' is not an http"):
        Upstream("localhost:8000")
    done = subprocess.run([sys.executable, "-m", "harnessrl.cli", "serve", "--engine-url",
                           "localhost:8000", "--workers", "1"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode != 0
    assert "--engine-url 'localhost:8000' is not an http(s) URL" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("ms", ["-1", "1001", "soon"])
def test_a_stream_interval_out_of_range_is_refused_with_the_flag_named(ms: str, capsys) -> None:
    from harnessrl.cli import main
    from harnessrl.proxy.engines.upstream import Upstream

    with pytest.raises(SystemExit) as exited:
        main(["serve", "--engine-url", "http://127.0.0.1:9", "--stream-interval-ms", ms])
    assert exited.value.code == 2
    assert "--stream-interval-ms" in capsys.readouterr().err
    with pytest.raises(ValueError, match="stream_interval"):
        Upstream("http://127.0.0.1:9", stream_interval=2.0)


@pytest.mark.usefixtures("hold")
async def test_a_pace_longer_than_the_read_timeout_is_not_the_engine_s_silence() -> None:
    """The read timeout is the engine's silence: time the proxy holds a stream unread is
    not counted against it."""
    pieces = [b"data: %d\n\n" % i for i in range(20)]
    async with Server(chunked(pieces, gap=0.02)) as url:
        client = Client(read_timeout=0.3)
        async with await client.request("POST", url) as resp:
            resp.pace(0.5)
            assert await resp.read() == b"".join(pieces)
        await client.close()


# ------------------------------------------------------------------ framings (issue 32)
def framed(name: str, pieces: list[bytes], gap: float = 0.0) -> Handler:
    """An answer in one of tests/raw_engine.py's framings (or broken answers)."""
    from tests.raw_engine import BROKEN, FRAMINGS

    writer = FRAMINGS[name] if name in FRAMINGS else BROKEN[name][0]

    async def handler(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _b: bytes) -> bool:
        keep = await writer(w, pieces, gap)
        await w.drain()
        return bool(keep)
    return handler


def _framings() -> list[str]:
    from tests.raw_engine import FRAMINGS
    return list(FRAMINGS)


def _broken() -> list[tuple[str, str]]:
    from tests.raw_engine import BROKEN
    return [(name, words) for name, (_, words) in BROKEN.items()]


# Framings after which the server closes: the client must open a new connection each time.
CLOSING = {"close-delimited", "close-announced", "http/1.0", "http/1.0-length"}


@pytest.mark.parametrize("name", _framings())
async def test_every_framing_http_allows_is_read_whole(name: str) -> None:
    """Each answer whole, three times over; a connection kept only where the framing
    allows it (a close-delimited body's end is its connection's end)."""
    pieces = [b"data: %d\n\n" % i for i in range(30)]
    server = Server(framed(name, pieces))
    async with server as url:
        client = Client()
        for _ in range(3):
            async with await client.request("POST", url + "/v1/x", b"{}") as resp:
                assert resp.status == 200
                assert "link" not in resp.headers  # a 103's headers are not the answer's
                assert await resp.read() == b"".join(pieces)
        await client.close()
    assert server.connections == (3 if name in CLOSING else 1)
    assert len(server.requests) == 3  # never sent twice


async def test_trailers_are_kept_apart_from_the_head() -> None:
    async with Server(framed("chunked-extensions-trailers", [b"a", b"bc"])) as url:
        client = Client()
        async with await client.request("POST", url) as resp:
            assert await resp.read() == b"abc"
            assert resp.trailers == [(b"X-Checksum", b"abc"), (b"X-Done", b"1")]
            assert "x-checksum" not in resp.headers and resp.headers["trailer"]
        await client.close()


@pytest.mark.parametrize("name", ["close-delimited", "http/1.0"])
async def test_a_close_delimited_body_comes_as_it_arrives(name: str) -> None:
    pieces = [b"data: %d\n\n" % i for i in range(20)]
    async with Server(framed(name, pieces, gap=0.005)) as url:
        client = Client()
        got = []
        async with await client.request("POST", url) as resp:
            while piece := await resp.readany():
                got.append(piece)
        await client.close()
    assert b"".join(got) == b"".join(pieces) and len(got) > 5


@pytest.mark.parametrize(("name", "words"), _broken())
async def test_a_broken_answer_fails_with_its_reason(name: str, words: str) -> None:
    async with Server(framed(name, [b"data: 1\n\n"])) as url:
        client = Client()
        with pytest.raises(TransportError, match=words):
            async with await client.request("POST", url) as resp:
                await resp.read()
        await client.close()


async def test_a_close_delimited_body_cut_by_a_reset_is_not_whole() -> None:
    """A reset is not the server's end of a body: only a clean close is."""
    async def reset(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _b: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\n\r\npartial")
        await w.drain()
        sock = w.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        w.transport.abort()
        return False

    async with Server(reset) as url:
        client = Client()
        resp = await client.request("POST", url)
        with pytest.raises(TransportError, match="before the answer was whole"):
            await resp.read()
        await client.close()


async def test_bytes_after_a_whole_answer_leave_it_whole_and_the_connection_unused() -> None:
    async def extra(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _b: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbad")
        await w.drain()
        return True

    server = Server(extra)
    async with server as url:
        client = Client()
        for _ in range(2):
            async with await client.request("POST", url) as resp:
                assert await resp.read() == b"ok"
        await client.close()
    assert server.connections == 2


# ------------------------------------------------------------------ back-pressure (issue 32)
async def test_a_caller_that_does_not_read_is_not_the_engine_s_silence() -> None:
    """The caller (behind a slow client) takes nothing for longer than the read timeout
    while the engine has sent more than HIGH_WATER: reading is paused, and that pause is
    ours, not the engine's silence. Every byte comes through."""
    pieces = [bytes([65 + i % 26]) * 65536 for i in range(3 * HIGH_WATER // 65536)]
    async with Server(chunked(pieces)) as url:
        client = Client(read_timeout=0.3)
        resp = await client.request("POST", url)
        await asyncio.sleep(1.0)  # paused at the mark for most of this
        assert resp._conn is not None and resp._conn._paused
        assert await resp.read() == b"".join(pieces)
        await client.close()


async def test_real_silence_after_a_pause_is_still_timed_out() -> None:
    """Once the proxy reads on, an engine that has gone silent is found out within the
    read timeout."""
    pieces = [b"x" * 65536] * (2 * HIGH_WATER // 65536)
    sending = chunked(pieces, end=False)

    async def then_silent(r: asyncio.StreamReader, w: asyncio.StreamWriter, b: bytes) -> bool:
        await sending(r, w, b)
        await asyncio.sleep(30)  # cancelled when the test's server stops
        return False

    async with Server(then_silent) as url:
        client = Client(read_timeout=0.3)
        resp = await client.request("POST", url)
        await asyncio.sleep(0.8)
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            while await resp.readany():
                start = loop.time()
        assert loop.time() - start < 1.0
        await client.close()
