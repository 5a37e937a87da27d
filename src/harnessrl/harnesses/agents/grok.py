"""Grok CLI (`@vibe-kit/grok-cli`): Chat Completions through the OpenAI JS SDK to
`GROK_BASE_URL`, not streamed in headless mode (`-p`); its shell tool is `bash`.

Traps:
- Headless `-p` auto-approves every operation and prints the conversation as one JSON
  chat message per line (user, assistant with `tool_calls`, tool, final assistant).
- It sends a non-standard `search_parameters: {"mode": "off"}` in every request (xAI's
  live search switch); the proxy accepts and records it.
- Its exit code lies: a failed model call (unreachable, 5xx after the SDK's retries) is
  caught inside the agent loop and becomes the final assistant message "Sorry, I
  encountered an error: ...", printed as a normal reply, exit code 0. Only an error
  outside the loop exits 1. The record is those printed messages: the run finished when
  the last one is an assistant reply without tool calls that is neither that error nor
  its "Maximum tool execution rounds reached" stop.
- Settings are kept in `~/.grok/user-settings.json`; the variables take precedence, so
  nothing is written there.
"""

from __future__ import annotations

from harnessrl.harnesses.base import ExitState, Harness, RunContext, json_lines

_FAILED = ("Sorry, I encountered an error:", "Error:",
           "Maximum tool execution rounds reached")


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return ["-p", instruction, "-d", str(ctx.workdir), "-m", ctx.model,
            "--max-tool-rounds", "50"]


def _env(ctx: RunContext) -> dict[str, str]:
    return {"GROK_BASE_URL": ctx.openai_base, "GROK_API_KEY": ctx.key, "GROK_MODEL": ctx.model}


def _outcome(_ctx: RunContext, code: int | None, stdout: bytes) -> ExitState:
    messages = [m for m in json_lines(stdout) if "role" in m]
    if not messages:
        return ExitState(False, f"no messages printed (exit code {code})")
    last = messages[-1]
    content = str(last.get("content") or "")
    detail = f"{len(messages)} messages, last {last.get('role')}: {content[:160]!r}, " \
             f"exit code {code}"
    finished = (code == 0 and last.get("role") == "assistant" and not last.get("tool_calls")
                and not content.startswith(_FAILED))
    return ExitState(finished, detail)


HARNESS = Harness(
    name="grok", version="0.0.34", dialect="openai_chat", registry="npm",
    package="@vibe-kit/grok-cli", binary="grok", streams=False, argv=_argv, env=_env,
    outcome=_outcome,
)
