"""Kilo (an OpenCode fork): Chat Completions through `@ai-sdk/openai-compatible`, a custom
provider in the file `KILO_CONFIG` names (OpenCode's schema), streamed; its shell tool is
`bash`.

Traps:
- The wrapper package `@kilocode/cli` 7.8.1 does not install (its postinstall wants a
  platform package 7.8.1 that was never published), so the platform package
  `@kilocode/cli-linux-x64` 7.7.9 is installed instead. It declares no `bin`, so the
  binary is not in `node_modules/.bin`: `executable` points into the package.
- At startup it contacts its own API, a model catalogue and PostHog; here they fail
  without blocking it. `KILO_TELEMETRY_LEVEL` other than "all" turns telemetry off,
  `KILO_DISABLE_*` and `enabled_providers` most of the rest. Startup still takes ~10 s
  (a silent ~4 s wait after the session is created).
- When the endpoint cannot be reached at all (connection refused) it does not fail: it
  marks the session "offline" and retries every 5 s until killed, so such a run ends by
  the sandbox timeout. (5xx answers do end it: 5 tries, then exit 1.)
- One task call, 21 tools; the prompt arrives as written plus an `<environment_details>`
  block. Like OpenCode's `run`, it quotes a message argument that holds a space (escaping
  its quotes), but not the arguments after `--`, which it joins as they are: the
  instruction goes there, whole.
- Like OpenCode, `--auto` approves everything, and the outcome is read from the
  `--format json` event stream (see `opencode.run_outcome`), not only the exit code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harnessrl.harnesses.agents.opencode import PROVIDER, provider_config, run_flags, run_outcome
from harnessrl.harnesses.base import Harness, RunContext

PLATFORM_PACKAGE = "@kilocode/cli-linux-x64"


@dataclass(frozen=True)
class _PlatformBinaryHarness(Harness):
    """An npm harness whose binary lives in its package's own `bin/`, unlinked."""

    def executable(self, tools_dir: Path) -> Path:
        return (self.prefix(tools_dir) / "node_modules" / self.package / "bin"
                / self.binary)


def _config_path(ctx: RunContext) -> Path:
    return ctx.home / "kilo.json"


def _setup(ctx: RunContext) -> None:
    # only our provider: its built-in gateway provider would fetch a model list first
    config = {**provider_config(ctx), "enabled_providers": [PROVIDER]}
    _config_path(ctx).write_text(json.dumps(config, indent=2))


def _env(ctx: RunContext) -> dict[str, str]:
    return {"KILO_CONFIG": str(_config_path(ctx)),
            "KILO_TELEMETRY_LEVEL": "off",  # PostHog is on unless this says "all"
            "KILO_DISABLE_AUTOUPDATE": "1", "KILO_DISABLE_MODELS_FETCH": "1",
            "KILO_DISABLE_SHARE": "1", "KILO_DISABLE_SESSION_INGEST": "1",
            "KILO_DISABLE_PRESENCE": "1", "KILO_DISABLE_LSP_DOWNLOAD": "1",
            "KILO_DISABLE_CODEBASE_INDEXING": "1", "KILO_DISABLE_TERMINAL_TITLE": "1",
            # its default plugins are fetched from the package registry at startup
            "KILO_DISABLE_DEFAULT_PLUGINS": "1"}


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return [*run_flags(ctx), "--", instruction]


HARNESS = _PlatformBinaryHarness(
    name="kilo", version="7.7.9", dialect="openai_chat", registry="npm",
    package=PLATFORM_PACKAGE, binary="kilo", setup=_setup, argv=_argv, env=_env,
    outcome=run_outcome,
)
