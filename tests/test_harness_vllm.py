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
from harnessrl.rollout.sandbox import LocalSandbox
from harnessrl.types import Sampling
from tests.helpers import CACHE, ServedProxy, make_proxy

pytestmark = [pytest.mark.vllm, pytest.mark.harness, pytest.mark.slow]
TOOLS = Path("~/.cache/harnessrl/tools").expanduser()


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
    rollout = httpx.post(f"{served.url}/rollouts", json={"metadata": {"harness": name}}).json()

    async def run() -> None:
        sandbox = await LocalSandbox.create(tmp_path, "box")
        try:
            ctx = RunContext(home=sandbox.home, workdir=sandbox.workdir,
                             proxy_root=rollout["base_url"], key=rollout["key"],
                             tools_dir=TOOLS)
            harness.setup(ctx)
            await sandbox.run(harness.command(ctx, instruction_for(random_line())),
                              env=harness.environment(ctx), timeout=240)
        finally:
            await sandbox.close()

    asyncio.run(run())
    turns = served.store.turns(rollout["key"])
    assert turns, "the harness made no model call"
    for turn in turns:
        assert turn.status == "ok", f"turn {turn.index}: {turn.error}"
        assert turn.flags == () and turn.dialect == harness.dialect
        tokens = turn.completion.tokens
        assert len(tokens.logprobs) == len(tokens.completion_ids) > 0 and tokens.prompt_ids
