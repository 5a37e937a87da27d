"""Weight sync to several vLLM servers (issue 17): every server reloads and confirms the
new version before the proxy's engines are told, and a server that fails stops the
announcement. The servers are scripted stand-ins for vLLM's dev-mode weight routes (named
as such), each a real HTTP server on loopback."""

from __future__ import annotations

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
                  *, refuses_version: bool = False) -> Starlette:
    """vLLM's weight routes: records (server, route, what the proxy's engine stamped at that
    moment); `refuses_version`: keeps reporting its old version."""
    version = {"v": "step-0"}

    async def post(request: Request) -> JSONResponse:
        body = await request.body()
        payload = json.loads(body) if body and body != b"null" else None
        log.append((name, request.url.path, engine.weight_version))
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


def test_a_server_that_does_not_take_the_version_stops_the_announcement(tmp_path: Path
                                                                       ) -> None:
    log: list[tuple[str, str, object]] = []
    engine = Stamp()
    with in_thread(scripted_vllm("a", log, engine)) as (url_a, _), \
            in_thread(scripted_vllm("b", log, engine, refuses_version=True)) as (url_b, _):
        sync = VLLMWeightSync(url_a, tmp_path / "w", engines=[engine], more_urls=[url_b])
        with pytest.raises(WeightSyncError, match=f"at {url_b} reports weight version "
                                                  "'step-0'"):
            sync.push(Model(), "step-1")
    # both servers reloaded, so step-0 would be wrong too: no turn claims either version
    assert engine.weight_version is None
    assert ("b", "/collective_rpc") in [(s, r) for s, r, _ in log]
