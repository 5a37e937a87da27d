"""Continue CLI (`cn`, npm `@continuedev/cli`): a local `config.yaml` with one `openai`
provider model at the proxy, Chat Completions, streamed; headless with `-p`.

Traps:
- Its Bash tool (`$SHELL -l -c`) is spawned without a `cwd`, so it inherits the process's
  working directory as entered, not by path: in the confined sandbox that was the
  directory under the mounts made read-only, and every relative write failed with
  "Read-only file system" until the confinement launcher entered it again by its path.
- `--config` takes a file path or a hub slug; a local file keeps it off the hub and
  needs no login.
- `-p` alone only offers read-only tools without asking; `--auto` allows every tool.
- The model's `capabilities: [tool_use]` in the config states that it takes native tool
  calls (an unknown model name would otherwise be guessed at).
- Sessions are written under `~/.continue/sessions` (inside HOME here).
- In the runs seen its exit code was honest (1 and `{"status":"error"}` on stdout when
  the model was unreachable, and then no session file is written). `--format json`
  wraps any final text as `status: success`, so the record read is the session file
  (`history`): finished when its last message is an assistant reply without tool calls.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harnessrl.harnesses.base import ExitState, Harness, RunContext


def _config_path(ctx: RunContext) -> Path:
    return ctx.home / ".continue" / "harnessrl.yaml"


def _config(ctx: RunContext) -> str:
    q = json.dumps  # JSON strings are valid YAML scalars
    return "\n".join([
        "name: harnessrl", "version: 1.0.0", "schema: v1", "models:",
        "  - name: policy", "    provider: openai", f"    model: {q(ctx.model)}",
        f"    apiBase: {q(ctx.openai_base)}", f"    apiKey: {q(ctx.key)}",
        "    roles: [chat, edit, apply]", "    capabilities: [tool_use]",
    ]) + "\n"


def _setup(ctx: RunContext) -> None:
    path = _config_path(ctx)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_config(ctx))


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return ["-p", "--auto", "--config", str(_config_path(ctx)), "--format", "json",
            instruction]


def _env(_ctx: RunContext) -> dict[str, str]:
    return {"CONTINUE_TELEMETRY_ENABLED": "0", "CONTINUE_ALLOW_ANONYMOUS_TELEMETRY": "0"}


def _sessions(ctx: RunContext) -> list[dict[str, Any]]:
    found = []
    for path in sorted((ctx.home / ".continue" / "sessions").glob("*.json"),
                       key=lambda p: p.stat().st_mtime):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and "history" in data:
            found.append(data)
    return found


def _outcome(ctx: RunContext, code: int | None, stdout: bytes) -> ExitState:
    sessions = _sessions(ctx)
    history = sessions[-1]["history"] if sessions else []
    messages = [item.get("message", {}) for item in history if isinstance(item, dict)]
    last = messages[-1] if messages else {}
    detail = (f"{len(messages)} messages in the session, last {last.get('role')!r}: "
              f"{str(last.get('content'))[:160]!r}, exit code {code}")
    finished = (code == 0 and last.get("role") == "assistant"
                and not last.get("toolCalls") and bool(last.get("content")))
    return ExitState(finished, detail)


HARNESS = Harness(
    name="continue", version="1.5.47", dialect="openai_chat", registry="npm",
    package="@continuedev/cli", binary="cn", setup=_setup, argv=_argv, env=_env,
    outcome=_outcome,
)
