"""Several engines behind one shard (proxy/engines/routed.py), without Ray: stable
routing by rollout key, health checks, failover. The engines are the scripted engine
(named as such), one of them down while its stop flag is set."""

from __future__ import annotations

import pytest

from harnessrl.errors import EngineUnavailable
from harnessrl.proxy.engines.routed import RoutedEngine, rank
from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.types import ChatRequest, Message, Started, Text


class Switch(ScriptedEngine):
    """The scripted engine; calls and health checks fail while `down` is set."""

    down = False

    def _check(self) -> None:
        if self.down:
            raise EngineUnavailable(f"{self.model} is down (test)")

    async def models(self) -> list[str]:
        self._check()
        return await super().models()

    async def _events(self, request, *, one_chunk):
        self._check()
        async for event in super()._events(request, one_chunk=one_chunk):
            yield event


def test_a_key_keeps_its_engine_and_losing_one_moves_only_its_keys() -> None:
    keys = [f"hrl-{n}" for n in range(400)]
    first = {k: rank(k, 3)[0] for k in keys}
    assert first == {k: rank(k, 3)[0] for k in keys}  # stable
    assert set(first.values()) == {0, 1, 2}  # spread over every engine
    # With engine 2 gone, a key on 0 or 1 stays; a key on 2 moves to its second choice.
    for key in keys:
        order = rank(key, 3)
        survivor = next(i for i in order if i != 2)
        assert survivor == (first[key] if first[key] != 2 else order[1])


@pytest.fixture
def engines(tokenizer):
    return [Switch(tokenizer, replay(["hi"]), model=f"engine-{n}") for n in range(2)]


REQUEST = ChatRequest(model="m", messages=(Message("user", (Text("hello"),)),))


async def test_a_down_engine_fails_the_call_and_its_rollouts_move(engines) -> None:
    routed = RoutedEngine(engines, health_interval=60)
    await routed.start()
    try:
        key = next(f"hrl-{n}" for n in range(100) if rank(f"hrl-{n}", 2)[0] == 0)
        [started, *_] = await routed.complete(REQUEST, key)
        assert isinstance(started, Started) and started.model == "engine-0"
        engines[0].down = True
        with pytest.raises(EngineUnavailable):  # the call in flight fails, said so
            await routed.complete(REQUEST, key)
        [started, *_] = await routed.complete(REQUEST, key)  # the retry: the other engine
        assert started.model == "engine-1" and routed.healthy == [False, True]
        engines[0].down = False
        assert await routed.check_health() == [True, True]  # back once it answers again
        events = [e async for e in routed.stream(REQUEST, key)]
        assert events[0].model == "engine-0"
    finally:
        await routed.close()


async def test_the_version_is_every_engines_or_none(engines) -> None:
    routed = RoutedEngine(engines)
    await routed.start()
    try:
        assert routed.weight_version == "scripted"
        routed.weight_version = "step-3"
        assert [e.weight_version for e in engines] == ["step-3", "step-3"]
        assert routed.weight_version == "step-3"
    finally:
        await routed.close()


def test_one_spec_with_several_urls_builds_the_router_serve_and_run_use() -> None:
    """`serve`/`run --engine-url A,B` and `train`'s several servers: one EngineSettings naming
    several URLs is one RoutedEngine with an engine per URL; one URL is that engine."""
    from harnessrl.cli import build_parser
    from harnessrl.cli.serve import engine_spec
    from harnessrl.proxy.engines.build import EngineSettings, make

    args = build_parser().parse_args(["serve", "--engine-url",
                                      "http://127.0.0.1:9/v1,http://127.0.0.1:10"])
    engine = make(engine_spec(args))
    assert isinstance(engine, RoutedEngine)
    assert [e.base_url for e in engine.engines] == ["http://127.0.0.1:9",  # type: ignore[attr-defined]
                                                    "http://127.0.0.1:10"]
    engine.weight_version = "v2"  # set as on any engine: each routed one serves it
    assert [e.weight_version for e in engine.engines] == ["v2", "v2"]
    assert not isinstance(make(EngineSettings(url="http://127.0.0.1:9")), RoutedEngine)
