"""Codex CLI: OpenAI Responses (`POST /v1/responses`, streamed) through a custom provider
in `$CODEX_HOME/config.toml`; its shell tool is `exec_command` (a `cmd` string).

Traps:
- Its own sandbox is read-only by default: `codex exec` runs commands unattended only
  with `--dangerously-bypass-approvals-and-sandbox`.
- It reads extra input from stdin until EOF ("Reading additional input from stdin..."),
  so stdin must be /dev/null (the sandbox gives that).
- It sends fields no published schema has (`namespace` and `web_search` tools,
  `include: ["reasoning.encrypted_content"]`, `client_metadata`) and reports an unknown
  model's missing metadata as an `error` item, although that is only a warning.
- On a 5xx it retries hard by default (30 requests in 25 s); the provider caps that.
- Feature-flag and plugin look-ups to outside hosts fail here without blocking it.

Exit code: honest as far as seen (1 with a `turn.failed` event on a 401 or a 5xx, 0
after `turn.completed`). The outcome still reads the `--json` event stream, the precise
record: finished means a `turn.completed` event and no `turn.failed`.
"""

from __future__ import annotations

import json
from pathlib import Path

from harnessrl.harnesses.base import ExitState, Harness, RunContext, json_lines

_PROVIDER = "harnessrl"
_KEY_VARIABLE = "HARNESSRL_API_KEY"  # the provider's env_key: the key never sits in a file


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _config(ctx: RunContext) -> str:
    return "\n".join([
        f"model = {_toml(ctx.model)}",
        f"model_provider = {_toml(_PROVIDER)}",
        "check_for_update_on_startup = false",
        "",
        "[analytics]",
        "enabled = false",
        "",
        f"[model_providers.{_PROVIDER}]",
        f"name = {_toml(_PROVIDER)}",
        f"base_url = {_toml(ctx.openai_base)}",
        f"env_key = {_toml(_KEY_VARIABLE)}",
        'wire_api = "responses"',
        # the proxy fails only when its engine does; the default retries only make a
        # failed rollout slow
        "request_max_retries = 2",
        "stream_max_retries = 2",
        "",
    ])


def _codex_home(ctx: RunContext) -> Path:
    return ctx.home / ".codex"


def _setup(ctx: RunContext) -> None:
    home = _codex_home(ctx)
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(_config(ctx))


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "--json", "--cd", str(ctx.workdir), instruction]


def _env(ctx: RunContext) -> dict[str, str]:
    return {"CODEX_HOME": str(_codex_home(ctx)), _KEY_VARIABLE: ctx.key}


def _outcome(_ctx: RunContext, code: int | None, stdout: bytes) -> ExitState:
    events = json_lines(stdout)
    failed = [e for e in events if e.get("type") == "turn.failed"]
    if failed:
        error = failed[-1].get("error", {})
        return ExitState(False, f"turn.failed: {str(error)[:300]} (exit code {code})")
    if not any(e.get("type") == "turn.completed" for e in events):
        return ExitState(False, f"no turn.completed event (exit code {code})")
    return ExitState(True, f"turn.completed, exit code {code}")


HARNESS = Harness(
    name="codex", version="0.171.0", dialect="openai_responses", registry="npm",
    package="@openai/codex", binary="codex", setup=_setup, argv=_argv, env=_env,
    outcome=_outcome,
)
