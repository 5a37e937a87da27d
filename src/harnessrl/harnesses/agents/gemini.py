"""Gemini CLI: Gemini `streamGenerateContent?alt=sse` at `<base>/v1beta/models/<model>:...`,
with the key in `x-goog-api-key`; its shell tool is `run_shell_command`.

Traps:
- With only `GOOGLE_GEMINI_BASE_URL` set it picks the "gateway" auth type, which headless
  mode rejects ("Invalid auth method selected.", exit 41): `settings.json` must select
  `gemini-api-key`.
- Headless mode exits 55 in an untrusted directory unless
  `GEMINI_CLI_TRUST_WORKSPACE=true`.
- Without `--approval-mode yolo` the shell and write tools are not even offered.
- Tool schemas come as `parametersJsonSchema`, not `parameters`.
- Telemetry (Clearcut) to an outside host fails here without blocking it; settings turn
  it and the update check off anyway.
- It retries a failed call up to 10 times with long backoff by default; settings cap it.

Exit code: honest as far as seen (0 after a normal end; 145 on a 401, 244 after failed
retries on a 5xx). With `--output-format json` the result object (`response`, `stats`)
goes to stdout only on success; on failure an object with `error` goes to stderr. The
outcome reads stdout: finished means a result object with a `response` and no `error`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harnessrl.harnesses.base import ExitState, Harness, RunContext


def _settings() -> dict[str, Any]:
    return {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False,
                    # the proxy fails only when its engine does; the default 10 attempts
                    # with long backoff only make a failed rollout take minutes
                    "maxAttempts": 3},
    }


def _settings_path(ctx: RunContext) -> Path:
    return ctx.home / ".gemini" / "settings.json"


def _setup(ctx: RunContext) -> None:
    path = _settings_path(ctx)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_settings(), indent=2))


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return ["-p", instruction, "-m", ctx.model, "--approval-mode", "yolo",
            "--output-format", "json"]


def _env(ctx: RunContext) -> dict[str, str]:
    return {"GEMINI_API_KEY": ctx.key, "GOOGLE_GEMINI_BASE_URL": ctx.proxy_root,
            "GEMINI_CLI_TRUST_WORKSPACE": "true"}


def _result(stdout: bytes) -> dict[str, Any] | None:
    """The last top-level JSON object on stdout (it is pretty-printed over many lines)."""
    text = stdout.decode("utf-8", "replace")
    decoder = json.JSONDecoder()
    found, start = None, text.find("{")
    while start != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            found = value
        start = text.find("{", end)
    return found


def _outcome(_ctx: RunContext, code: int | None, stdout: bytes) -> ExitState:
    result = _result(stdout)
    if result is None:
        return ExitState(False, f"no JSON result on stdout (exit code {code})")
    if result.get("error"):
        return ExitState(False, f"error {json.dumps(result['error'])[:300]} (exit code {code})")
    finished = "response" in result
    return ExitState(finished, f"response {'present' if finished else 'missing'}, "
                             f"exit code {code}")


HARNESS = Harness(
    name="gemini", version="0.61.0", dialect="gemini", registry="npm",
    package="@google/gemini-cli", binary="gemini", setup=_setup, argv=_argv, env=_env,
    outcome=_outcome,
)
