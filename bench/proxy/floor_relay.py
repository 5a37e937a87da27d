#!/usr/bin/env python3
"""The floor under any capture proxy on this machine: a relay that copies bytes and does
nothing else. Not part of harnessrl; `stream_cpu.py` runs it beside the proxies.

It speaks just enough of the proxy's surface for the benchmark: `GET /health`,
`POST /rollouts` (a fixed key) and any `POST /r/<key>/...`, whose body it reads and drops
before sending the engine one fixed streamed (or not) chat request and copying the engine's
answer back as it arrives, one write per read, with no parsing of the answer: no SSE split,
no JSON, no capture, no store. Whatever CPU it spends per streamed token is what the kernel,
the event loop and one HTTP parser per side cost; a proxy's own work is what it spends
above this. `--server uvicorn` does the same as a bare ASGI app under uvicorn (httptools,
uvloop), as the proxy is served: the difference is uvicorn's own share. `--server tcp`
parses nothing: each client connection gets its own engine connection and bytes are
copied both ways, so the client's own request reaches the engine (`latency.py`: what two
more socket hops cost a call).

    python bench/proxy/floor_relay.py --port 9000 --engine-url http://127.0.0.1:8000 \
        [--server uvicorn]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httptools
import uvicorn
import uvloop

from harnessrl.http.client import Client, Response

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

REQUEST = {"model": "bench-model", "max_tokens": 256,
           "messages": [{"role": "user", "content": "x"}]}


class Downstream(asyncio.Protocol):
    """One client connection: requests parsed with httptools, answers chunked."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        url, body = self.url, b"".join(self.body)
        self.url, self.body = b"", []
        asyncio.get_running_loop().create_task(self.answer(url, body))

    async def answer(self, url: bytes, body: bytes) -> None:
        assert self.transport is not None
        write = self.transport.write
        if url == b"/health":
            write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            return
        if url == b"/rollouts":
            key = b'{"key":"floor"}'
            write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                  + str(len(key)).encode() + b"\r\n\r\n" + key)
            return
        resp = await self.relay.call(url, body)
        async with resp:
            kind = resp.headers.get("content-type", "application/json")
            write(f"HTTP/1.1 {resp.status} OK\r\ncontent-type: {kind}\r\n"
                  "transfer-encoding: chunked\r\n\r\n".encode())
            while piece := await resp.readany():
                write(b"%x\r\n%s\r\n" % (len(piece), piece))
            write(b"0\r\n\r\n")


class Relay:
    def __init__(self, engine_url: str) -> None:
        self.engine = engine_url.rstrip("/") + "/v1/chat/completions"
        self.client = Client()

    async def call(self, url: bytes, body: bytes) -> Response:
        """The engine's answer to the fixed request, streamed if the caller's was."""
        stream = b'"stream": true' in body or b'"stream":true' in body or b"stream" in url
        payload = json.dumps({**REQUEST, "stream": stream}).encode()
        return await self.client.request("POST", self.engine, payload)

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The same relay as a bare ASGI app."""
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        path = scope["path"].encode()
        if path in (b"/health", b"/rollouts"):
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"key":"floor"}'})
            return
        async with await self.call(path, body) as resp:
            kind = resp.headers.get("content-type", "application/json").encode()
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(b"content-type", kind)]})
            while piece := await resp.readany():
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class Pipe(asyncio.Protocol):
    """One side of a TCP relay: what it receives is written to `peer` (set once both
    connections are up; bytes that come earlier wait in `early`)."""

    def __init__(self, peer: asyncio.Transport | None = None) -> None:
        self.peer = peer
        self.early: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.early.append(data)
        else:
            self.peer.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()


class Dialer(Pipe):
    """The client's side: dials the engine when the client connects."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__()
        self.engine = (host, port)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._dial())

    async def _dial(self) -> None:
        loop = asyncio.get_running_loop()
        up, _ = await loop.create_connection(lambda: Pipe(self.transport), *self.engine)
        self.peer = up
        for data in self.early:
            up.write(data)
        self.early.clear()


async def serve(port: int, engine_url: str, kind: str) -> None:
    loop = asyncio.get_running_loop()
    if kind == "tcp":
        host, _, engine_port = engine_url.split("//", 1)[-1].rstrip("/").partition(":")
        tcp = await loop.create_server(lambda: Dialer(host, int(engine_port)),
                                       "127.0.0.1", port)
        print(f"READY {port}", flush=True)
        async with tcp:
            await tcp.serve_forever()
        return
    relay = Relay(engine_url)
    if kind == "uvicorn":
        # Kept alive as long as the proxy keeps its connections (proxy/serve.py): at
        # uvicorn's default 5 s, a connection idle while the other sides ran was closed as
        # the bench reused it ("Cannot write to closing transport").
        config = uvicorn.Config(relay.asgi, host="127.0.0.1", port=port, log_level="warning",
                                http="httptools", loop="none", lifespan="off",
                                interface="asgi3", timeout_keep_alive=75)
        await uvicorn.Server(config).serve()
        return
    server = await loop.create_server(lambda: Downstream(relay), "127.0.0.1", port)
    print(f"READY {port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description="A relay that copies bytes: the floor.")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--engine-url", required=True)
    ap.add_argument("--server", choices=["raw", "uvicorn", "tcp"], default="raw")
    args = ap.parse_args()
    uvloop.run(serve(args.port, args.engine_url, args.server))


if __name__ == "__main__":
    main()
