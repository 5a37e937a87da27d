"""GitHub Copilot CLI in BYOK offline mode: Chat Completions (or Responses, or Anthropic
Messages) to a custom provider given by `COPILOT_PROVIDER_*`, streamed; no GitHub login.

Traps:
- `COPILOT_OFFLINE=true` with `COPILOT_PROVIDER_BASE_URL` skips GitHub authentication,
  telemetry, web tools, the GitHub MCP server and auto-update; without a base URL offline
  mode refuses to start.
- The npm package is a loader: the real CLI is the platform package
  `@github/copilot-linux-x64` (an optional dependency of the same version), which npm
  installs beside it; the first run unpacks it (a few seconds).
- `-p` alone still asks before each tool: `--allow-all-tools` is required headless (and
  `--allow-all-paths` so the sandbox's workdir counts as inside the trusted folder).
- The provider type picks the dialect: `openai` (Chat Completions, default; with
  `COPILOT_PROVIDER_WIRE_API=responses` the Responses API) or `anthropic` (Messages, the
  base URL without `/v1`).
- When the provider cannot be reached it retries five times (about 30 s) and exits 1, but
  the record is its event stream (`--output-format json`, one JSON event per line): a
  finished run ends with a `result` event whose `exitCode` is 0 and has no
  `session.error` event (failed calls that a retry recovered show as
  `model.call_failure` and do not count).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from harnessrl.harnesses.base import ExitState, Harness, RunContext, json_lines

VERSION = "1.0.102"


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return ["-p", instruction, "--allow-all-tools", "--allow-all-paths", "--model", ctx.model,
            "--output-format", "json", "--no-auto-update", "--disable-client-telemetry",
            "--log-dir", str(ctx.home / "copilot-logs"), "-C", str(ctx.workdir)]


def _env_for(kind: str, wire: str) -> Callable[[RunContext], dict[str, str]]:
    def env(ctx: RunContext) -> dict[str, str]:
        base = ctx.proxy_root if kind == "anthropic" else ctx.openai_base
        return {"COPILOT_OFFLINE": "true", "COPILOT_PROVIDER_BASE_URL": base,
                "COPILOT_PROVIDER_TYPE": kind, "COPILOT_PROVIDER_WIRE_API": wire,
                "COPILOT_PROVIDER_API_KEY": ctx.key, "COPILOT_MODEL": ctx.model,
                "COPILOT_PROVIDER_MAX_PROMPT_TOKENS": "100000",
                "COPILOT_PROVIDER_MAX_OUTPUT_TOKENS": "4096",
                "COPILOT_HOME": str(ctx.home / ".copilot"), "COPILOT_AUTO_UPDATE": "false"}
    return env


def _outcome(_ctx: RunContext, code: int | None, stdout: bytes) -> ExitState:
    events = json_lines(stdout)
    errors = [e for e in events if e.get("type") == "session.error"]
    if errors:
        return ExitState(False, f"error event {json.dumps(errors[-1])[:300]} "
                                f"(exit code {code})")
    result = next((e for e in reversed(events) if e.get("type") == "result"), None)
    if result is None:
        return ExitState(False, f"no result event (exit code {code})")
    status = result.get("exitCode", result.get("exit_code"))
    return ExitState(code == 0 and status in (0, None),
                     f"result {json.dumps(result)[:200]}, exit code {code}")


HARNESS = Harness(
    name="copilot", version=VERSION, dialect="openai_chat", registry="npm",
    package="@github/copilot", binary="copilot", argv=_argv, env=_env_for("openai", "completions"),
    outcome=_outcome,
)

VARIANTS = {
    "responses": dataclasses.replace(HARNESS, name="copilot@responses",
                                     dialect="openai_responses",
                                     env=_env_for("openai", "responses")),
    "anthropic": dataclasses.replace(HARNESS, name="copilot@anthropic", dialect="anthropic",
                                     env=_env_for("anthropic", "completions")),
}
