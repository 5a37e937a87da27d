"""`harnessrl train` with several vLLM servers (issue 17): the config names them
(`engine.urls`) or starts them (`engine.servers`), refused at load when it cannot work;
both trainers' weight sync reaches every server before the new version is stamped (the
async trainer with the proxy's gate held throughout), and a server that fails is an error
naming its URL after which no turn is stamped with a version some server lacks.

The fast tests use scripted stand-ins for vLLM's dev-mode weight routes (named as such),
each a real HTTP server on loopback, and a scripted stand-in for the vLLM process manager;
the slow test trains one GRPO step against two real vLLM servers serving the tiny model."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from harnessrl.proxy.engines.routed import RoutedEngine
from harnessrl.proxy.gate import WeightGate
from harnessrl.proxy.serve import in_thread
from harnessrl.train.config import ConfigError, TrainSettings, load_config
from harnessrl.train.engines import PolicyEngines, policy_engines
from harnessrl.train.weights import WeightSyncError

ROUTES = ("/collective_rpc", "/reset_prefix_cache", "/update_weight_version")


# ------------------------------------------------------------------ the config
def _load(tmp_path: Path, text: str) -> TrainSettings:
    path = tmp_path / "train.toml"
    path.write_text(text)
    return load_config(path)


def test_engine_urls_are_read_and_normalised(tmp_path: Path) -> None:
    config = _load(tmp_path, '[engine]\nurls = ["http://127.0.0.1:8001/v1", '
                             '"http://127.0.0.1:8002/"]\n')
    assert config.engine.roots == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert _load(tmp_path, "[engine]\nservers = 3\n").engine.servers == 3
    assert _load(tmp_path, "").engine.roots == []  # one vLLM started here
    # the file's names for the engine type's fields
    engine = _load(tmp_path, '[engine]\nmode = "token"\nextra_args = ["--x"]\n').engine
    assert (engine.kind, engine.vllm_args) == ("token", ["--x"])


@pytest.mark.parametrize(("engine", "says"), [
    ('url = "http://127.0.0.1:1"\nurls = ["http://127.0.0.1:2"]', "engine.url and engine.urls"),
    ('urls = ["http://127.0.0.1:1", "http://127.0.0.1:1/v1"]', "listed more than once"),
    ('urls = ["127.0.0.1:8000"]', "engine.urls: '127.0.0.1:8000' is not an http"),
    ('urls = ["http://127.0.0.1:port"]', "engine.urls: 'http://127.0.0.1:port' is not a URL"),
    ('url = "ftp://host"', "engine.url: 'ftp://host'"),
    ('servers = 2\nurls = ["http://127.0.0.1:1"]', "engine.servers = 2 starts vLLM servers"),
    ("servers = 0", "engine.servers"),
    # the engine type's command-line fields are no config keys ([model] names the model)
    ('model = "tiny"', "unknown field `model` - at `\\$.engine`"),
    ('kind = "token"', "unknown field `kind`"),
    ('mode = "scripted"', "engine.mode: 'scripted'; chat or token"),
])
def test_bad_engine_sections_are_refused_at_load_naming_the_field(tmp_path: Path, engine: str,
                                                                  says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        _load(tmp_path, f"[engine]\n{engine}\n")


def test_trls_own_vllm_sync_with_several_servers_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="use_vllm: TRL's own vLLM sync reaches one server"):
        _load(tmp_path, '[engine]\nservers = 2\n[grpo]\ntrl = {use_vllm = true}\n')


# ------------------------------------------------------------------ weight routes
class ScriptedVLLM:
    """vLLM's dev-mode weight routes, scripted: records (server, route, the version the
    proxy's engine stamped then, whether the proxy's gate was held then); `fail` names a
    route it answers with HTTP 500."""

    def __init__(self, name: str, log: list[tuple], stamped, gate: WeightGate | None = None,
                 fail: str | None = None) -> None:
        self.name, self.log, self.stamped, self.gate, self.fail = name, log, stamped, gate, fail
        self.version = "v1"

    async def post(self, request: Request) -> JSONResponse:
        body = await request.body()
        payload = json.loads(body) if body and body != b"null" else None
        self.log.append((self.name, request.url.path, self.stamped(),
                         None if self.gate is None else self.gate.held))
        if request.url.path == self.fail:
            return JSONResponse({"error": "scripted failure"}, 500)
        if request.url.path == "/update_weight_version" and payload:
            self.version = payload["new_version"]
        return JSONResponse({})

    async def info(self, _request: Request) -> JSONResponse:
        return JSONResponse({"weight_version": self.version})

    def app(self) -> Starlette:
        return Starlette(routes=[Route(p, self.post, methods=["POST"]) for p in ROUTES]
                         + [Route("/weight_info", self.info)])


@contextlib.contextmanager
def two_servers(tmp_path: Path, *, fail: str | None = None, gate: WeightGate | None = None):
    """Two scripted servers (b fails `fail`), and the proxy's engine over both as
    `harnessrl train` builds it from `engine.urls`."""
    log: list[tuple] = []
    box: dict[str, RoutedEngine] = {}

    def stamped() -> str | None:
        return box["engine"].weight_version

    a = ScriptedVLLM("a", log, stamped, gate)
    b = ScriptedVLLM("b", log, stamped, gate, fail=fail)
    with in_thread(a.app()) as (url_a, _), in_thread(b.app()) as (url_b, _):
        config = TrainSettings(engine=msgspec_engine([f"{url_a}/v1", url_b]))
        with policy_engines(config, tmp_path, tmp_path / "run") as engines:
            assert isinstance(engines.engine, RoutedEngine)
            engines.engine.weight_version = "v1"
            box["engine"] = engines.engine
            yield engines, log, (url_a, url_b)


def msgspec_engine(urls: list[str]):
    import msgspec

    from harnessrl.train.config import TrainSettings

    return msgspec.convert({"engine": {"urls": urls}}, type=TrainSettings).engine


def _reload_then_stamp(log: list[tuple], old: str) -> None:
    for server in ("a", "b"):
        assert [route for s, route, *_ in log if s == server] == list(ROUTES)
    assert all(stamped == old for _s, _r, stamped, _g in log)  # nothing new while telling


class Model:
    config = SimpleNamespace(tie_word_embeddings=False)

    def save_pretrained(self, path: Path, safe_serialization: bool = True) -> None:
        Path(path, "model.safetensors").write_bytes(b"weights")


def _rollouts(engines: PolicyEngines, sync) -> Any:
    """What the sync trainer's callback drives: `HarnessRollouts.ensure_synced`."""
    from harnessrl.train.trl import HarnessRollouts

    rollouts = HarnessRollouts(tasks=[], harnesses=[cast(Any, SimpleNamespace(name="h"))],
                               engine=engines.engine, run_dir=Path("unused"), pad_token_id=0,
                               sync=sync)
    sync.engines.append(engines.engine)  # as HarnessRollouts.__enter__ does
    return rollouts


def test_sync_trainer_reloads_every_server_before_the_version_is_stamped(tmp_path: Path
                                                                        ) -> None:
    with two_servers(tmp_path) as (engines, log, urls):
        sync = engines.weight_sync(tmp_path / "weights")
        assert sync.urls == list(urls)
        _rollouts(engines, sync).ensure_synced(Model(), 1)
        assert sync.agreed_version() == "step-1"
        routed = engines.engine
        assert isinstance(routed, RoutedEngine)
    _reload_then_stamp(log, "v1")
    # the proxy stamps the router's version; each server's engine has it as well
    assert routed.weight_version == "step-1"
    assert [e.weight_version for e in routed.engines] == ["step-1", "step-1"]


def test_sync_trainer_takes_a_server_that_fails_its_reload_out_of_routing(tmp_path: Path
                                                                         ) -> None:
    with two_servers(tmp_path, fail="/collective_rpc") as (engines, log, (url_a, url_b)):
        sync = engines.weight_sync(tmp_path / "weights")
        _rollouts(engines, sync).ensure_synced(Model(), 1)
        routed = engines.engine
        assert isinstance(routed, RoutedEngine)
        assert sync.urls == [url_a] and "HTTP 500" in sync.retired[url_b]
        # b may hold part of the new weights under the old name: no call goes there
        assert routed.retired == {1} and {routed.route(f"k{n}") for n in range(20)} == {0}
    assert routed.weight_version == "step-1"
    assert ("b", "/update_weight_version") not in [(s, r) for s, r, *_ in log]


def _transfer(engines: PolicyEngines, tmp_path: Path, gate: WeightGate):
    from harnessrl.train.async_grpo.transfer import FileWeightTransfer

    sync = engines.weight_sync(tmp_path / "weights")
    sync.engines.append(engines.engine)  # as HarnessRolloutWorker.start does
    transfer = FileWeightTransfer(sync, tmp_path, gates=[gate], version=1)
    transfer.inner._config = Model()  # what init_weight_transfer reads from the model dir
    return transfer


def _tensors():
    import torch

    return iter([("lm_head.weight", torch.zeros(2, 2))])


def test_async_transfer_reloads_every_server_with_the_gate_held(tmp_path: Path) -> None:
    gate = WeightGate()
    with two_servers(tmp_path, gate=gate) as (engines, log, _urls):
        transfer = _transfer(engines, tmp_path, gate)
        transfer.pause()
        transfer.send_weights(_tensors())
        # the servers serve v2; the proxy stamps it once they confirm, before the release
        assert gate.held and engines.engine.weight_version == "v1"
        transfer.resume()
        assert engines.engine.weight_version == "v2"
    _reload_then_stamp(log, "v1")
    assert all(held for *_, held in log)  # no call admitted while any server was told
    assert not gate.held and transfer.version == 2 and len(transfer.seconds) == 1
    assert (tmp_path / "weights" / "model.safetensors").exists()  # saved once, read by both


def test_async_transfer_takes_the_failing_server_out_and_goes_on(tmp_path: Path) -> None:
    gate = WeightGate()
    with two_servers(tmp_path, gate=gate, fail="/update_weight_version") as (
            engines, log, (url_a, _url_b)):
        transfer = _transfer(engines, tmp_path, gate)
        transfer.pause()
        transfer.send_weights(_tensors())
        assert gate.held  # b is out, a serves v2
        transfer.resume()
        assert engines.engine.weight_version == "v2" and transfer.sync.urls == [url_a]
        assert isinstance(engines.engine, RoutedEngine) and engines.engine.retired == {1}
    assert not gate.held and transfer.version == 2
    assert ("b", "/update_weight_version") in [(s, r) for s, r, *_ in log]


def test_async_transfer_with_no_server_left_raises_and_releases_the_gate(tmp_path: Path
                                                                        ) -> None:
    gate = WeightGate()
    with two_servers(tmp_path, gate=gate, fail="/collective_rpc") as (engines, _log, _urls):
        transfer = _transfer(engines, tmp_path, gate)
        transfer.sync.retire(transfer.sync.urls[0], "taken out earlier (test)")
        transfer.pause()
        with pytest.raises(WeightSyncError, match="failed on every vLLM server"):
            transfer.send_weights(_tensors())
        assert engines.engine.weight_version is None  # nothing known to be served
    assert not gate.held and transfer.version == 1  # calls go on; TRL sees the error


# ------------------------------------------------------------------ servers started here
class ScriptedServer:
    """The vLLM process manager as `start_servers` drives it, scripted: `start` takes a
    moment (so starts that run one after the other show) and answers with its URL."""

    started: list[tuple[str, float, float]] = []
    stopped: list[str] = []

    def __init__(self, spec, fail: bool = False) -> None:
        self.spec, self.fail, self.host, self.port = spec, fail, "127.0.0.1", None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def launch(self) -> None:
        self.launched = threading.current_thread()

    def wait_healthy(self) -> None:
        began = time.monotonic()
        time.sleep(0.3)
        if self.fail:
            raise RuntimeError(f"vLLM exited with code 1 while starting; see {self.spec.vllm_log}")
        ScriptedServer.started.append((self.url, began, time.monotonic()))

    def stop(self) -> None:
        ScriptedServer.stopped.append(self.url)


def test_servers_started_here_run_at_once_on_their_own_ports_and_logs(tmp_path: Path) -> None:
    ScriptedServer.started, ScriptedServer.stopped = [], []
    specs, made = [], []
    config = _load(tmp_path, "[engine]\nservers = 2\n")

    def server(spec):
        specs.append(spec)
        made.append(ScriptedServer(spec))
        return made[-1]

    with policy_engines(config, tmp_path, tmp_path / "run", server=server) as engines:
        assert len(set(engines.urls)) == 2
        assert [s.url for s in engines.specs] == engines.urls
        assert engines.weight_sync(tmp_path / "w").urls == engines.urls
        assert isinstance(engines.engine, RoutedEngine) and len(engines.engine.engines) == 2
        assert ScriptedServer.stopped == []
    assert sorted(ScriptedServer.stopped) == sorted(engines.urls)
    assert [s.vllm_log.name for s in specs] == ["vllm-0.log", "vllm-1.log"]
    (_, began_a, ended_a), (_, began_b, ended_b) = ScriptedServer.started
    assert began_b < ended_a and began_a < ended_b  # waited for together, not one by one
    # launched from the caller's thread: a child dies with the thread that started it
    assert {s.launched for s in made} == {threading.current_thread()}


def test_a_server_that_fails_to_start_stops_the_others(tmp_path: Path) -> None:
    ScriptedServer.started, ScriptedServer.stopped = [], []
    config = _load(tmp_path, "[engine]\nservers = 2\n")
    made: list[ScriptedServer] = []
    lock = threading.Lock()

    def server(spec):
        with lock:
            made.append(ScriptedServer(spec, fail=len(made) == 1))
            return made[-1]

    with pytest.raises(RuntimeError, match=r"vllm-1\.log"), \
            policy_engines(config, tmp_path, tmp_path / "run", server=server):
        pass
    assert sorted(ScriptedServer.stopped) == sorted(s.url for s in made)


# ------------------------------------------------------------------ two real servers
ORDER = iter(range(10**6))


def order_term(_verdict: Any, _stats: Any) -> float:
    """A test-only shaping term (`shaping.custom`): the random model fails every task
    alike, so rewards that differ give the step a gradient and the weights move."""
    return float(next(ORDER))


def _next_token_logprobs(url: str, ids: list[int]) -> dict[str, float]:
    import httpx

    reply = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 5})
    reply.raise_for_status()
    return reply.json()["choices"][0]["logprobs"]["top_logprobs"][0]


@pytest.mark.vllm
@pytest.mark.slow
def test_one_grpo_step_reloads_two_real_vllm_servers(vllm_tiny, tiny_model, tmp_path,
                                                     monkeypatch) -> None:
    import httpx

    import harnessrl.harnesses
    from harnessrl.proxy.engines.vllm_server import VLLMServer
    from harnessrl.train.loop import train
    from tests.helpers import CACHE
    from tests.test_train import AGENT, QUIET, agent

    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    scripted_agent = agent("agent-solve", "solve", script)
    monkeypatch.setattr(harnessrl.harnesses, "get", lambda _name: scripted_agent)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "hello", "instruction": "Create hello.txt",
                                 "verify": ["test -f hello.txt"], "timeout": 45}))
    probe = list(range(5, 25))
    second = VLLMServer(model=str(tiny_model), served_name="tiny", dtype="float32",
                        max_model_len=32768, extra_args=["--seed", "0"],
                        log_path=CACHE / "vllm-train-engines-test.log")
    # the second server starts while this process imports the trainer (a no-op when an
    # earlier module did)
    with contextlib.ExitStack() as stack:
        stack.callback(second.stop)
        second.launch()  # from this thread, which outlives it (see VLLMServer.launch)
        import trl  # noqa: F401

        second.wait_healthy()
        before = _next_token_logprobs(second.url, probe)  # the initial weights
        config = _load(tmp_path, f"""
run_dir = "{tmp_path / 'run'}"
[model]
path = "{tiny_model}"
[engine]
urls = ["{vllm_tiny.url}/v1", "{second.url}"]
max_tokens = 16
[rollout]
harnesses = ["agent-solve"]
tasks = "{tasks}"
retries = 0
hide_host = false
[grpo]
trainer = "sync"
steps = 1
num_generations = 2
tasks_per_step = 1
learning_rate = 5.0e-2
# the random model's 16-token replies are all cut: trained (the default masks them)
truncated_turns = "train"
rejected_turns = "train"
[shaping]
custom = ["tests.test_train_engines:order_term"]
""")
        [line] = train(config, console=QUIET)
        served = [httpx.get(f"{u}/weight_info").json()["weight_version"]
                  for u in (vllm_tiny.url, second.url)]
        after = [_next_token_logprobs(u, probe) for u in (vllm_tiny.url, second.url)]
    assert line["rollouts"] == 2 and line["infra_errors"] == 0 and line["trained_tokens"] > 0
    assert line["sampled_with"] == ["step-0"]  # the initial weights, pushed to both first
    assert line["weight_version"] == "step-1" and served == ["step-1", "step-1"]
    # both serve the trainer's new weights: the same next-token logprobs, not the old ones
    assert after[0].keys() == after[1].keys()
    assert all(abs(after[0][t] - after[1][t]) < 1e-4 for t in after[0])
    assert any(abs(after[1].get(t, -99.0) - lp) > 1e-4 for t, lp in before.items())
