"""`harnessrl serve --workers 2` as real processes on loopback, with the scripted engine:
rollouts made through the shared port are served whichever worker takes the connection
(relayed to their owner byte for byte when it is the other one), every turn is stored once
with consecutive indices, the weight gate holds both workers, and a killed worker answers
a clear 503 until it is restarted, losing nothing that was recorded."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import httpx2
import openai
import psutil
import pytest

from harnessrl.proxy.engines.vllm_server import free_port
from harnessrl.proxy.workers import owner
from harnessrl.store.reader import TraceReader
from harnessrl.types import Text

REPLIES = ["alpha beta gamma", "delta epsilon", "zeta eta theta iota"]


@dataclass
class Served:
    process: subprocess.Popen
    url: str
    private: list[int]
    run_dir: Path

    def worker_pid(self, index: int) -> int:
        for child in psutil.Process(self.process.pid).children():
            with contextlib.suppress(psutil.Error):
                if any(c.laddr.port == self.private[index] and c.status == "LISTEN"
                       for c in child.net_connections("tcp")):
                    return child.pid
        raise LookupError(f"no process listens on worker {index}'s port")


def wait_up(url: str, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not come up")


@contextlib.contextmanager
def serve_workers(tmp_path: Path, tiny_model: Path) -> Iterator[Served]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(REPLIES))
    port = free_port()
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "harnessrl.cli", "serve", "--workers", "2", "--scripted",
         str(tiny_model), "--script", str(script), "--run-dir", str(run_dir),
         "--port", str(port)], stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        lines = [process.stderr.readline() for _ in range(1)]
        while not (found := re.search(r"their own ports (\d+), (\d+)", lines[-1])):
            assert lines[-1] and len(lines) < 50, "".join(lines)
            lines.append(process.stderr.readline())
        # the rest of stderr drained, so a chatty worker cannot block on a full pipe
        threading.Thread(target=process.stderr.read, daemon=True).start()
        served = Served(process, f"http://127.0.0.1:{port}",
                        [int(found.group(1)), int(found.group(2))], run_dir)
        for p in served.private:
            wait_up(f"http://127.0.0.1:{p}")
        wait_up(served.url)
        yield served
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(60) == 128 + signal.SIGTERM
        finally:
            process.kill()


def new_rollouts(served: Served, want_each: int) -> dict[int, list[dict]]:
    """Rollouts made through the shared port (a new connection each) until both workers
    own `want_each`."""
    by_owner: dict[int, list[dict]] = {0: [], 1: []}
    for _ in range(200):
        if all(len(v) >= want_each for v in by_owner.values()):
            return by_owner
        made = httpx.post(f"{served.url}/rollouts", json={}).json()
        worker = owner(made["key"], 2)
        # its base URL is its owner's own port
        assert made["base_url"] == f"http://127.0.0.1:{served.private[worker]}/r/{made['key']}"
        by_owner[worker].append(made)
    raise AssertionError(f"the shared port reached only some workers: {by_owner.keys()}")


def talk(base: str, key: str, http: httpx2.Client) -> list[str]:
    """Six model calls, streamed and not, in three dialects; the texts the client got."""
    chat = openai.OpenAI(base_url=f"{base}/r/{key}/v1", api_key=key, max_retries=0,
                         http_client=http)
    texts = [chat.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "one"}]).choices[0].message.content]
    stream = chat.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "two"}], stream=True)
    texts.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
    texts.append(chat.responses.create(model="m", input="three").output_text)
    events = chat.responses.create(model="m", input="four", stream=True)
    texts.append("".join(e.delta for e in events if e.type == "response.output_text.delta"))
    claude = anthropic.Anthropic(base_url=f"{base}/r/{key}", api_key=key, max_retries=0,
                                 http_client=http)
    reply = claude.messages.create(model="m", max_tokens=64,
                                   messages=[{"role": "user", "content": "five"}])
    texts.append("".join(b.text for b in reply.content if b.type == "text"))
    with claude.messages.stream(model="m", max_tokens=64,
                                messages=[{"role": "user", "content": "six"}]) as events:
        texts.append("".join(events.text_stream))
    return [t or "" for t in texts]


def stored_texts(run_dir: Path, key: str) -> tuple[list[int], list[str]]:
    with TraceReader(run_dir) as reader:
        turns = reader.turns(key)
    assert all(t.status == "ok" for t in turns), [
        (t.index, t.dialect, t.status, t.error, t.raw_response[-80:]) for t in turns]
    return [t.index for t in turns], ["".join(p.text for p in t.completion.parts
                                              if isinstance(p, Text)) if t.completion else ""
                                      for t in turns]


@pytest.mark.slow
def test_two_workers_serve_every_rollout_whichever_takes_the_call(tmp_path, tiny_model):
    with serve_workers(tmp_path, tiny_model) as served:
        rollouts = new_rollouts(served, 3)
        everyone = [r for rs in rollouts.values() for r in rs]
        got: dict[str, list[str]] = {}
        # one connection pool on the shared port: the calls of one worker's rollouts are
        # served where they land, the other's relayed to their owner
        with httpx2.Client(timeout=60) as shared:
            for made in everyone:
                got[made["key"]] = talk(served.url, made["key"], shared)
        with httpx2.Client(timeout=60) as direct:  # and at the owner's own port
            for made in everyone[:2]:
                got[made["key"]] += talk(made["base_url"].rsplit("/r/", 1)[0], made["key"],
                                         direct)
        for key, texts in got.items():
            indices, stored = stored_texts(served.run_dir, key)
            assert indices == list(range(len(texts)))  # each turn once, in order
            assert stored == texts and all(texts)
        with TraceReader(served.run_dir) as reader:
            assert reader.count_turns() == sum(map(len, got.values()))
            assert reader.integrity_check() == "ok"

        # every worker answers for a rollout of either: reads and closing
        for made in everyone:
            page = httpx.get(f"{served.url}/rollouts/{made['key']}").json()
            assert len(page["turns"]) == len(got[made["key"]])
        for made in (rollouts[0][0], rollouts[1][0]):
            assert httpx.delete(f"{served.url}/rollouts/{made['key']}").status_code == 200
            closed = openai.OpenAI(base_url=made["base_url"] + "/v1", api_key=made["key"],
                                   max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                closed.chat.completions.create(model="m", messages=[{"role": "user",
                                                                     "content": "x"}])


def call_in_thread(base_url: str, key: str, done: list[str]) -> threading.Thread:
    def work() -> None:
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)
        done.append(client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "held"}]).choices[0]
            .message.content or "")
    thread = threading.Thread(target=work)
    thread.start()
    return thread


@pytest.mark.slow
def test_the_weight_gate_holds_every_worker(tmp_path, tiny_model):
    with serve_workers(tmp_path, tiny_model) as served:
        rollouts = new_rollouts(served, 1)
        held = httpx.post(f"{served.url}/weights/hold", json={"timeout": 30}, timeout=60)
        assert held.json() == {"held": True, "waiting": 0, "workers": 2}
        done: list[str] = []
        threads = [call_in_thread(rs[0]["base_url"], rs[0]["key"], done)
                   for rs in rollouts.values()]
        time.sleep(1.0)
        assert done == []  # held on both workers
        released = httpx.post(f"{served.url}/weights/release", json={"version": "v7"})
        assert released.json() == {"held": False, "weight_version": "v7", "workers": 2}
        for thread in threads:
            thread.join(60)
        assert len(done) == 2
        with TraceReader(served.run_dir) as reader:
            assert [t.weight_version for rs in rollouts.values()
                    for t in reader.turns(rs[0]["key"])] == ["v7", "v7"]


@pytest.mark.slow
def test_a_killed_worker_answers_503_then_resumes_from_the_store(tmp_path, tiny_model):
    with serve_workers(tmp_path, tiny_model) as served:
        rollouts = new_rollouts(served, 1)
        keys = {w: rs[0]["key"] for w, rs in rollouts.items()}
        before = {w: talk(served.url, key, httpx2.Client(timeout=60)) for w, key in keys.items()}
        os.kill(served.worker_pid(1), signal.SIGKILL)
        time.sleep(0.3)  # the kernel closed its sockets; the parent restarts it after 1 s

        # a call for its rollout, through the shared port (a new connection: the live
        # worker takes it), fails clearly; the other worker's rollouts go on
        lost = openai.OpenAI(base_url=f"{served.url}/r/{keys[1]}/v1", api_key=keys[1],
                             max_retries=0)
        with pytest.raises(openai.APIStatusError) as failed:
            lost.chat.completions.create(model="m", messages=[{"role": "user", "content": "?"}])
        assert failed.value.status_code == 503
        assert "proxy worker 1 of 2" in failed.value.message
        after_0 = talk(served.url, keys[0], httpx2.Client(timeout=60))
        # the shared port is not healthy while a worker is missing
        assert httpx.get(f"{served.url}/health").status_code == 503

        wait_up(f"http://127.0.0.1:{served.private[1]}")
        after_1 = talk(served.url, keys[1], httpx2.Client(timeout=60))
        for worker, later in ((0, after_0), (1, after_1)):
            indices, stored = stored_texts(served.run_dir, keys[worker])
            assert stored == before[worker] + later  # nothing recorded was lost
            assert indices == list(range(len(stored)))
        with TraceReader(served.run_dir) as reader:
            assert reader.integrity_check() == "ok"


# ------------------------------------------------------------------ pure parts
def test_a_worker_makes_only_keys_it_owns_and_every_worker_agrees():
    from harnessrl.proxy.workers import owned_key

    for index in range(3):
        keys = [owned_key(index, 3) for _ in range(20)]
        assert {owner(k, 3) for k in keys} == {index}
        assert all(k.startswith("hrl-") and len(k) == 36 for k in keys)
    assert {owner(f"hrl-{n}", 2) for n in range(50)} == {0, 1}


def test_the_host_header_gets_the_workers_own_port():
    from harnessrl.proxy.relay import _hostport, _with_port

    headers = [(b"host", b"127.0.0.1:8100"), (b"x-api-key", b"k")]
    assert _with_port(headers, 4242) == [(b"host", b"127.0.0.1:4242"), (b"x-api-key", b"k")]
    assert _with_port([(b"host", b"[::1]:8100")], 9) == [(b"host", b"[::1]:9")]
    assert _with_port([(b"host", b"proxy.local")], 9) == [(b"host", b"proxy.local:9")]
    assert _hostport("0.0.0.0", 5) == "127.0.0.1:5" and _hostport("::1", 5) == "[::1]:5"


async def call_front(front, path: str, messages: list[dict],
                     headers: tuple[tuple[bytes, bytes], ...] = ()) -> list[dict]:
    """One POST through a worker's front, its body sent as `messages`; what it sent back."""
    import asyncio

    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [(b"content-type", b"application/json"),
                                              *headers],
             "server": ("127.0.0.1", 1), "root_path": ""}
    sent: list[dict] = []
    bodies = iter(messages)

    async def receive():  # the body, then (as a server does) nothing until the end
        if (message := next(bodies, None)) is not None:
            return message
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)
    await front(scope, receive, send)
    await front.close()
    return sent


def test_a_worker_serves_its_own_rollouts_and_relays_the_others():
    """The front's shortcut for /r/<key> paths: a key this worker owns (or one no worker
    makes) reaches the proxy's app here; another worker's is relayed, and that worker not
    answering is a 503 in the caller's shape, never served here."""
    import asyncio

    from harnessrl.proxy.relay import Front
    from harnessrl.proxy.workers import Plan, owned_key

    served: list[str] = []

    async def app(scope, receive, send):
        served.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    def call(front: Front, path: str) -> int:
        body = [{"type": "http.request", "body": b"{}", "more_body": False}]
        return asyncio.run(call_front(front, path, body))[0]["status"]

    plan = Plan("127.0.0.1", 1, (free_port(), free_port()))  # nothing listens on either
    front = Front(app, plan, 0, 1 << 20)
    mine, theirs = owned_key(0, 2), owned_key(1, 2)
    for key, status in ((mine, 200), ("not-a-rollout-key", 200), (theirs, 503)):
        for path in (f"/r/{key}/v1/chat/completions", f"/r/{key}/v1/messages"):
            assert call(front, path) == status
    assert served == [f"/r/{k}/v1/{p}" for k in (mine, "not-a-rollout-key")
                      for p in ("chat/completions", "messages")]


def test_a_relayed_body_over_the_limit_is_refused_in_the_callers_shape():
    """The relay reads a body as the app does (`boundary.receive_body`): a Content-Length
    over the limit is refused before any of it is read, a body that grows past it once it
    does, both a 413 in the caller's dialect; a client gone mid-body gets no answer."""
    import asyncio

    from harnessrl.proxy.relay import Front
    from harnessrl.proxy.workers import Plan, owned_key

    plan = Plan("127.0.0.1", 1, (free_port(), free_port()))
    front = Front(lambda *_: None, plan, 0, 100)
    path = f"/r/{owned_key(1, 2)}/v1/messages"  # the other worker's: relayed
    piece = {"type": "http.request", "body": b"x" * 60, "more_body": True}
    for messages, headers in (([], ((b"content-length", b"101"),)), ([piece, piece], ())):
        sent = asyncio.run(call_front(front, path, messages, headers))
        assert sent[0]["status"] == 413
        error = json.loads(sent[1]["body"])
        assert error["type"] == "error" and "100" in error["error"]["message"], error
    gone = [piece, {"type": "http.disconnect"}]
    assert asyncio.run(call_front(front, path, gone)) == []
