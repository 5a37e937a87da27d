"""Qwen Code: Chat Completions through the OpenAI JS SDK (`--auth-type openai`, base URL,
key and model from `OPENAI_*`), streamed; its shell tool is `run_shell_command`.

Traps:
- It sends even loopback traffic through `HTTPS_PROXY`/`HTTP_PROXY` and ignores
  `NO_PROXY`, so no proxy variable may reach it (the sandbox strips them anyway).
- Without `--approval-mode yolo` its shell and write tools are not offered at all (only
  read-only tools plus `tool_search` for "deferred" ones).
- The task call starts with a synthetic user/assistant context pair; after the answer a
  background "managed memory" agent may make one more call with 4 read-only tools.
- Usage statistics (RUM to an outside host), telemetry and the auto-update check are
  turned off in `~/.qwen/settings.json`.
- Its exit code lies, and so does its own result record: when the endpoint cannot be
  reached it prints the error as the answer ("[API Error: Connection error. ...]"),
  exits 0 and reports `subtype: success, is_error: false`. The truth is in its chat
  recording (`~/.qwen/projects/<dir>/chats/<session>.jsonl`), which logs every model
  call as a `qwen-code.api_response` or `qwen-code.api_error` event. The run finished
  when the result record says success and the last model call there was answered.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harnessrl.harnesses.base import ExitState, Harness, RunContext, last_of_type


def _settings() -> dict[str, Any]:
    return {"general": {"enableAutoUpdate": False},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False}}


def _setup(ctx: RunContext) -> None:
    path = ctx.home / ".qwen" / "settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_settings(), indent=2))


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return ["--auth-type", "openai", "-m", ctx.model, "--approval-mode", "yolo",
            # one JSON record per line, ending with the `result` record
            "--output-format", "stream-json", instruction]


def _env(ctx: RunContext) -> dict[str, str]:
    return {"OPENAI_BASE_URL": ctx.openai_base, "OPENAI_API_KEY": ctx.key,
            "OPENAI_MODEL": ctx.model, "QWEN_TELEMETRY_ENABLED": "false"}


_API_EVENTS = ("qwen-code.api_response", "qwen-code.api_error")


def _api_events(ctx: RunContext) -> list[dict[str, Any]]:
    """Every model-call event in the chat recordings, oldest session file first."""
    chats = sorted((ctx.home / ".qwen" / "projects").glob("*/chats/*.jsonl"),
                   key=lambda path: path.stat().st_mtime)
    return [event for path in chats for event in _recorded_events(path)
            if event.get("event.name") in _API_EVENTS]


def _recorded_events(path: Path) -> list[dict[str, Any]]:
    found = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        event = (record.get("systemPayload") or {}).get("uiEvent") if isinstance(
            record, dict) else None
        if isinstance(event, dict):
            found.append(event)
    return found


def _outcome(ctx: RunContext, code: int | None, stdout: bytes) -> ExitState:
    record = last_of_type(stdout, "result")
    if record is None:
        return ExitState(False, f"no result record on stdout (exit code {code})")
    detail = (f"subtype {record.get('subtype')!r}, is_error {record.get('is_error')!r}, "
              f"exit code {code}")
    if record.get("subtype") != "success" or record.get("is_error"):
        return ExitState(False, detail)
    calls = _api_events(ctx)
    if not calls:
        return ExitState(False, f"no model call recorded; {detail}")
    last = calls[-1]
    if last.get("event.name") != "qwen-code.api_response":
        return ExitState(False, f"last model call failed: {last.get('error_type')} "
                              f"{str(last.get('error_message'))[:200]!r}; {detail}")
    return ExitState(True, f"{len(calls)} model calls recorded, the last answered; {detail}")


HARNESS = Harness(
    name="qwen", version="0.15.10", dialect="openai_chat", registry="npm",
    package="@qwen-code/qwen-code", binary="qwen", setup=_setup, argv=_argv, env=_env,
    outcome=_outcome,
)
