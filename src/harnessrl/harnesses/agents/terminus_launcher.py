"""Runs Harbor's Terminus 2 agent outside Harbor's container lifecycle, in the sandbox it
is started in: a local environment (each command a `bash -c` subprocess in the workdir)
stands in for Harbor's container, and its LiteLLM model points at the capture proxy.

Not imported by harnessrl: the harness prefix's own Python (which has `harbor`) runs this
file, copied into the rollout's HOME by `terminus.py`:

    python terminus_launcher.py WORKDIR LOGS_DIR INSTRUCTION

The model, its base URL and key come from HARNESSRL_MODEL, OPENAI_API_BASE and
OPENAI_API_KEY. The record of the run is Harbor's own trajectory (LOGS_DIR/trajectory.json).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.agents.terminus_2.terminus_2 import Terminus2  # pyright: ignore[reportMissingImports]
from harbor.agents.terminus_2.tmux_session import (  # pyright: ignore[reportMissingImports]
    TmuxSession,
)
from harbor.environments.base import ExecResult  # pyright: ignore[reportMissingImports]
from harbor.models.agent.context import AgentContext  # pyright: ignore[reportMissingImports]


class _TrialPaths:
    def __init__(self, logs: Path) -> None:
        self.agent_dir = logs


class LocalEnvironment:
    """The part of Harbor's `BaseEnvironment` that Terminus 2 and its tmux session use:
    commands run here, as this user (the sandbox's), never as root."""

    default_user = None

    def __init__(self, workdir: Path, logs: Path) -> None:
        self.workdir = workdir
        self.trial_paths = _TrialPaths(logs)
        self.session_id = "harnessrl"

    async def exec(self, command: str, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout_sec: int | None = None,
                   user: Any = None) -> ExecResult:
        process = await asyncio.create_subprocess_exec(
            "bash", "-c", command, cwd=cwd or str(self.workdir),
            env={**os.environ, **(env or {})}, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout_sec)
        except TimeoutError:
            process.kill()
            out, err = await process.communicate()
            return ExecResult(stdout=out.decode(errors="replace"),
                              stderr=err.decode(errors="replace"), return_code=124)
        return ExecResult(stdout=out.decode(errors="replace"),
                          stderr=err.decode(errors="replace"),
                          return_code=process.returncode or 0)

    async def is_dir(self, path: str, user: Any = None) -> bool:
        return Path(path).is_dir()


class LocalTerminus2(Terminus2):
    """Terminus 2 whose tmux pane log goes to the logs directory (Harbor's default,
    /logs/agent, exists only in its containers) and which records no asciinema cast."""

    async def setup(self, environment: Any) -> None:
        self._session = TmuxSession(
            session_name=self.name(), environment=environment,
            logging_path=PurePosixPath(environment.trial_paths.agent_dir) / "terminus_2.pane",
            local_asciinema_recording_path=None, remote_asciinema_recording_path=None,
            pane_width=self.options.tmux_pane_width,
            pane_height=self.options.tmux_pane_height, extra_env=self._extra_env, user=None)
        await self._session.start()


# A Unix socket's path holds at most 107 bytes; tmux's is TMUX_TMPDIR/tmux-UID/default.
SOCKET_PATH_MAX = 107


def short_tmux_tmpdir() -> str | None:
    """A private directory under /tmp for tmux's socket when TMUX_TMPDIR (the sandbox's
    HOME) is too deep for one (tmux would fail with "File name too long"); None if it fits.
    Not TMPDIR (the sandbox's tmp/, as deep as HOME), and not /tmp itself: every rollout
    there would share one tmux server. A confined sandbox shows its own tmp/ as /tmp."""
    socket = f"{os.environ.get('TMUX_TMPDIR', '/tmp')}/tmux-{os.getuid()}/default"
    if len(socket.encode()) <= SOCKET_PATH_MAX:
        return None
    os.environ["TMUX_TMPDIR"] = tempfile.mkdtemp(prefix="hrl-tmux-", dir="/tmp")  # mode 0700
    return os.environ["TMUX_TMPDIR"]


async def main(workdir: Path, logs: Path, instruction: str) -> None:
    if shutil.which("tmux") is None:
        # Terminus 2 would try apt, then building tmux from a download: neither here.
        sys.exit("terminus-2 needs tmux on PATH (Debian package tmux)")
    logs.mkdir(parents=True, exist_ok=True)
    short = short_tmux_tmpdir()
    try:
        await run(workdir, logs, instruction)
    finally:
        if short:
            shutil.rmtree(short, ignore_errors=True)


async def run(workdir: Path, logs: Path, instruction: str) -> None:
    environment = LocalEnvironment(workdir, logs)
    agent = LocalTerminus2(
        logs_dir=logs, model_name=f"openai/{os.environ['HARNESSRL_MODEL']}",
        api_base=os.environ["OPENAI_API_BASE"],
        llm_kwargs={"api_key": os.environ["OPENAI_API_KEY"]},
        record_terminal_session=False, enable_summarize=False, max_turns=30,
        suppress_max_turns_warning=True)
    await agent.setup(environment)
    try:
        await agent.run(instruction, environment, AgentContext())
    finally:
        await environment.exec(f"tmux kill-session -t {agent.name()}")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]))
