"""Kimi CLI (MoonshotAI): Chat Completions through its own LLM layer over the openai SDK,
streamed, with native function calling (15 tools; the shell is `Shell`).

Its exit code is honest, unlike most harnesses here: `--print` returns 0 only when the turn
ended on a reply, 1 on a failure (max steps, a rejected request, no model configured) and
75 (EX_TEMPFAIL) when the model could not be reached or kept answering 429/5xx.

Traps:
- 1.52.0 is an archived stub that prints "no longer maintained" and, run without
  arguments, downloads and runs an install script: stay pinned to 1.51.0.
- It needs Python >= 3.12, and crashes at start on 3.12.1 (a frozen slots dataclass
  `SlashCommand[F]` trips `super(type, obj)` in `__setattr__`): its venv uses 3.13.
- Provider type `openai_legacy` means Chat Completions; for that type the variables
  OPENAI_BASE_URL / OPENAI_API_KEY override the config file, so they must stay unset.
- It sends `"reasoning_effort": null` explicitly; the proxy must accept the null.
- Telemetry is on by default: off in the config and by variable.
"""

from __future__ import annotations

import json
from pathlib import Path

from harnessrl.harnesses.base import ExitState, Harness, RunContext

CONTEXT_TOKENS = 131072
_EXIT_MEANING = {0: "the turn ended on a reply", 1: "failed",
                 75: "the model could not be reached (retryable)"}


def _config_file(ctx: RunContext) -> Path:
    return ctx.home / ".kimi" / "config.toml"


def _toml(value: str | int | bool) -> str:
    # JSON strings, ints and booleans are valid TOML for the ASCII-safe output json emits.
    return json.dumps(value)


def _config(ctx: RunContext) -> str:
    return "\n".join([
        f"default_model = {_toml('policy')}",
        "telemetry = false",
        "",
        "[providers.harnessrl]",
        f"type = {_toml('openai_legacy')}",  # Chat Completions
        f"base_url = {_toml(ctx.openai_base)}",
        f"api_key = {_toml(ctx.key)}",
        "",
        "[models.policy]",
        f"provider = {_toml('harnessrl')}",
        f"model = {_toml(ctx.model)}",
        f"max_context_size = {CONTEXT_TOKENS}",
    ]) + "\n"


def _setup(ctx: RunContext) -> None:
    path = _config_file(ctx)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_config(ctx))


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    # --print: non-interactive, auto-approves; --yolo kept so approvals never block.
    return ["--print", "--yolo", "--config-file", str(_config_file(ctx)),
            "-w", str(ctx.workdir), "-p", instruction]


def _env(ctx: RunContext) -> dict[str, str]:
    return {"KIMI_SHARE_DIR": str(ctx.home / ".kimi"),  # sessions and logs stay in HOME
            "KIMI_DISABLE_TELEMETRY": "1", "KIMI_CLI_NO_AUTO_UPDATE": "1"}


def _outcome(_ctx: RunContext, code: int | None, _output: bytes) -> ExitState:
    meaning = "killed" if code is None else _EXIT_MEANING.get(code, "unexpected")
    return ExitState(code == 0, f"exit code {code}: {meaning}")


HARNESS = Harness(
    name="kimi", version="1.51.0", dialect="openai_chat", registry="pypi",
    package="kimi-cli", binary="kimi", python="3.13", setup=_setup, argv=_argv, env=_env,
    outcome=_outcome,
)
