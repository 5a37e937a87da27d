"""Codex CLI: OpenAI Responses (`POST /v1/responses`, streamed) through a custom provider
in `$CODEX_HOME/config.toml`; its shell tool is `exec_command` (a `cmd` string).

Traps:
- Its own sandbox is read-only by default: `codex exec` runs commands unattended only
  with `--dangerously-bypass-approvals-and-sandbox`.
- It reads extra input from stdin until EOF, so stdin must be /dev/null (the sandbox
  gives that).
- It sends fields no published schema has (`namespace` and `web_search` tools,
  `include: ["reasoning.encrypted_content"]`, `client_metadata`) and warns that an
  unknown model has no metadata (harmless).
- Feature-flag and plugin look-ups to outside hosts fail here without blocking it.
- The exit code is mostly honest (1 when the turn fails), but the JSONL event stream
  (`--json`) is the real end state: a `turn.completed` event and no `turn.failed` or
  `error` event; the outcome reads that.
"""

from __future__ import annotations

import json

from harnessrl.harnesses.base import Harness, Outcome, RunContext

_PROVIDER = "harnessrl"
_KEY_VARIABLE = "HARNESSRL_API_KEY"


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _config(ctx: RunContext) -> str:
    return "\n".join([
        f"model = {_toml_string(ctx.model)}",
        f"model_provider = {_toml_string(_PROVIDER)}",
        'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"',
        "check_for_update_on_startup = false",
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[feedback]",
        "enabled = false",
        "",
        f"[model_providers.{_PROVIDER}]",
        f"name = {_toml_string(_PROVIDER)}",
        f"base_url = {_toml_string(ctx.openai_base)}",
        f"env_key = {_toml_string(_KEY_VARIABLE)}",
        'wire_api = "responses"',
        # a failed call is the proxy's answer, not a network blip: retry little
        "request_max_retries = 1",
        "stream_max_retries = 1",
        "",
    ])


def _codex_home(ctx: RunContext):
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


def _events(stdout: bytes) -> list[dict]:
    events = []
    for line in stdout.decode("utf-8", "replace").splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return [e for e in events if isinstance(e, dict)]


def _outcome(_ctx: RunContext, code: int | None, stdout: bytes) -> Outcome:
    types = [e.get("type") for e in _events(stdout)]
    failed = [e for e in _events(stdout) if e.get("type") in ("turn.failed", "error")]
    if failed:
        return Outcome(False, f"{json.dumps(failed[-1])[:300]} (exit code {code})")
    finished = "turn.completed" in types
    return Outcome(finished, f"turn.completed {'seen' if finished else 'missing'}, "
                             f"exit code {code}")


HARNESS = Harness(
    name="codex", version="0.171.0", dialect="openai_responses", registry="npm",
    package="@openai/codex", binary="codex", setup=_setup, argv=_argv, env=_env,
    outcome=_outcome,
)
