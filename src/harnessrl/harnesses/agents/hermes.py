"""Hermes agent (NousResearch): Chat Completions through the openai SDK, streamed, with
native function calling (16 tools; the shell is `terminal`, files `write_file`).

Traps:
- Its exit code lies: after "API call failed after 3 retries" it prints the error text as
  the final response and exits 0. The truth is the `--usage-file` JSON report, which
  oneshot mode writes even on failure (`completed`, `failed`, `api_calls`).
- With a custom provider it probes the *root* of the base URL's host (`/api/v1/models`,
  `/api/tags`, `/v1/props`, `/props`, `/version`) before calling; the proxy 404s them.
- It checks for updates against the package registry on every run with a fresh HOME,
  unless `~/.hermes/.update_check` holds a fresh result (cached six hours), so we seed it.
- It needs a context length of at least 64K and otherwise tries to discover one; we state it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from harnessrl.harnesses.base import ExitState, Harness, RunContext

VERSION = "0.19.0"
CONTEXT_LENGTH = 131072  # hermes refuses models under 64K; stating it skips discovery


def _hermes_home(ctx: RunContext) -> Path:
    return ctx.home / ".hermes"


def _usage_file(ctx: RunContext) -> Path:
    return ctx.home / "hermes-usage.json"


def _config_yaml(ctx: RunContext) -> str:
    # JSON strings are valid YAML scalars, so quoting cannot break on odd characters.
    model = {"provider": "custom", "default": ctx.model, "base_url": ctx.openai_base,
             "api_key": ctx.key, "context_length": CONTEXT_LENGTH}
    lines = ["model:", *(f"  {k}: {json.dumps(v)}" for k, v in model.items())]
    return "\n".join(lines) + "\n"


def _setup(ctx: RunContext) -> None:
    home = _hermes_home(ctx)
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(_config_yaml(ctx))
    # A fresh "up to date" answer makes the update check skip its registry lookups.
    update = {"ts": time.time(), "behind": 0, "rev": None, "ver": VERSION}
    (home / ".update_check").write_text(json.dumps(update))


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    # -z: one prompt, only the final answer on stdout; --yolo: approve every command.
    return ["-z", instruction, "--yolo", "--usage-file", str(_usage_file(ctx))]


def _env(ctx: RunContext) -> dict[str, str]:
    return {"HERMES_HOME": str(_hermes_home(ctx)),
            "HERMES_INFERENCE_MODEL": ctx.model}


def _outcome(ctx: RunContext, code: int | None, _output: bytes) -> ExitState:
    path = _usage_file(ctx)
    if not path.is_file():
        return ExitState(False, f"no usage report written (exit code {code})")
    report = json.loads(path.read_text())
    finished = bool(report.get("completed")) and not report.get("failed")
    detail = (f"completed={report.get('completed')} failed={report.get('failed')} "
              f"api_calls={report.get('api_calls')} exit code {code}")
    if report.get("failure"):
        detail += f": {report['failure']}"
    return ExitState(finished, detail)


HARNESS = Harness(
    name="hermes", version=VERSION, dialect="openai_chat", registry="pypi",
    package="hermes-agent", binary="hermes", setup=_setup, argv=_argv, env=_env,
    outcome=_outcome,
)
