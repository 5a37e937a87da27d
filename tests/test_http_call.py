"""The project's one HTTP client for control calls (`http/call.py`) and the
blocking callers moved onto it from the standard library's urllib (the weight sync, the
remote weight gate, vLLM's start-up wait, a Ray node's reach check), against Python's own
http.server on loopback (HTTP/1.0 answers, bodies ended by closing the connection)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harnessrl.http.call import call, fetch, refused
from harnessrl.http.client import TransportError
from harnessrl.proxy.engines.vllm_server import VLLMServer, free_port
from harnessrl.rollout.cluster.node import _unreachable
from harnessrl.train.async_grpo.transfer import RemoteGate
from harnessrl.train.weights import VLLMWeightSync, WeightSyncError


class Handler(BaseHTTPRequestHandler):
    """/echo answers the method, body and Authorization it got; /status/N answers N with a
    word; /silent answers after 5 s; /weight_info names a version."""

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append((self.command, self.path, body))  # type: ignore[attr-defined]
        if status := re.match(r"/status/(\d+)", self.path):
            return self._send(int(status.group(1)), b"said so")
        if self.path == "/silent":
            time.sleep(5)
        if self.path == "/weight_info":
            return self._send(200, b'{"weight_version": "v7"}')
        self._send(200, json.dumps({"method": self.command, "body": body.decode(),
                                    "auth": self.headers.get("Authorization")}).encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.end_headers()  # no Content-Length: the body ends when the connection closes
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, list]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}", httpd.seen  # type: ignore[attr-defined]
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_call_sends_json_and_reads_the_whole_answer(server) -> None:
    url, _seen = server
    reply = call("POST", f"{url}/echo", {"a": [1, 2]}, headers=[("Authorization", "Bearer k")])
    assert reply.ok and reply.json() == {"method": "POST", "body": '{"a":[1,2]}',
                                         "auth": "Bearer k"}
    missing = call("GET", f"{url}/status/404")
    assert (missing.status, missing.ok, missing.text()) == (404, False, "said so")


def test_a_call_from_a_thread_that_runs_an_event_loop(server) -> None:
    url, _seen = server

    async def inside() -> tuple[int, int]:
        blocking = call("GET", f"{url}/echo")  # asyncio.run cannot nest: a thread of its own
        awaited = await fetch("GET", f"{url}/echo")
        return blocking.status, awaited.status

    assert asyncio.run(inside()) == (200, 200)


def test_nothing_listening_is_refused_and_silence_times_out(server) -> None:
    url, _seen = server
    for host in ("127.0.0.1", "localhost"):
        with pytest.raises(TransportError) as caught:
            call("GET", f"http://{host}:{free_port()}/x", timeout=2)
        assert refused(caught.value), caught.value
    # a name with several addresses (localhost: ::1 and 127.0.0.1 where both are set up)
    # all refusing: asyncio raises one OSError naming each failure
    both = ("Multiple exceptions: [Errno 111] Connect call failed ('::1', 9, 0, 0), "
            "[Errno 111] Connect call failed ('127.0.0.1', 9)")
    mixed = both.replace("[Errno 111] Connect call failed ('::1'", "[Errno 99] No ('::1'")
    for message, expected in ((both, True), (mixed, False)):
        error = TransportError("cannot connect")
        error.__cause__ = OSError(message)
        assert refused(error) is expected
    started = time.monotonic()
    with pytest.raises(TimeoutError) as late:
        call("GET", f"{url}/silent", timeout=0.3)
    assert not refused(late.value) and time.monotonic() - started < 3
    with pytest.raises(ValueError, match="not an http"):
        call("GET", "ftp://127.0.0.1/x")


def test_the_weight_sync_says_why_a_call_failed(server, tmp_path: Path) -> None:
    url, seen = server
    sync = VLLMWeightSync(url, tmp_path, timeout=5)
    assert sync.served_version() == "v7"
    sync.name("v8")
    assert seen[-1] == ("POST", "/update_weight_version", b'{"new_version":"v8"}')
    with pytest.raises(WeightSyncError, match=r"HTTP 404.*VLLM_SERVER_DEV_MODE"):
        sync._post("/status/404", None)
    gone = VLLMWeightSync(f"http://127.0.0.1:{free_port()}", tmp_path, timeout=5)
    with pytest.raises(WeightSyncError, match=r"GET /weight_info: vLLM at .* is unreachable"):
        gone.served_version()


def test_the_remote_gate_skips_a_proxy_not_yet_serving_and_names_a_refusal(
        server, tmp_path: Path) -> None:
    url, seen = server
    sync = VLLMWeightSync(url, tmp_path, timeout=5)
    RemoteGate(url, sync, admin_token="t").hold(30)
    assert seen[-1][:2] == ("POST", "/weights/hold") and json.loads(seen[-1][2]) == {
        "timeout": 30}
    RemoteGate(f"http://localhost:{free_port()}", sync).hold(30)  # not serving: no call held
    with pytest.raises(WeightSyncError, match="HTTP 500: said so"):
        RemoteGate(f"{url}/status/500", sync)._send("", {})


def test_the_reach_check_and_the_start_up_wait(server, tmp_path: Path) -> None:
    url, _seen = server
    assert _unreachable(url) is None
    assert _unreachable(f"{url}/status/401") is None  # asks for a key: it is there
    assert _unreachable(f"{url}/status/404") == "HTTP 404"
    assert _unreachable(f"http://127.0.0.1:{free_port()}").startswith("TransportError: ")
    host, port = url.removeprefix("http://").split(":")
    ready = VLLMServer("m", host=host, port=int(port), startup_timeout=5)
    ready.wait_healthy()  # /health answers 200
