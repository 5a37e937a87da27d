"""Pi (`pi-coding-agent`): Chat Completions through a custom provider in
`~/.pi/agent/models.json` (`api: openai-completions`), streamed, with the OpenAI JS SDK;
its shell tool is `bash` (4 tools: read, bash, edit, write). The provider's `api` picks
the transport: `openai-responses` (variant `pi@responses`) or `anthropic-messages`
(`pi@anthropic`, the Anthropic SDK, base URL without `/v1`).

Traps:
- It sends `max_completion_tokens` (not `max_tokens`), `store: false`, and the user
  content as an array of text parts.
- `apiKey` in `models.json` is read as an environment variable name when such a variable
  exists (else as a literal), so the key stays out of the file.
- It has no approval prompts: in print mode its tools always run.
- Startup network operations (update check, install telemetry) are off with
  `PI_OFFLINE=1`.
- Its exit code lies in `--mode json`: with the endpoint unreachable it retries 3 times,
  then exits 0. (In plain `-p` text mode it exits 1 on 5xx.) The event stream it prints
  is the truth: the run finished when the last assistant message in `agent_end` stopped
  with `stopReason` "stop" (not "error" or "aborted"). The outcome is read from that.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl.harnesses.base import ExitState, Harness, RunContext, last_of_type

PROVIDER = "harnessrl"
KEY_VARIABLE = "HARNESSRL_API_KEY"


def _models(ctx: RunContext, api: str) -> dict[str, Any]:
    base = ctx.proxy_root if api == "anthropic-messages" else ctx.openai_base
    return {"providers": {PROVIDER: {
        "baseUrl": base, "api": api, "apiKey": KEY_VARIABLE,
        "models": [{"id": ctx.model, "name": ctx.model}]}}}


def _agent_dir(ctx: RunContext) -> Path:
    return ctx.home / ".pi" / "agent"


def _setup_for(api: str) -> Callable[[RunContext], None]:
    def setup(ctx: RunContext) -> None:
        directory = _agent_dir(ctx)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "models.json").write_text(json.dumps(_models(ctx, api), indent=2))
        # PI_OFFLINE already stops the anonymous install ping; the setting says so on disk
        (directory / "settings.json").write_text(json.dumps({"enableInstallTelemetry": False}))
    return setup


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return ["-p", "--model", f"{PROVIDER}/{ctx.model}", "--mode", "json", instruction]


def _env(ctx: RunContext) -> dict[str, str]:
    return {KEY_VARIABLE: ctx.key, "PI_CODING_AGENT_DIR": str(_agent_dir(ctx)),
            "PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"}


def _outcome(_ctx: RunContext, code: int | None, stdout: bytes) -> ExitState:
    end = last_of_type(stdout, "agent_end")
    if end is None:
        return ExitState(False, f"no agent_end event (exit code {code})")
    replies = [m for m in end.get("messages", []) if m.get("role") == "assistant"]
    if not replies:
        return ExitState(False, f"no assistant message (exit code {code})")
    last = replies[-1]
    reason, error = last.get("stopReason"), last.get("errorMessage")
    detail = f"stopReason {reason!r}, exit code {code}" + (f", error {error!r}" if error
                                                            else "")
    return ExitState(reason == "stop", detail)


HARNESS = Harness(
    name="pi", version="0.73.1", dialect="openai_chat", registry="npm",
    package="@mariozechner/pi-coding-agent", binary="pi", setup=_setup_for("openai-completions"),
    argv=_argv, env=_env, outcome=_outcome,
)

VARIANTS = {
    "responses": dataclasses.replace(HARNESS, name="pi@responses", dialect="openai_responses",
                                     setup=_setup_for("openai-responses")),
    "anthropic": dataclasses.replace(HARNESS, name="pi@anthropic", dialect="anthropic",
                                     setup=_setup_for("anthropic-messages")),
}
