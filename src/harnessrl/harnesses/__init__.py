"""Real harnesses, one module per harness under `agents/`, each defining `HARNESS` (and,
where the harness can speak another dialect through its own config, `VARIANTS`: dialect ->
`Harness`, selected as `name@variant`, e.g. `pi@anthropic`); `base.py` the shared type."""

from __future__ import annotations

import importlib

from harnessrl.harnesses.base import Harness

# name -> module under harnessrl.harnesses.agents
MODULES = {
    "aider": "aider",
    "claude": "claude",
    "codex": "codex",
    "continue": "continue_cli",
    "copilot": "copilot",
    "droid": "droid",
    "gemini": "gemini",
    "gptme": "gptme",
    "grok": "grok",
    "hermes": "hermes",
    "kilo": "kilo",
    "kimi": "kimi",
    "mini-swe-agent": "mini_swe_agent",
    "mistral-vibe": "mistral_vibe",
    "nanocoder": "nanocoder",
    "opencode": "opencode",
    "openhands": "openhands",
    "pi": "pi",
    "qwen": "qwen",
    "terminus-2": "terminus",
}


def get(name: str) -> Harness:
    """A harness by name, or one of its dialect variants as `name@variant`."""
    base, _, variant = name.partition("@")
    if base not in MODULES:
        raise KeyError(f"unknown harness {base!r}; known: {', '.join(sorted(MODULES))}")
    module = importlib.import_module(f"harnessrl.harnesses.agents.{MODULES[base]}")
    if not variant:
        return module.HARNESS
    variants: dict[str, Harness] = getattr(module, "VARIANTS", {})
    if variant not in variants:
        raise KeyError(f"{base} has no variant {variant!r}; it has: "
                       f"{', '.join(sorted(variants)) or 'none'}")
    return variants[variant]


def all_harnesses() -> list[Harness]:
    return [get(name) for name in sorted(MODULES)]


def variants_of(name: str) -> list[Harness]:
    """The harness and each of its dialect variants, the harness first."""
    module = importlib.import_module(f"harnessrl.harnesses.agents.{MODULES[name]}")
    return [module.HARNESS, *(module.VARIANTS[v] for v in sorted(getattr(module, "VARIANTS",
                                                                        {})))]


def all_variants() -> list[Harness]:
    """Every harness and dialect variant (what conformance covers)."""
    return [h for name in sorted(MODULES) for h in variants_of(name)]
