"""OpenHands CLI: Chat Completions through litellm (`openai/<model>` + a custom base), not
streamed, with native function calling (6 tools; the shell is `terminal`, and a run ends
with the `finish` tool).

Traps:
- Its exit code lies: 0 after the SDK gave up on a failing model (15 calls over ~2 min).
  The truth is the conversation it persists: `execution_status` in `base_state.json` is
  "finished" only when the agent called `finish` (else "error", "stuck", "running", ...).
- LLM_MODEL / LLM_BASE_URL / LLM_API_KEY are ignored without `--override-with-envs`.
- `terminal` requires `security_risk` (an enum); a call without a valid value fails the
  tool's validation.
- It sends `reasoning_effort: "high"` and a `prompt_cache_key` even for an unknown model.
- litellm fetches its price map three times (~10 s) unless told to use the bundled one.
- Not switchable off: it clones a public skills repository (fails fast offline, retried
  a few times, non-blocking) and asks the package registry for a newer version.
"""

from __future__ import annotations

import json
from pathlib import Path

from harnessrl.harnesses.base import ExitState, Harness, RunContext


def _persistence(ctx: RunContext) -> Path:
    return ctx.home / ".openhands"


def _argv(_ctx: RunContext, instruction: str) -> list[str]:
    # --headless: no UI, approves every action; --override-with-envs: read LLM_* below.
    return ["--headless", "--override-with-envs", "--exit-without-confirmation",
            "-t", instruction]


def _env(ctx: RunContext) -> dict[str, str]:
    return {"LLM_MODEL": f"openai/{ctx.model}", "LLM_BASE_URL": ctx.openai_base,
            "LLM_API_KEY": ctx.key,
            "OPENHANDS_PERSISTENCE_DIR": str(_persistence(ctx)),
            "OPENHANDS_WORK_DIR": str(ctx.workdir),
            "OPENHANDS_SUPPRESS_BANNER": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def _outcome(ctx: RunContext, code: int | None, _output: bytes) -> ExitState:
    states = sorted((_persistence(ctx) / "conversations").glob("*/base_state.json"),
                    key=lambda path: path.stat().st_mtime)
    if not states:
        return ExitState(False, f"no conversation persisted (exit code {code})")
    status = json.loads(states[-1].read_text()).get("execution_status")
    return ExitState(status == "finished", f"execution_status {status!r}, exit code {code}")


HARNESS = Harness(
    name="openhands", version="1.16.0", dialect="openai_chat", registry="pypi",
    package="openhands", binary="openhands", python="3.12", streams=False, argv=_argv,
    env=_env, outcome=_outcome, finish="finish-tool",
)
