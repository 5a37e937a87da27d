"""Mistral Vibe (`vibe`): a generic provider in `$VIBE_HOME/config.toml` (`api_style`
`openai`: Chat Completions), streamed; its shell tool is `bash`.

Traps:
- 3.0.3 pins `certifi==2026.10.19`, which the package index does not serve (only a
  `.post1`), so it cannot be installed: pinned to 3.0.2. It needs Python >= 3.12 (3.0.0
  even 3.14); its venv uses 3.13, and its CLI is a Rust binary (`vibe/_bin/vibe-rs`)
  started by the Python entry point.
- Every dependency is pinned exactly, so it gets a venv of its own like every harness.
- `-p` is headless; `--auto-approve` approves every tool call (without it the default
  agent asks, and headless that is a refusal). `--trust` trusts the workdir for this run.
- The API key is read from the variable the provider names (`api_key_env_var`); the
  system keyring is off (`PYTHON_KEYRING_BACKEND` null), else it may block on D-Bus.
- Telemetry and update checks are on by default: off in the config. It retries a failing
  model API for minutes by default: `api_retry_max_elapsed_time` bounds that.
- `api_style` picks the dialect: `openai`, `openai-responses` or `anthropic` (the
  variants).
- Its exit code is meaningful (0 finished, 2 the model API failed after retries, 3 a limit
  or refusal), but the record is `--output-dir`'s `export.json`, written on every exit:
  its `outcome` is `finished` only when the agent finished.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from harnessrl.harnesses.base import ExitState, Harness, RunContext

VERSION = "3.0.2"
KEY_VARIABLE = "HARNESSRL_API_KEY"
RETRY_SECONDS = 30  # its default retries an unreachable model for minutes


def _vibe_home(ctx: RunContext) -> Path:
    return ctx.home / ".vibe"


def _export_dir(ctx: RunContext) -> Path:
    return ctx.home / "vibe-export"


def _config(ctx: RunContext, style: str) -> str:
    base = ctx.proxy_root if style == "anthropic" else ctx.openai_base
    q = json.dumps  # JSON strings are valid TOML basic strings
    return "\n".join([
        f"active_model = {q('policy')}", "enable_telemetry = false",
        "enable_update_checks = false",
        f"api_retry_max_elapsed_time = {RETRY_SECONDS}", "",
        "[[providers]]", f"name = {q('harnessrl')}", f"api_base = {q(base)}",
        f"api_key_env_var = {q(KEY_VARIABLE)}", f"api_style = {q(style)}",
        f"backend = {q('generic')}", "",
        "[[models]]", f"name = {q(ctx.model)}", f"provider = {q('harnessrl')}",
        f"alias = {q('policy')}", "max_output_tokens = 4096",
    ]) + "\n"


def _setup_for(style: str) -> Callable[[RunContext], None]:
    def setup(ctx: RunContext) -> None:
        home = _vibe_home(ctx)
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(_config(ctx, style))
    return setup


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return ["-p", instruction, "--auto-approve", "--trust", "--workdir", str(ctx.workdir),
            "--output", "json", "--output-dir", str(_export_dir(ctx)), "--max-turns", "50"]


def _env(ctx: RunContext) -> dict[str, str]:
    return {"VIBE_HOME": str(_vibe_home(ctx)), KEY_VARIABLE: ctx.key,
            "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}


def _outcome(ctx: RunContext, code: int | None, _output: bytes) -> ExitState:
    path = _export_dir(ctx) / "export.json"
    if not path.is_file():
        return ExitState(False, f"no export.json written (exit code {code})")
    export = json.loads(path.read_text())
    outcome = export.get("outcome")
    error = export.get("error") or {}
    detail = f"outcome {outcome!r}, exit code {code}"
    if error:
        detail += f": {str(error.get('message', error))[:200]}"
    return ExitState(outcome == "finished", detail)


HARNESS = Harness(
    name="mistral-vibe", version=VERSION, dialect="openai_chat", registry="pypi",
    package="mistral-vibe", binary="vibe", python="3.13", setup=_setup_for("openai"),
    argv=_argv, env=_env, outcome=_outcome,
)

VARIANTS = {
    "responses": dataclasses.replace(HARNESS, name="mistral-vibe@responses",
                                     dialect="openai_responses",
                                     setup=_setup_for("openai-responses")),
    "anthropic": dataclasses.replace(HARNESS, name="mistral-vibe@anthropic",
                                     dialect="anthropic", setup=_setup_for("anthropic")),
}
