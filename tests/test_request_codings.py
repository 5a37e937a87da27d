"""Compressed request bodies through the proxy, against the scripted engine: each dialect,
streamed and not, with each coding, sent by the official SDK (none of them compresses
on its own, so an httpx transport under it codes the body the SDK wrote, as Codex and pi
code theirs). Each call answers 200, its turn has the ids an uncoded call gets, and the
raw request reads back byte for byte as sent, with its coding. A decompression bomb, a
damaged body and an unknown coding are refused in the dialect's shape and recorded, and
the proxy serves the next call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
import zstandard
from google import genai
from google.genai import types as genai_types

from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.proxy.wire import codings
from tests.dialects import IDS, WIRE, WireDialect
from tests.helpers import ServedProxy, make_proxy
from tests.test_codings import encode

REPLY = "Hello from a coded request."
# Each as a header names it; deflate both zlib-wrapped and raw; a stack in the order sent.
STACKS = {"zstd": ["zstd"], "gzip": ["gzip"], "deflate": ["deflate"],
          "deflate-raw": ["deflate-raw"], "br": ["br"], "gzip,zstd": ["gzip", "zstd"],
          "br,deflate": ["br", "deflate"]}


def coding(stack: list[str], http: Any = httpx) -> Any:
    """A transport of `http` (httpx, or the anthropic SDK's httpx2) that codes every
    request body with `stack` and says so in Content-Encoding; `.sent` keeps (plain,
    coded, header) of each."""

    class Coding(http.BaseTransport):
        def __init__(self) -> None:
            self.inner = http.HTTPTransport()
            self.sent: list[tuple[bytes, bytes, str | None]] = []

        def handle_request(self, request: Any) -> Any:
            plain = request.read()
            coded, names = encode(plain, stack)
            header = ", ".join(names) or None
            headers = http.Headers(request.headers)
            if header is not None:
                headers["content-encoding"] = header
            headers["content-length"] = str(len(coded))
            self.sent.append((plain, coded, header))
            return self.inner.handle_request(http.Request(
                request.method, request.url, headers=headers, content=coded,
                extensions=request.extensions))

        def close(self) -> None:
            self.inner.close()

    return Coding()


def sdk_call(name: str, served: Any, key: str, stream: bool, stack: list[str]
             ) -> tuple[str, list[tuple[bytes, bytes, str | None]]]:
    """The reply's text through dialect `name`'s official SDK, each request body coded
    with `stack`; and what was sent."""
    module = httpx2 if name == "anthropic" else httpx
    transport = coding(stack, module)
    return _sdk_call(name, served, key, stream,
                     module.Client(transport=transport, timeout=30)), transport.sent


def _sdk_call(name: str, served: Any, key: str, stream: bool, http: Any) -> str:
    root = f"{served.url}/r/{key}"
    if name == "openai_chat":
        client = openai.OpenAI(base_url=f"{root}/v1", api_key=key, max_retries=0, http_client=http)
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=stream)
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
        return reply.choices[0].message.content or ""
    if name == "openai_responses":
        client = openai.OpenAI(base_url=f"{root}/v1", api_key=key, max_retries=0, http_client=http)
        if stream:
            events = list(client.responses.create(model="m", input="hi", stream=True))
            return "".join(e.delta for e in events if e.type == "response.output_text.delta")
        return client.responses.create(model="m", input="hi").output_text
    if name == "anthropic":
        client = anthropic.Anthropic(base_url=root, api_key=key, max_retries=0, http_client=http)
        if stream:
            with client.messages.stream(model="m", max_tokens=64,
                                        messages=[{"role": "user", "content": "hi"}]) as s:
                return "".join(s.text_stream)
        message = client.messages.create(model="m", max_tokens=64,
                                         messages=[{"role": "user", "content": "hi"}])
        return "".join(b.text for b in message.content if b.type == "text")
    client = genai.Client(api_key=key, http_options=genai_types.HttpOptions(
        base_url=root, httpx_client=http, retry_options=genai_types.HttpRetryOptions(attempts=1)))
    if stream:
        return "".join(c.text or "" for c in client.models.generate_content_stream(
            model="gemini-x", contents="hi"))
    return client.models.generate_content(model="gemini-x", contents="hi").text or ""


@pytest.fixture(scope="module")
def served(tokenizer, tmp_path_factory):
    engine = ScriptedEngine(tokenizer, replay([REPLY]), model="scripted")
    with ServedProxy(make_proxy(engine, tmp_path_factory.mktemp("codings"))).running() as s:
        yield s


def _ids(turn) -> tuple:
    tokens = turn.completion.tokens
    return tokens.prompt_ids, tokens.completion_ids


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_every_coding_through_the_sdk(served, dialect: WireDialect, stream: bool) -> None:
    plain_key = served.new_rollout()["key"]
    assert sdk_call(dialect.name, served, plain_key, stream, [])[0] == REPLY
    [plain] = served.store.turns(plain_key)
    assert plain.content_encoding is None
    for label, stack in STACKS.items():
        key = served.new_rollout()["key"]
        reply, sent = sdk_call(dialect.name, served, key, stream, stack)
        assert reply == REPLY, label
        [turn] = served.store.turns(key)
        [(sent_plain, coded, header)] = sent
        assert turn.status == "ok" and turn.dialect == dialect.name, label
        assert turn.raw_request == coded and turn.content_encoding == header, label
        assert codings.undo(turn.raw_request, turn.content_encoding, 1 << 20) == sent_plain
        assert _ids(turn) == _ids(plain), label  # the ids do not depend on the coding
        assert turn.request == plain.request, label


# ------------------------------------------------------------------ refused bodies
@pytest.fixture(scope="module")
def bomb() -> bytes:
    """About 32 KB of zstd that decodes to 1 GiB of zeros."""
    out = zstandard.ZstdCompressor(level=3).compressobj()
    zeros = b"\0" * (1 << 24)
    return b"".join([out.compress(zeros) for _ in range(64)] + [out.flush()])


def _refused(dialect: WireDialect, served: Any, bomb: bytes) -> list[tuple[bytes, str, int, str]]:
    """(body, coding, status, error kind) of each body the proxy must refuse."""
    good = dialect.good_bytes()
    zstd_good = encode(good, ["zstd"])[0]
    return [
        (bomb, "zstd", 413, "too_large"),
        (encode(bomb, ["gzip"])[0], "zstd, gzip", 413, "too_large"),
        (zstd_good[: len(zstd_good) // 2], "zstd", 400, "invalid_request"),  # cut short
        (encode(good, ["gzip"])[0][:-4] + b"\x00\x00\x00\x00", "gzip", 400, "invalid_request"),
        (b"not brotli at all", "br", 400, "invalid_request"),
        (encode(good, ["gzip"])[0], "compress", 415, "invalid_request"),
        (good, "lz4, identity", 415, "invalid_request"),
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_bomb_damage_and_unknown_codings_are_refused_in_shape(
        served, dialect: WireDialect, stream: bool, bomb: bytes) -> None:
    key = served.new_rollout()["key"]
    path, _, params = dialect.streamed(dialect.good, stream)
    url = f"{served.url}/r/{key}{path}"
    cases = _refused(dialect, served, bomb)
    for body, coding, status, _kind in cases:
        resp = httpx.post(url, content=body, params=params, timeout=60, headers={
            "content-type": "application/json", "content-encoding": coding})
        assert resp.status_code == status, (coding, resp.text)
        assert dialect.shape(status, resp.json()), resp.text
    turns = served.store.turns(key)
    assert [(t.status, t.error_kind, t.content_encoding) for t in turns] == [
        ("failed", kind, coding) for _, coding, _, kind in cases]
    assert [t.raw_request for t in turns] == [body for body, *_ in cases]
    # The proxy is unharmed: the same body, coded well, is served.
    coded, names = encode(dialect.good_bytes(stream=stream), ["zstd"])
    resp = httpx.post(url, content=coded, params=params, timeout=30, headers={
        "content-type": "application/json", "content-encoding": ", ".join(names)})
    assert resp.status_code == 200, resp.text
    last = served.store.turns(key)[-1]
    assert last.status == "ok" and last.raw_request == coded


def test_count_tokens_takes_a_coded_body(served) -> None:
    key = served.new_rollout()["key"]
    body = b'{"model":"m","messages":[{"role":"user","content":"count me"}]}'
    plain = httpx.post(f"{served.url}/r/{key}/v1/messages/count_tokens", content=body,
                       timeout=30)
    coded = httpx.post(f"{served.url}/r/{key}/v1/messages/count_tokens",
                       content=encode(body, ["br"])[0], headers={"content-encoding": "br"},
                       timeout=30)
    assert plain.status_code == coded.status_code == 200, coded.text
    assert coded.json() == plain.json()


def test_rollout_options_may_be_coded(served) -> None:
    body = b'{"metadata": {"harness": "coded"}}'
    resp = httpx.post(f"{served.url}/rollouts", content=encode(body, ["gzip"])[0],
                      headers={"content-encoding": "gzip"}, timeout=30)
    assert resp.status_code == 201, resp.text
    assert served.store.rollout(resp.json()["key"]).metadata == {"harness": "coded"}


@pytest.mark.slow
def test_a_relayed_call_keeps_its_coding(tmp_path: Path, tiny_model: Path) -> None:
    """`serve --workers 2`: a coded call for a rollout the other worker owns is relayed
    as received; the owner decodes it and stores the bytes the client sent."""
    from harnessrl.proxy.workers import owner
    from harnessrl.store.reader import TraceReader
    from tests.helpers import serve_workers_cli

    run_dir, script = tmp_path / "run", tmp_path / "script.json"
    script.write_text('["relayed"]')
    args = ["--scripted", str(tiny_model), "--script", str(script)]
    with serve_workers_cli(args, run_dir) as (_url, ports):
        keys = [httpx.post(f"http://127.0.0.1:{p}/rollouts", json={}, timeout=30).json()["key"]
                for p in ports]
        sent = []
        for worker, port in enumerate(ports):
            key = keys[1 - worker]  # owned by the other worker: relayed
            assert owner(key, 2) != worker
            body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
            coded, names = encode(body, ["gzip", "zstd"])
            resp = httpx.post(f"http://127.0.0.1:{port}/r/{key}/v1/chat/completions",
                              content=coded, headers={"content-encoding": ", ".join(names)},
                              timeout=60)
            assert resp.status_code == 200, resp.text
            sent.append((key, coded))
    with TraceReader(run_dir) as reader:
        for key, coded in sent:
            [turn] = reader.turns(key)
            assert turn.status == "ok" and turn.raw_request == coded
            assert turn.content_encoding == "gzip, zstd"
