"""OpenCode: Chat Completions through `@ai-sdk/openai-compatible` (a custom provider in
`opencode.json`), streamed; its shell tool is `bash`. With the provider package
`@ai-sdk/anthropic` (bundled in the binary, nothing to fetch) it speaks Anthropic Messages
(`opencode@anthropic`).

Traps:
- Two calls per prompt: a session title (no tools), then the task (10 tools).
- `run` quotes every message argument that holds a space, escaping its inner quotes
  (`"Create a file..."`, `set \\"debug\\"`), and the model would see that; split into
  words, the numbers among them become JSON numbers and `run` crashes on them. What it
  reads on stdin it appends to the message as is, so the instruction goes there
  (`prompt_on_stdin`) and the model gets the text as written. (`--file` attaches a
  file, not the prompt.)
- At startup it fetches a model catalogue and tries to install provider packages from the
  package registry; here that fails without blocking it, and `OPENCODE_DISABLE_*` turns
  most of it off.
- Permission prompts cannot be answered headless: `--auto` approves everything that is
  not explicitly denied.
- The exit code is honest about API failures in the common case, but `--format json`
  prints its event stream, which is more precise: an `error` event means the run failed,
  and a finished run ends with a `step_finish` whose reason is not `tool-calls`. The
  outcome is read from those events.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl.harnesses.base import ExitState, Harness, RunContext, json_lines

PROVIDER = "harnessrl"


def provider_config(ctx: RunContext, npm: str = "@ai-sdk/openai-compatible") -> dict[str, Any]:
    """An `opencode.json` (also Kilo's schema) with one provider (OpenAI-compatible unless
    another AI SDK provider package is named; `@ai-sdk/anthropic` appends `/messages` to
    the same `/v1` base)."""
    return {
        "provider": {PROVIDER: {
            "npm": npm, "name": PROVIDER,
            "options": {"baseURL": ctx.openai_base, "apiKey": ctx.key},
            "models": {ctx.model: {"name": ctx.model}}}},
        "model": f"{PROVIDER}/{ctx.model}",
        "autoupdate": False, "share": "disabled",
    }


def _config_path(ctx: RunContext) -> Path:
    return ctx.home / ".config" / "opencode" / "opencode.json"


def _setup_for(npm: str) -> Callable[[RunContext], None]:
    def setup(ctx: RunContext) -> None:
        path = _config_path(ctx)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(provider_config(ctx, npm), indent=2))
    return setup


def run_flags(ctx: RunContext) -> list[str]:
    """`run` headless, approving everything, printing JSON events (OpenCode and Kilo)."""
    return ["run", "--model", f"{PROVIDER}/{ctx.model}", "--auto", "--format", "json",
            "--dir", str(ctx.workdir)]


def _argv(ctx: RunContext, _instruction: str) -> list[str]:
    return run_flags(ctx)  # the instruction comes on stdin


def _env(ctx: RunContext) -> dict[str, str]:
    return {"OPENCODE_CONFIG": str(_config_path(ctx)),
            "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            # its default plugins are fetched from the package registry at startup
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "OPENCODE_DISABLE_TERMINAL_TITLE": "1"}


def run_outcome(_ctx: RunContext, code: int | None, stdout: bytes) -> ExitState:
    """Finished when no error event was printed and the last step did not end on tool
    calls (the agent loop stopped by itself)."""
    seen = json_lines(stdout)
    errors = [e for e in seen if e.get("type") == "error"]
    if errors:
        return ExitState(False, f"error event {json.dumps(errors[-1])[:300]} "
                              f"(exit code {code})")
    steps = [e for e in seen if e.get("type") == "step_finish"]
    if not steps:
        return ExitState(False, f"no step finished (exit code {code})")
    reason = steps[-1].get("part", {}).get("reason")
    return ExitState(code == 0 and reason not in (None, "tool-calls"),
                   f"last step reason {reason!r}, exit code {code}")


HARNESS = Harness(
    name="opencode", version="1.18.33", dialect="openai_chat", registry="npm",
    package="opencode-ai", binary="opencode", setup=_setup_for("@ai-sdk/openai-compatible"),
    argv=_argv, env=_env, outcome=run_outcome, prompt_on_stdin=True,
)

VARIANTS = {
    "anthropic": dataclasses.replace(HARNESS, name="opencode@anthropic", dialect="anthropic",
                                     setup=_setup_for("@ai-sdk/anthropic")),
    "responses": dataclasses.replace(HARNESS, name="opencode@responses",
                                     dialect="openai_responses",
                                     setup=_setup_for("@ai-sdk/openai")),
}
