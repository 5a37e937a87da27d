"""aider: Chat Completions through litellm (`openai/<model>` + a custom base), streamed,
with no tools at all: edits are parsed out of the reply text. An unknown model gets the
"whole" edit format (the file name on a line of its own, then the entire new file in a
fence), so one reply is a complete episode (`--message` runs one turn and exits).

Traps:
- Its exit code lies: 0 even after every model call failed (27 retries, ~75 s of backoff).
  The truth is the LLM history file, which logs every reply (empty when a call failed):
  the run finished when its last logged reply has content.
- `--yes-always` also answers yes to the first-run prompts (analytics opt-in, "open the
  release notes in a browser"), so those are switched off explicitly.
- By default it looks for a git repo, commits its edits, and makes an extra "weak model"
  call for the commit message; `--no-git` keeps it out of the task's repository.
- Its chat/input history files default to the working directory; they go to HOME instead.
- It fetches litellm's price map for an unknown model unless the model is described in a
  metadata file, so we write one.
- It loads `.env` from the working directory, which could override the proxy settings;
  `--env-file` points it at a file of ours.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from harnessrl.harnesses.base import ExitState, Harness, RunContext

CONTEXT_TOKENS = 131072
# A log entry header: "TO LLM 2026-11-30T12:00:00" or "LLM RESPONSE 2026-...".
_ENTRY = re.compile(r"^(TO LLM|LLM RESPONSE) \d{4}-\d\d-\d\dT[\d:]+$", re.MULTILINE)


def _files(ctx: RunContext) -> dict[str, Path]:
    state = ctx.home / ".aider-run"
    return {"metadata": state / "model.metadata.json", "env": state / "aider.env",
            "llm": state / "llm.history.txt", "chat": state / "chat.history.md",
            "input": state / "input.history"}


def _setup(ctx: RunContext) -> None:
    files = _files(ctx)
    files["metadata"].parent.mkdir(parents=True, exist_ok=True)
    # Costs of zero and a stated context window: no price-map download, no warnings.
    info = {"max_input_tokens": CONTEXT_TOKENS, "max_tokens": 8192, "max_output_tokens": 8192,
            "input_cost_per_token": 0.0, "output_cost_per_token": 0.0,
            "litellm_provider": "openai", "mode": "chat"}
    files["metadata"].write_text(json.dumps({f"openai/{ctx.model}": info}))
    files["env"].write_text("")


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    files = _files(ctx)
    return ["--model", f"openai/{ctx.model}", "--openai-api-base", ctx.openai_base,
            "--model-metadata-file", str(files["metadata"]), "--env-file", str(files["env"]),
            "--message", instruction, "--yes-always",
            "--no-git", "--no-gitignore",
            "--no-check-update", "--no-analytics", "--analytics-disable",
            "--no-show-release-notes", "--no-show-model-warnings",
            "--no-pretty", "--no-fancy-input", "--no-detect-urls", "--no-notifications",
            "--disable-playwright",
            "--llm-history-file", str(files["llm"]),
            "--chat-history-file", str(files["chat"]),
            "--input-history-file", str(files["input"])]


def _env(ctx: RunContext) -> dict[str, str]:
    # The key through the environment, not argv, so it does not show in process lists.
    return {"OPENAI_API_KEY": ctx.key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def _last_reply(log: str) -> str | None:
    """The assistant text of the last logged reply, or None if none was logged."""
    headers = list(_ENTRY.finditer(log))
    replies = [(h, headers[i + 1].start() if i + 1 < len(headers) else len(log))
               for i, h in enumerate(headers) if h.group(1) == "LLM RESPONSE"]
    if not replies:
        return None
    header, end = replies[-1]
    lines = log[header.end():end].splitlines()
    return "\n".join(line.removeprefix("ASSISTANT ") for line in lines
                     if line.startswith("ASSISTANT")).strip()


def _outcome(ctx: RunContext, code: int | None, _output: bytes) -> ExitState:
    files = _files(ctx)
    if not files["llm"].is_file():
        return ExitState(False, f"no LLM history written (exit code {code})")
    reply = _last_reply(files["llm"].read_text(errors="replace"))
    chat = files["chat"].read_text(errors="replace") if files["chat"].is_file() else ""
    # Its actions are the edits it parsed from the replies and applied, one line each in
    # the chat history (its calls offer the model no tools, so this is the count).
    applied = re.findall(r"^> Applied edit to (.+?)\s*$", chat, re.MULTILINE)
    actions = len(applied) if files["chat"].is_file() else None  # no record: not known
    detail = f"edits applied to {applied or 'no file'}, exit code {code}"
    if not reply:
        return ExitState(False, f"no model reply received; {detail}", actions=actions)
    return ExitState(True, detail, actions=actions)


HARNESS = Harness(
    name="aider", version="0.86.2", dialect="openai_chat", registry="pypi",
    package="aider-chat", binary="aider", setup=_setup, argv=_argv, env=_env,
    outcome=_outcome, finish="whole-file", min_turns=1,
)
