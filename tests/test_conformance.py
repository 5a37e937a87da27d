"""Every real harness, unmodified and headless, writes hello.txt through the proxy with the
scripted policy; the workspace and the trace are checked (see rollout/conformance.py).
Installs each pinned harness into ~/.cache/harnessrl/tools on first use."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from harnessrl.harnesses import MODULES, get
from harnessrl.rollout.conformance import check, policy_tokenizer

pytestmark = [pytest.mark.harness, pytest.mark.slow]
TOOLS = Path("~/.cache/harnessrl/tools").expanduser()


@pytest.fixture(scope="module")
def policy_tok():
    return policy_tokenizer()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_harness_writes_the_file_through_the_proxy(name: str, policy_tok, tmp_path) -> None:
    harness = get(name)
    harness.install(TOOLS, log=lambda _line: None)
    result = asyncio.run(check(harness, tokenizer=policy_tok, tools_dir=TOOLS, root=tmp_path))
    assert result.passed, f"{result.problems}\n{result.output[-3000:]}"
    assert result.turns >= harness.min_turns
    # The turn carrying the tool result extends the call's turn token for token; aider
    # has no tools (it edits in text), so none of its turns carries a tool result.
    assert result.chain_extended is (None if harness.finish == "whole-file" else True)
