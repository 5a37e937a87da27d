"""gptme: the `local` provider (the openai SDK to `OPENAI_BASE_URL`), Chat Completions,
streamed; with `--tool-format tool` its tools are native function calls (the shell is
`shell`).

Traps:
- Its default tool format is markdown code blocks parsed from the reply text; `tool`
  makes it send a `tools` list and read `tool_calls`, which is what a policy trained on
  function calling writes.
- `-n` (non-interactive) implies `-y`; it stops when a reply runs no tool. Without
  `--no-workspace` it runs the workspace's context command and reads project files into
  the prompt; `--context files` keeps the files but no command.
- Conversation logs go to `$XDG_DATA_HOME/gptme/logs` (inside HOME here); its config
  `~/.config/gptme/config.toml` is not needed.
- It ends a session on its `complete` tool; a reply without a tool call gets a nudge
  ("Did you mean to finish?"), and after two it exits 0 anyway. Its exit code is not the
  record: `--output-format json` prints every message as one JSON object per line, and
  the run finished when the `complete` tool's confirmation is among them.
- An unreachable model is retried 11 times with backoff up to 60 s (minutes in all); the
  sandbox's deadline ends it, and the record then shows no `complete`.
- At start it tries to download a tiktoken encoding (fails here; it falls back to a
  character estimate after a few seconds of retries).
"""

from __future__ import annotations

from harnessrl.harnesses.base import ExitState, Harness, RunContext, json_lines


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return ["-n", "-m", f"local/{ctx.model}", "--tool-format", "tool", "-w", str(ctx.workdir),
            "--output-format", "json", "--no-workspace", "-t", "shell,save,patch,read,complete",
            instruction]


def _env(ctx: RunContext) -> dict[str, str]:
    return {"OPENAI_BASE_URL": ctx.openai_base, "OPENAI_API_KEY": ctx.key}


def _outcome(_ctx: RunContext, code: int | None, stdout: bytes) -> ExitState:
    """Finished when the agent called `complete` and gptme confirmed it; a session that
    merely ran out of replies without tools ("No tools used after 2 confirmations") or
    whose model calls failed did not finish."""
    messages = [r for r in json_lines(stdout) if r.get("type") == "message"]
    if not messages:
        return ExitState(False, f"no messages printed (exit code {code})")
    completed = any(m.get("role") == "system" and (m.get("metadata") or {}).get("tool")
                    == "complete" for m in messages)
    last = messages[-1]
    detail = (f"{len(messages)} messages, complete called: {completed}, last "
              f"{last.get('role')}: {str(last.get('content'))[:160]!r}, exit code {code}")
    return ExitState(completed and code == 0, detail)


HARNESS = Harness(
    name="gptme", version="0.35.1", dialect="openai_chat", registry="pypi",
    package="gptme", binary="gptme", python="3.13", argv=_argv, env=_env, outcome=_outcome,
    finish="finish-tool",
)
