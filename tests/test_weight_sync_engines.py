"""Weight sync to several vLLM servers (issues 17, 38): every server reloads and confirms
the new version before the proxy's engines are told, the reloads run at once, and a server
that fails is taken out of routing (the run goes on unless none is left). The servers are
scripted stand-ins for vLLM's dev-mode weight routes (named as such), each a real HTTP
server on loopback."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from harnessrl.proxy.serve import in_thread
from harnessrl.train.weights import VLLMWeightSync, WeightSyncError


class Stamp:
    """The proxy's engine as the sync sees it: the version it stamps on every turn."""

    def __init__(self) -> None:
        self.weight_version: str | None = "step-0"


def scripted_vllm(name: str, log: list[tuple[str, str, object]], engine: Stamp,
                  *, refuses_version: bool = False, reload_seconds: float = 0.0,
                  fails_reload: bool = False) -> Starlette:
    """vLLM's weight routes: records (server, route, what the proxy's engine stamped at that
    moment); `refuses_version`: keeps reporting its old version; `reload_seconds`: a reload
    takes that long; `fails_reload`: a reload answers HTTP 500."""
    version = {"v": "step-0"}

    async def post(request: Request) -> JSONResponse:
        body = await request.body()
        payload = json.loads(body) if body and body != b"null" else None
        log.append((name, request.url.path, engine.weight_version))
        if request.url.path == "/collective_rpc":
            await asyncio.sleep(reload_seconds)
            if fails_reload:
                return JSONResponse({"error": "reload failed (scripted)"}, status_code=500)
        if request.url.path == "/update_weight_version" and payload and not refuses_version:
            version["v"] = payload["new_version"]
        return JSONResponse({})

    async def info(_request: Request) -> JSONResponse:
        return JSONResponse({"weight_version": version["v"]})

    return Starlette(routes=[Route(p, post, methods=["POST"]) for p in (
        "/collective_rpc", "/reset_prefix_cache", "/update_weight_version")]
        + [Route("/weight_info", info)])


class Model:
    config = SimpleNamespace(tie_word_embeddings=False)

    def save_pretrained(self, path: Path, safe_serialization: bool) -> None:
        path.joinpath("model.safetensors").write_bytes(b"weights")


def test_every_engine_has_the_weights_before_the_version_is_announced(tmp_path: Path) -> None:
    log: list[tuple[str, str, object]] = []
    engine = Stamp()
    with in_thread(scripted_vllm("a", log, engine)) as (url_a, _), \
            in_thread(scripted_vllm("b", log, engine)) as (url_b, _):
        sync = VLLMWeightSync(url_a, tmp_path / "w", engines=[engine], more_urls=[url_b])
        sync.push(Model(), "step-1")
        assert sync.served_version(url_a) == sync.served_version(url_b) == "step-1"
    routes = [(server, route) for server, route, _ in log]
    for server in ("a", "b"):
        assert [r for s, r in routes if s == server] == [
            "/collective_rpc", "/reset_prefix_cache", "/update_weight_version"]
    # Nothing was stamped step-1 while any server was still being told.
    assert all(stamped == "step-0" for *_, stamped in log)
    assert engine.weight_version == "step-1"


def test_a_server_that_does_not_take_the_version_is_taken_out_of_routing(tmp_path: Path
                                                                        ) -> None:
    log: list[tuple[str, str, object]] = []
    engine = Routed()
    with in_thread(scripted_vllm("a", log, engine)) as (url_a, _), \
            in_thread(scripted_vllm("b", log, engine, refuses_version=True)) as (url_b, _):
        sync = VLLMWeightSync(url_a, tmp_path / "w", engines=[engine], more_urls=[url_b])
        sync.push(Model(), "step-1")
        # b still says step-0 with the new weights: out of routing, never stamped
        assert sync.urls == [url_a] and "step-0" in sync.retired[url_b]
        assert engine.retired == [url_b] and engine.weight_version == "step-1"
        sync.push(Model(), "step-2")  # b is left out of later swaps
    # reloads run at once, so their order in the log is either
    assert sorted(s for s, r, _ in log if r == "/collective_rpc") == ["a", "a", "b"]


def test_reloads_run_at_once_and_a_failing_server_is_taken_out(tmp_path: Path) -> None:
    log: list[tuple[str, str, object]] = []
    engine = Routed()
    with in_thread(scripted_vllm("a", log, engine, reload_seconds=0.6)) as (url_a, _), \
            in_thread(scripted_vllm("b", log, engine, reload_seconds=0.6)) as (url_b, _), \
            in_thread(scripted_vllm("c", log, engine, fails_reload=True)) as (url_c, _):
        sync = VLLMWeightSync(url_a, tmp_path / "w", engines=[engine],
                              more_urls=[url_b, url_c])
        sync.push(Model(), "step-1")
        a, b, c = sync.reloads
        # the two reloads overlap in time: each started before the other ended
        assert a.error is None and b.error is None
        assert a.started < b.ended and b.started < a.ended
        assert c.error is not None and "HTTP 500" in c.error
        assert sync.urls == [url_a, url_b] and engine.retired == [url_c]
        assert engine.weight_version == "step-1"
        assert sync.served_version(url_c) == "step-0"  # never named the new version


def test_no_server_left_ends_the_run_naming_each(tmp_path: Path) -> None:
    log: list[tuple[str, str, object]] = []
    engine = Routed()
    with in_thread(scripted_vllm("a", log, engine, fails_reload=True)) as (url_a, _), \
            in_thread(scripted_vllm("b", log, engine, fails_reload=True)) as (url_b, _):
        sync = VLLMWeightSync(url_a, tmp_path / "w", engines=[engine], more_urls=[url_b])
        with pytest.raises(WeightSyncError, match="failed on every vLLM server") as raised:
            sync.push(Model(), "step-1")
    assert url_a in str(raised.value) and url_b in str(raised.value)
    assert engine.weight_version == "step-0"  # nothing was named


class Routed(Stamp):
    """A routing engine as the sync sees it: it also takes servers out of routing."""

    def __init__(self) -> None:
        super().__init__()
        self.retired: list[str] = []

    def retire_server(self, url: str) -> None:
        self.retired.append(url)


def test_the_router_sends_no_call_to_a_retired_server() -> None:
    from harnessrl.proxy.engines.routed import RoutedEngine
    from harnessrl.proxy.engines.vllm import VLLMEngine

    router = RoutedEngine([VLLMEngine("http://127.0.0.1:1/v1"), VLLMEngine("http://127.0.0.1:2")])
    keys = [f"rollout-{n}" for n in range(40)]
    assert {router.route(k) for k in keys} == {0, 1}
    assert router.retire_server("http://127.0.0.1:2/v1") and not router.retire_server("x")
    assert {router.route(k) for k in keys} == {0}
    router.healthy = [False, True]  # a health check finding it up does not bring it back
    assert {router.route(k) for k in keys} == {0}
