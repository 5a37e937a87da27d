"""A scripted stand-in for vLLM's chat endpoint on a raw loopback socket, written byte by
byte here (no HTTP library), so a test chooses how each answer is framed: every framing
HTTP/1.1 allows a server (RFC 9112 section 6), and ones that are really broken.

It answers `GET /v1/models`, `GET /health` and `POST /v1/chat/completions` (streamed or
whole, in vLLM's shapes with token ids and logprobs) with `tokens` tokens; token i is the
text `text_of(i)`, id `id_of(i)`, logprob `logprob_of(i)`. Anything else gets a 404.

And raw clients of the proxy for issue 32's tests: slow readers with small receive buffers
(`read_stream`, `READERS`) and clients that leave before their answer (`call_and_leave`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from harnessrl.types import Turn
from tests.dialects import WireDialect

PROMPT_IDS = [1, 2, 3, 4]


def text_of(i: int) -> str:
    return f"w{i} "


def id_of(i: int) -> int:
    return 1000 + i


def logprob_of(i: int) -> float:
    return -0.5 - i / 1024  # exact in binary: what is stored must be what was sent


Writer = Callable[[asyncio.StreamWriter, list[bytes], float], Any]


async def _pieces(w: asyncio.StreamWriter, pieces: list[bytes], gap: float,
                  frame: Callable[[bytes], bytes] = lambda p: p) -> None:
    for piece in pieces:
        w.write(frame(piece))
        await w.drain()
        if gap:
            await asyncio.sleep(gap)


def _head(version: bytes, *lines: bytes) -> bytes:
    return b"HTTP/%s 200 OK\r\nContent-Type: application/json\r\n%s\r\n" % (
        version, b"".join(line + b"\r\n" for line in lines))


async def _length(w: asyncio.StreamWriter, pieces: list[bytes], gap: float) -> bool:
    w.write(_head(b"1.1", b"Content-Length: %d" % sum(map(len, pieces))))
    await _pieces(w, pieces, gap)
    return True


async def _chunked(w: asyncio.StreamWriter, pieces: list[bytes], gap: float) -> bool:
    w.write(_head(b"1.1", b"Transfer-Encoding: chunked"))
    await _pieces(w, pieces, gap, lambda p: b"%x\r\n%s\r\n" % (len(p), p))
    w.write(b"0\r\n\r\n")
    return True


async def _chunked_extensions(w: asyncio.StreamWriter, pieces: list[bytes], gap: float
                              ) -> bool:
    """Chunk extensions on every chunk (RFC 9112 7.1.1) and trailer fields after the
    last (7.1.2), announced in a Trailer header; hex sizes in upper case, zero-padded."""
    w.write(_head(b"1.1", b"Transfer-Encoding: chunked", b"Trailer: X-Checksum, X-Done"))
    await _pieces(w, pieces, gap,
                  lambda p: b'%04X;seq=1;name="a;b"\r\n%s\r\n' % (len(p), p))
    w.write(b"0;last\r\nX-Checksum: abc\r\nX-Done: 1\r\n\r\n")
    return True


async def _close_delimited(w: asyncio.StreamWriter, pieces: list[bytes], gap: float) -> bool:
    """No Content-Length, not chunked: the body ends when the server closes (6.3 rule 8)."""
    w.write(_head(b"1.1"))
    await _pieces(w, pieces, gap)
    return False


async def _close_announced(w: asyncio.StreamWriter, pieces: list[bytes], gap: float
                           ) -> bool:
    w.write(_head(b"1.1", b"Connection: close"))
    await _pieces(w, pieces, gap)
    return False


async def _http10(w: asyncio.StreamWriter, pieces: list[bytes], gap: float) -> bool:
    """An HTTP/1.0 server (Python's http.server): no length, the body ends at close."""
    w.write(_head(b"1.0", b"Server: BaseHTTP/0.6 Python/3"))
    await _pieces(w, pieces, gap)
    return False


async def _http10_length(w: asyncio.StreamWriter, pieces: list[bytes], gap: float) -> bool:
    """HTTP/1.0 with a length and no keep-alive: whole, then the server closes."""
    w.write(_head(b"1.0", b"Content-Length: %d" % sum(map(len, pieces))))
    await _pieces(w, pieces, gap)
    return False


async def _http10_keep_alive(w: asyncio.StreamWriter, pieces: list[bytes], gap: float
                             ) -> bool:
    w.write(_head(b"1.0", b"Connection: keep-alive",
                  b"Content-Length: %d" % sum(map(len, pieces))))
    await _pieces(w, pieces, gap)
    return True


async def _interim(w: asyncio.StreamWriter, pieces: list[bytes], gap: float) -> bool:
    """100 Continue and 103 Early Hints (with headers of its own) before the final
    answer, chunked (RFC 9110 15.2)."""
    w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    await w.drain()
    await asyncio.sleep(0.01)
    w.write(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n"
            b"Content-Type: text/html\r\n\r\n")
    await w.drain()
    return await _chunked(w, pieces, gap)


async def _trickle(w: asyncio.StreamWriter, pieces: list[bytes], gap: float) -> bool:
    """A chunked answer written a few bytes at a time: the head, chunk sizes and the
    body all split across reads."""
    data = (_head(b"1.1", b"Transfer-Encoding: chunked")
            + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n")
    for at in range(0, len(data), 7):
        w.write(data[at:at + 7])
        await w.drain()
        await asyncio.sleep(gap or 0.0005)
    return True


# Framings HTTP/1.1 allows: name -> writer (returns whether the connection stays open).
FRAMINGS: dict[str, Writer] = {
    "content-length": _length,
    "chunked": _chunked,
    "chunked-extensions-trailers": _chunked_extensions,
    "close-delimited": _close_delimited,
    "close-announced": _close_announced,
    "http/1.0": _http10,
    "http/1.0-length": _http10_length,
    "http/1.0-keep-alive": _http10_keep_alive,
    "interim-1xx": _interim,
    "trickle": _trickle,
}


async def _cut_length(w: asyncio.StreamWriter, pieces: list[bytes], gap: float) -> bool:
    """A Content-Length the server does not reach before it closes."""
    w.write(_head(b"1.1", b"Content-Length: %d" % (sum(map(len, pieces)) + 100)))
    await _pieces(w, pieces, gap)
    return False


async def _cut_chunked(w: asyncio.StreamWriter, pieces: list[bytes], gap: float) -> bool:
    """A chunked answer closed before its last chunk."""
    w.write(_head(b"1.1", b"Transfer-Encoding: chunked"))
    await _pieces(w, pieces, gap, lambda p: b"%x\r\n%s\r\n" % (len(p), p))
    return False


async def _bad_chunk(w: asyncio.StreamWriter, pieces: list[bytes], gap: float) -> bool:
    w.write(_head(b"1.1", b"Transfer-Encoding: chunked"))
    w.write(b"zz\r\nnot hex\r\n")
    return False


async def _two_lengths(w: asyncio.StreamWriter, pieces: list[bytes], gap: float) -> bool:
    size = sum(map(len, pieces))
    w.write(_head(b"1.1", b"Content-Length: %d" % size, b"Content-Length: %d" % (size + 1)))
    await _pieces(w, pieces, gap)
    return False


async def _not_http(w: asyncio.StreamWriter, pieces: list[bytes], gap: float) -> bool:
    w.write(b"SSH-2.0-OpenSSH_9.6\r\n")
    return False


async def _switching(w: asyncio.StreamWriter, pieces: list[bytes], gap: float) -> bool:
    w.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\n\r\n")
    return False


# Answers that are really broken: name -> (writer, words the failure must name).
BROKEN: dict[str, tuple[Writer, str]] = {
    "cut-content-length": (_cut_length, "closed before the answer was whole"),
    "cut-chunked": (_cut_chunked, "closed before the answer was whole"),
    "bad-chunk-size": (_bad_chunk, "not valid HTTP"),
    "two-content-lengths": (_two_lengths, "not valid HTTP"),
    "not-http": (_not_http, "not valid HTTP"),
    "switching-protocols": (_switching, "switch"),
}


def sse(chunks: list[dict]) -> list[bytes]:
    return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]


@dataclass
class RawEngine:
    """`framing`: a key of FRAMINGS (or BROKEN) for every answer; `tokens` per reply;
    `gap` seconds between streamed pieces (0: as fast as the socket takes them)."""

    framing: str = "chunked"
    tokens: int = 6
    gap: float = 0.0
    pad: int = 0  # characters of an unused field in each streamed chunk (vLLM's are long)
    width: int = 0  # characters added to each token's text (a long answer in few tokens)
    delay: float = 0.0  # seconds before a model call is answered (a long generation)
    url: str = ""
    connections: int = 0
    requests: list[tuple[str, str, dict]] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None

    @property
    def ids(self) -> list[int]:
        return [id_of(i) for i in range(self.tokens)]

    @property
    def logprobs(self) -> list[float]:
        return [logprob_of(i) for i in range(self.tokens)]

    def piece(self, i: int) -> str:
        return text_of(i) + "x" * self.width

    @property
    def text(self) -> str:
        return "".join(self.piece(i) for i in range(self.tokens))

    @contextlib.contextmanager
    def running(self) -> Iterator[RawEngine]:
        started = threading.Event()
        stop: list[asyncio.Event] = []

        async def main() -> None:
            server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            self._loop = asyncio.get_running_loop()
            stop.append(asyncio.Event())
            started.set()
            async with server:
                await stop[0].wait()

        thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        thread.start()
        started.wait(10)
        try:
            yield self
        finally:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(stop[0].set)
            thread.join(10)

    # ---------------------------------------------------------------- serving
    async def _serve(self, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = next((int(line.split(":", 1)[1]) for line in lines
                               if line.lower().startswith("content-length:")), 0)
                body = json.loads(await reader.readexactly(length) or b"{}")
                self.requests.append((method, path, body))
                pieces, status = self._answer(method, path, body)
                if status != 200:
                    w.write(b"HTTP/1.1 %d X\r\nContent-Length: 2\r\n\r\n{}" % status)
                    await w.drain()
                    continue
                # A broken framing breaks the model calls only: the proxy must start.
                if path == "/v1/chat/completions" and self.delay:
                    await asyncio.sleep(self.delay)
                writer = (FRAMINGS[self.framing] if self.framing in FRAMINGS
                          else BROKEN[self.framing][0] if path == "/v1/chat/completions"
                          else _length)
                keep = await writer(w, pieces, self.gap if body.get("stream") else 0.0)
                await w.drain()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    def _answer(self, method: str, path: str, body: dict) -> tuple[list[bytes], int]:
        if method == "GET" and path == "/v1/models":
            return [json.dumps({"object": "list", "data": [{"id": "raw"}]}).encode()], 200
        if method == "GET" and path == "/health":
            return [b"{}"], 200
        if method == "POST" and path == "/v1/chat/completions":
            return (sse(self.chunks()) if body.get("stream") else [self.whole()]), 200
        return [], 404

    def chunks(self) -> list[dict]:
        head = {"id": "x", "object": "chat.completion.chunk", "model": "raw",
                **({"system_fingerprint": "f" * self.pad} if self.pad else {})}
        out = [{**head, "prompt_token_ids": PROMPT_IDS,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                             "token_ids": [], "logprobs": None}]}]
        for i in range(self.tokens):
            out.append({**head, "choices": [{
                "index": 0, "delta": {"content": self.piece(i)},
                "finish_reason": "stop" if i == self.tokens - 1 else None,
                "token_ids": [id_of(i)],
                "logprobs": {"content": [{"token": self.piece(i),
                                          "logprob": logprob_of(i)}]}}]})
        out.append({**head, "choices": [],
                    "usage": {"prompt_tokens": len(PROMPT_IDS),
                              "completion_tokens": self.tokens}})
        return out

    def whole(self) -> bytes:
        return json.dumps({
            "id": "x", "model": "raw", "prompt_token_ids": PROMPT_IDS,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": self.text},
                         "token_ids": self.ids,
                         "logprobs": {"content": [{"token": self.piece(i),
                                                   "logprob": logprob_of(i)}
                                                  for i in range(self.tokens)]}}],
            "usage": {"prompt_tokens": len(PROMPT_IDS),
                      "completion_tokens": self.tokens}}).encode()


# ------------------------------------------------------------------ raw clients
ENGINE_TIMEOUT = 2.0  # s: every reader below is behind the engine for longer than this


def read_stream(url: str, key: str, *, step: int = 2048, every: float = 0.02,
                stall: float = 0.0, rcvbuf: int = 4096, timeout: float = 120.0) -> bytes:
    """A streamed chat call read by a raw client with a `rcvbuf` receive buffer: nothing
    for `stall` s, then `step` bytes every `every` s, until the server closes."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"model": "raw", "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connecting
        sock.settimeout(timeout)
        sock.connect((host, int(port)))
        sock.sendall(b"POST /r/%s/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (key.encode(), len(body), body))
        time.sleep(stall)
        got = bytearray()
        while data := sock.recv(step):
            got += data
            time.sleep(every)
    return bytes(got)


def whole_and_exact(raw: bytes, turns: list, engine: RawEngine) -> None:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"data: [DONE]" in body[-200:] and b'"error"' not in body, body[-300:]
    assert body.count(b"chat.completion.chunk") >= 2
    assert len(turns) == 1 and turns[0].status == "ok", turns[0].error
    tokens = turns[0].completion.tokens
    assert list(tokens.prompt_ids) == PROMPT_IDS
    assert list(tokens.completion_ids) == engine.ids
    assert list(tokens.logprobs) == engine.logprobs


@dataclass(frozen=True)
class Reader:
    """An engine's answer (`tokens`, each `width` characters longer than its id's text)
    and how the client reads it (see `read_stream`)."""

    tokens: int
    width: int = 0
    step: int = 2048
    every: float = 0.02
    stall: float = 0.0

    def read(self, url: str, key: str) -> bytes:
        return read_stream(url, key, step=self.step, every=self.every, stall=self.stall)


# The reader (1,500 tokens, 2 KB every 20 ms), and one that stalls past the engine
# timeout on an answer longer than the kernel buffers between it and the proxy hold (so
# the proxy must stop reading the engine; before issue 32 that pause timed the call out).
READERS = {
    "slow": Reader(tokens=1500),
    "stalled": Reader(tokens=1500, width=4000, stall=1.5 * ENGINE_TIMEOUT, step=1 << 20,
                      every=0.0),
}


ENGINE_DELAY = 0.4  # s the engine takes over a non-streamed answer
LEAVE_AFTER = 0.1  # s after sending its request the client disconnects


def call_and_leave(base: str, dialect: WireDialect, *, after: float = LEAVE_AFTER) -> None:
    """A non-streamed call in `dialect` to a rollout's base URL by a raw client that
    closes its connection `after` s, before any answer."""
    host_port, _, prefix = base.removeprefix("http://").partition("/")
    host, port = host_port.rsplit(":", 1)
    path, body, _ = dialect.streamed(dialect.plain, False)
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /%s%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (prefix.encode(), path.encode(),
                                                       len(data), data))
        time.sleep(after)
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):  # nothing yet, as meant
            assert not sock.recv(1), "an answer came before the client left"


def stored(read: Callable[[], list[Turn]], n: int, timeout: float = 15.0) -> list[Turn]:
    """The rollout's turns once `n` are stored (the owner commits when the engine is
    done, after the client has gone)."""
    deadline = time.monotonic() + timeout
    while len(turns := read()) < n:
        assert time.monotonic() < deadline, f"{len(turns)} of {n} turns stored"
        time.sleep(0.05)
    time.sleep(0.3)  # a cancellation after a commit lands in its own write
    return read()
