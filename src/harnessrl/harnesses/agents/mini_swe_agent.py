"""mini-swe-agent: Chat Completions through litellm, not streamed, one `bash` tool.

Its exit code is 0 even when it gave up (e.g. after repeated format errors), so the end
state is read from its trajectory file: `info.exit_status == "Submitted"`. The same file
is its action record: each reply it accepted carries the commands parsed from it
(`extra.actions`, tool calls or text bash blocks alike); a reply it could not parse is a
format error and carries none.
"""

from __future__ import annotations

import json

from harnessrl.harnesses.base import ExitState, Harness, RunContext


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return ["-y", "--exit-immediately", "-m", f"openai/{ctx.model}", "-t", instruction,
            # -c replaces the default config, so the stock one comes first
            "-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={ctx.openai_base}",
            "-c", f"environment.cwd={ctx.workdir}", "-o", str(ctx.home / "trajectory.json")]


def _env(ctx: RunContext) -> dict[str, str]:
    return {"OPENAI_API_KEY": ctx.key, "MSWEA_CONFIGURED": "true",
            # litellm cannot price an unknown model: without this it stops after one reply
            "MSWEA_COST_TRACKING": "ignore_errors", "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def _outcome(ctx: RunContext, code: int | None, _output: bytes) -> ExitState:
    path = ctx.home / "trajectory.json"
    if not path.is_file():
        return ExitState(False, f"no trajectory written (exit code {code})")
    trajectory = json.loads(path.read_text())
    status = trajectory.get("info", {}).get("exit_status")
    return ExitState(status == "Submitted", f"exit_status {status!r}, exit code {code}",
                     actions=_actions(trajectory))


def _actions(trajectory: dict) -> int | None:
    """The commands it ran, from its own messages; None if they are not as it writes them
    (the agent can overwrite the file)."""
    messages = trajectory.get("messages")
    if not isinstance(messages, list):
        return None
    count = 0
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        extra = message.get("extra") or {}
        actions = extra.get("actions", []) if isinstance(extra, dict) else None
        if not isinstance(actions, list):
            return None
        count += len(actions)
    return count


HARNESS = Harness(
    name="mini-swe-agent", version="2.4.6", dialect="openai_chat", registry="pypi",
    package="mini-swe-agent", binary="mini", streams=False, argv=_argv, env=_env,
    outcome=_outcome, finish="mini-swe-agent",
)
