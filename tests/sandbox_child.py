"""A `harnessrl` command for tests/test_sandbox_owners.py to kill: the CLI as it is, with
one more harness, `sleeper`, whose agent only sleeps (so a rollout is mid-way when the
test signals the command).

Usage: python tests/sandbox_child.py TOOLS_DIR harnessrl-args...
"""

from __future__ import annotations

import sys
from pathlib import Path

import harnessrl.harnesses
from harnessrl.cli import main
from harnessrl.harnesses.base import Harness

SLEEPER = Harness(name="sleeper", version="1", dialect="openai_chat", registry="pypi",
                  package="sleeper", binary="sleeper")


def install_sleeper(tools: Path) -> None:
    """The agent: a shell that starts a child which leaves the process group (setsid),
    then sleeps; both carry the sandbox's marker."""
    executable = SLEEPER.executable(tools)
    executable.parent.mkdir(parents=True, exist_ok=True)
    executable.write_text("#!/bin/sh\necho agent-started\nsetsid sleep 600 &\n"
                          "exec sleep 600\n")
    executable.chmod(0o755)


def with_sleeper(get):
    return lambda name: SLEEPER if name == "sleeper" else get(name)


if __name__ == "__main__":
    install_sleeper(Path(sys.argv[1]))
    harnessrl.harnesses.get = with_sleeper(harnessrl.harnesses.get)
    sys.exit(main(sys.argv[2:]))
