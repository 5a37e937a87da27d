"""Every harness against real vLLM serving the tiny random model: its output is noise, so
the task may fail, but the wire must not: every call is answered and stored without a
proxy error, with exact tokens, in the harness's own dialect."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from harnessrl.harnesses import MODULES, get
from harnessrl.harnesses.base import RunContext
from harnessrl.proxy.engines.vllm import VLLMEngine
from harnessrl.proxy.engines.vllm_server import VLLMServer
from harnessrl.rollout.conformance import instruction_for, random_line
from harnessrl.rollout.sandbox.local import LocalSandbox
from harnessrl.types import Sampling
from tests.helpers import CACHE, ServedProxy, make_proxy

pytestmark = [pytest.mark.vllm, pytest.mark.harness, pytest.mark.slow]
TOOLS = Path("~/.cache/harnessrl/tools").expanduser()
# Noise replies keep some harnesses calling for minutes (Terminus 2 re-asks inside one turn
# without end: 276 calls in 240 s). The step cap ends most runs early, and the calls it
# refuses are checked for what they are; a harness that still retries them is killed at the
# deadline, and the one call in flight then (if any) is recorded as cancelled.
MAX_MODEL_CALLS = 16
DEADLINE = 90


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory):
    server = VLLMServer(model=str(tiny_model), served_name="tiny", dtype="float32",
                        max_model_len=65536, extra_args=["--seed", "0"],
                        log_path=CACHE / "vllm-harness-test.log")
    with server:
        # Short noise replies: the harness's own max_tokens (often 32000) would take minutes.
        proxy = make_proxy(VLLMEngine(server.url), tmp_path_factory.mktemp("run"),
                           sampling=Sampling(max_tokens=48))
        with ServedProxy(proxy).running() as served:
            yield served


@pytest.mark.parametrize("name", sorted(MODULES))
def test_harness_on_real_vllm_has_a_clean_wire(served, name: str, tmp_path: Path) -> None:
    harness = get(name)
    harness.install(TOOLS, log=lambda _line: None)
    rollout = httpx.post(f"{served.url}/rollouts", json={"metadata": {"harness": name},
                                                       "max_model_calls": MAX_MODEL_CALLS}).json()

    async def run() -> bool:
        sandbox = await LocalSandbox.create(tmp_path, "box")
        try:
            ctx = RunContext(home=sandbox.home, workdir=sandbox.workdir,
                             proxy_root=rollout["base_url"], key=rollout["key"],
                             tools_dir=TOOLS)
            harness.setup(ctx)
            result = await sandbox.run(harness.command(ctx, instruction_for(random_line())),
                                       env=harness.environment(ctx), timeout=DEADLINE)
            return result.timed_out
        finally:
            await sandbox.close()

    killed = asyncio.run(run())
    turns = served.store.turns(rollout["key"])
    assert turns, "the harness made no model call"
    if killed and turns[-1].status == "cancelled":
        turns.pop()  # in flight when the deadline killed the harness
    refused = [t for t in turns if t.error_kind == "step_cap"]
    assert all(t.index >= MAX_MODEL_CALLS for t in refused), "refused below the cap"
    for turn in (t for t in turns if t.error_kind != "step_cap"):
        assert turn.status == "ok", f"turn {turn.index}: {turn.error}"
        assert turn.flags == () and turn.dialect == harness.dialect
        tokens = turn.completion.tokens
        assert len(tokens.logprobs) == len(tokens.completion_ids) > 0 and tokens.prompt_ids
