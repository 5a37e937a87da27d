"""Shared fixtures: the tiny model (built once, cached) and its tokenizer. Helpers that
test files share live in tests/helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Re-exported for the test files that still import them from here; new code imports
# tests.helpers.
from tests.helpers import CACHE, ServedProxy, make_proxy

__all__ = ["CACHE", "ServedProxy", "make_proxy"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

# No per-example deadline: CI machines are shared and slow examples are not failures.
settings.register_profile("harnessrl", deadline=None, max_examples=300)
settings.load_profile("harnessrl")


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from harnessrl.models.tiny import build_tiny_model

    return build_tiny_model(CACHE / "tiny-qwen2")


@pytest.fixture(scope="session")
def tokenizer(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="session")
def vllm_tiny(tiny_model: Path):
    """vLLM in dev mode (weight reloads) serving the tiny model, shared by the training
    modules (test_train and test_train_openenv, which run one after the other): one
    server start instead of one per module."""
    from harnessrl.proxy.engines.vllm_server import VLLMServer
    from tests.helpers import CACHE

    server = VLLMServer(model=str(tiny_model), served_name="tiny", dtype="float32",
                        max_model_len=32768, extra_args=["--seed", "0"],
                        log_path=CACHE / "vllm-train-test.log")
    with server:
        yield server
