"""Real harnesses, one module per harness, each defining `HARNESS`."""

from __future__ import annotations

import importlib

from harnessrl.harnesses.base import Harness

# name -> module under harnessrl.harnesses
MODULES = {
    "aider": "aider",
    "claude": "claude",
    "codex": "codex",
    "gemini": "gemini",
    "hermes": "hermes",
    "kilo": "kilo",
    "kimi": "kimi",
    "mini-swe-agent": "mini_swe_agent",
    "opencode": "opencode",
    "openhands": "openhands",
    "pi": "pi",
    "qwen": "qwen",
}


def get(name: str) -> Harness:
    if name not in MODULES:
        raise KeyError(f"unknown harness {name!r}; known: {', '.join(sorted(MODULES))}")
    return importlib.import_module(f"harnessrl.harnesses.{MODULES[name]}").HARNESS


def all_harnesses() -> list[Harness]:
    return [get(name) for name in sorted(MODULES)]
