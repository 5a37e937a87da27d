"""Terminus 2 (Harbor's own terminal agent, PyPI `harbor`): run outside Harbor's container
lifecycle by `terminus_launcher.py` with the prefix's Python, against the sandbox itself
(a local environment: commands are subprocesses in the workdir; the agent's terminal is a
tmux session, tmux from Debian). LiteLLM (`openai/<model>`, `api_base` the proxy) sends
Chat Completions, not streamed, with no tools: the agent answers in JSON (`analysis`,
`plan`, `commands` of `keystrokes`, `task_complete`) and sees the pane as text.

Traps:
- Harbor has no local environment: every environment is a container or a cloud
  sandbox, and the agent is normally installed inside it at trial time. The launcher
  hands Terminus 2 the few methods it calls (`exec`, `is_dir`, `trial_paths`) instead.
- Its tmux session logs the pane to `/logs/agent` and records an asciinema cast (which it
  would install with apt or pip); the launcher logs into HOME and records nothing.
- `task_complete: true` is not the end: it asks "Are you sure...?" and stops only on a
  second `task_complete` right after; until then it keeps calling the model (up to its
  turn limit, here 30).
- A reply cut at `max_tokens` is answered with "re-issue this request" inside the same
  turn, recursively, and every level retries a failed call 3 times (LiteLLM, inside, 3
  more, 4-15 s apart): against a noise model one turn never ends. Only the deadline, or
  `max_model_calls` and then the deadline, stops it.
- Errors from the model (unreachable, 5xx) are retried by LiteLLM and then raised out of
  `run`, but the record is Harbor's own trajectory (`trajectory.json`, ATIF), written even
  then: the run finished when its last two agent steps both mark the task complete.
- `tmux` keeps its socket under `TMUX_TMPDIR` (HOME here; `/tmp` may be shared; under a
  HOME too deep for a socket path, a private directory the launcher makes in /tmp). Without
  tmux on PATH it would try apt, then a source build from a download: the launcher stops
  first and says so.
- The trajectory holds the API key (`agent.extra.llm_kwargs`): here the rollout's own key.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from harnessrl.harnesses.base import ExitState, Harness, RunContext

LAUNCHER = Path(__file__).with_name("terminus_launcher.py")
COMPLETE = "mark_task_complete"


def _logs(ctx: RunContext) -> Path:
    return ctx.home / "terminus"


def _setup(ctx: RunContext) -> None:
    _logs(ctx).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(LAUNCHER, ctx.home / LAUNCHER.name)


def _argv(ctx: RunContext, instruction: str) -> list[str]:
    return [str(ctx.home / LAUNCHER.name), str(ctx.workdir), str(_logs(ctx)), instruction]


def _env(ctx: RunContext) -> dict[str, str]:
    return {"OPENAI_API_BASE": ctx.openai_base, "OPENAI_API_KEY": ctx.key,
            "HARNESSRL_MODEL": ctx.model, "TMUX_TMPDIR": str(ctx.home),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}


def _completes(step: dict[str, Any]) -> bool:
    return any(c.get("function_name") == COMPLETE for c in step.get("tool_calls") or [])


def _outcome(ctx: RunContext, code: int | None, _stdout: bytes) -> ExitState:
    path = _logs(ctx) / "trajectory.json"
    if not path.is_file():
        return ExitState(False, f"no trajectory.json (exit code {code})")
    steps = json.loads(path.read_text()).get("steps", [])
    agent = [s for s in steps if s.get("source") == "agent"]
    confirmed = len(agent) >= 2 and _completes(agent[-1]) and _completes(agent[-2])
    last = agent[-1] if agent else {}
    detail = (f"{len(agent)} agent steps, completion confirmed: {confirmed}, last "
              f"{str(last.get('message'))[:160]!r}, exit code {code}")
    return ExitState(confirmed and code == 0, detail)


HARNESS = Harness(
    name="terminus-2", version="0.26.0", dialect="openai_chat", registry="pypi",
    package="harbor", binary="python", python="3.13", streams=False, setup=_setup,
    argv=_argv, env=_env, outcome=_outcome, finish="terminus-json",
)
