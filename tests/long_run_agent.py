"""A scripted agent for the long-run tests: a real process that talks to the capture proxy
through the `openai` SDK (three chat calls on one history), and passes its task when the
model's last answer has an even length; `agent-split*` passes when its sample index is even
instead, so every group of two has a reward spread whatever the model says (a trainer that
skips steps without a gradient then still steps each time). `harness(name)` wraps it as a
harness; `main` runs `harnessrl` with the `agent-*` names resolving to it (for a subprocess
to kill)."""

from __future__ import annotations

import sys
from pathlib import Path

from harnessrl.harnesses.base import Harness

SCRIPT = Path(__file__).with_name("long_run_agent_script.py")


class ScriptAgent(Harness):
    def executable(self, tools_dir: Path) -> Path:
        return Path(sys.executable)


def harness(name: str) -> Harness:
    script = SCRIPT
    return ScriptAgent(
        name=name, version="1", dialect="openai_chat", registry="pypi", package="-",
        binary="python", argv=lambda ctx, instruction: [str(script), instruction],
        env=lambda ctx: {"AGENT_BASE": ctx.openai_base, "AGENT_KEY": ctx.key,
                         "AGENT_NAME": name, "AGENT_SAMPLE": _sample(ctx.home)})


def _sample(home: Path) -> str:
    """The rollout's sample index, from its sandbox's name (the runner's
    `<harness>.<task>.<sample>.<attempt>.<key>`, with home/ inside)."""
    return home.parent.name.rsplit(".", 3)[1]


def install() -> None:
    """`agent-*` harness names resolve to the scripted agent."""
    import harnessrl.harnesses as registry

    known = registry.get
    registry.get = lambda name: harness(name) if name.startswith("agent-") else known(name)


if __name__ == "__main__":
    install()
    from harnessrl.cli import main

    sys.exit(main(sys.argv[1:]))
