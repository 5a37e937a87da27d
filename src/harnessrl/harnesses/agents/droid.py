"""Factory's Droid (`droid exec`) with a BYOK custom model in `~/.factory/settings.json`
(provider `generic-chat-completion-api`: Chat Completions), streamed.

Traps:
- The npm package `droid` is a wrapper whose optional dependencies name platform packages
  of its own version, which may not be published (wrapper 0.215.0 when the platform
  package was at 0.225.2); the platform package `@factory/cli-linux-x64` is installed
  itself and its `bin/droid` (a Bun-compiled binary; it declares no npm `bin`) is run.
- The BYOK provider type picks the dialect: `generic-chat-completion-api` (Chat
  Completions), `openai` (the Responses API) or `anthropic` (Messages, base URL without
  `/v1`); these are the variants.
- A custom model is addressed as `custom:<model>`; `exec` is read-only unless given
  `--auto`: `high` lets it run any command the task needs.
- It ships its own ripgrep and does not need Factory's login for a custom model, but
  tries telemetry and feature-flag hosts at start (they fail here without blocking).
- Its exit code was honest in the runs seen (1 on an unreachable model, "Exec failed"),
  but `-o json` prints one final JSON record (`subtype`, `is_error`, `result`,
  `num_turns`), which is what the outcome reads: finished when `is_error` is false.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl.harnesses.base import ExitState, Harness, RunContext, json_lines

VERSION = "0.225.2"


def _settings(ctx: RunContext, provider: str) -> dict[str, Any]:
    base = ctx.proxy_root if provider == "anthropic" else ctx.openai_base
    return {"customModels": [{
        "model": ctx.model, "displayName": ctx.model, "baseUrl": base, "apiKey": ctx.key,
        "provider": provider, "maxOutputTokens": 4096}],
        "enableTelemetry": False, "autoUpdate": False}


def _settings_path(ctx: RunContext) -> Path:
    return ctx.home / ".factory" / "settings.json"


def _setup_for(provider: str) -> Callable[[RunContext], None]:
    def setup(ctx: RunContext) -> None:
        path = _settings_path(ctx)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_settings(ctx, provider), indent=2))
    return setup


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return ["exec", "--auto", "high", "--model", f"custom:{ctx.model}", "-o", "json",
            "--cwd", str(ctx.workdir), instruction]


def _env(_ctx: RunContext) -> dict[str, str]:
    return {"FACTORY_DROID_AUTO_UPDATE_ENABLED": "false", "FACTORY_DISABLE_KEYRING": "1"}


def _outcome(_ctx: RunContext, code: int | None, stdout: bytes) -> ExitState:
    records = json_lines(stdout)
    result = next((r for r in reversed(records) if "is_error" in r), None)
    if result is None:
        return ExitState(False, f"no result record (exit code {code})")
    detail = (f"is_error {result.get('is_error')!r}, subtype {result.get('subtype')!r}, "
              f"turns {result.get('num_turns')!r}, exit code {code}: "
              f"{str(result.get('result'))[:160]!r}")
    return ExitState(code == 0 and not result.get("is_error"), detail)


HARNESS = Harness(
    name="droid", version=VERSION, dialect="openai_chat", registry="npm",
    package="@factory/cli-linux-x64", binary="droid",
    entry="node_modules/@factory/cli-linux-x64/bin/droid",
    setup=_setup_for("generic-chat-completion-api"), argv=_argv, env=_env, outcome=_outcome,
)

VARIANTS = {
    "responses": dataclasses.replace(HARNESS, name="droid@responses", dialect="openai_responses",
                                     setup=_setup_for("openai")),
    "anthropic": dataclasses.replace(HARNESS, name="droid@anthropic", dialect="anthropic",
                                     setup=_setup_for("anthropic")),
}
