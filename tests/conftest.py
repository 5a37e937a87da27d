"""Shared fixtures: the tiny model (built once, cached), and a proxy served in a thread."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from harnessrl.proxy.serve import in_thread

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

# No per-example deadline: CI machines are shared and slow examples are not failures.
settings.register_profile("harnessrl", deadline=None, max_examples=300)
settings.load_profile("harnessrl")

CACHE = Path(os.environ.get("HARNESSRL_TEST_CACHE", Path.home() / ".cache" / "harnessrl" / "test"))
SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from harnessrl.models.tiny import build_tiny_model

    return build_tiny_model(CACHE / "tiny-qwen2")


@pytest.fixture(scope="session")
def tokenizer(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


class ServedProxy:
    """A proxy served in a thread, for sync SDK clients."""

    def __init__(self, proxy) -> None:
        self.proxy = proxy
        self.store = proxy.store
        self.url = ""

    @contextlib.contextmanager
    def running(self) -> Iterator[ServedProxy]:
        with in_thread(self.proxy.app()) as (url, _server):
            self.url = url
            yield self

    def new_rollout(self, **options) -> dict:
        import httpx

        resp = httpx.post(f"{self.url}/rollouts", json=options)
        resp.raise_for_status()
        return resp.json()


def make_proxy(engine, run_dir: Path, **config):
    from harnessrl.proxy.app import Proxy, ProxyConfig
    from harnessrl.proxy.sessions import Sessions
    from harnessrl.proxy.store import TraceStore

    sessions_options = {k: config.pop(k) for k in ("sampling", "unset_sampling") if k in config}
    sessions = Sessions(TraceStore(run_dir), **sessions_options)
    return Proxy(engine, sessions, ProxyConfig(**config))
