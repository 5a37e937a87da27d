"""The docker sandbox: run where a daemon answers, skipped with the reason where not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harnessrl.rollout.docker import DockerSandbox, docker_problem

PROBLEM = docker_problem()
IMAGE = os.environ.get("HARNESSRL_DOCKER_IMAGE", "python:3.11-slim")
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"docker sandbox: {PROBLEM}")


async def test_commands_files_env_and_timeout(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "planted-secret")
    box = await DockerSandbox.start(tmp_path, "box", image=IMAGE)
    try:
        result = await box.run("echo hi > out.txt; env", timeout=30)
        assert result.exit_code == 0 and b"planted-secret" not in result.stdout
        assert (box.workdir / "out.txt").read_text() == "hi\n"
        slow = await box.run("sleep 30", timeout=2)
        assert slow.timed_out and slow.exit_code is None
    finally:
        await box.close()
    assert not box.directory.exists()

