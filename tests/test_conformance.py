"""Every real harness and each of its dialect variants, unmodified and headless, writes
hello.txt through the proxy with the scripted policy; the workspace and the trace are
checked (see rollout/conformance.py). Installs each pinned harness into
~/.cache/harnessrl/tools on first use, those this session selected all at once."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harnessrl.harnesses import all_variants, get
from harnessrl.rollout.conformance import check, policy_tokenizer

pytestmark = [pytest.mark.harness, pytest.mark.slow]
TOOLS = Path("~/.cache/harnessrl/tools").expanduser()
NAMES = [h.name for h in all_variants()]


@pytest.fixture(scope="module")
def policy_tok():
    return policy_tokenizer()


@pytest.fixture(scope="module")
def installed(request) -> None:
    """Installs overlap: most of the time goes to the registries, not to these two cores."""
    selected = {item.callspec.params["name"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")}
    families = {get(name).family: get(name) for name in sorted(selected)}
    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(lambda h: h.install(TOOLS, log=lambda _line: None), families.values()))


@pytest.mark.parametrize("name", NAMES)
def test_harness_writes_the_file_through_the_proxy(name: str, installed, policy_tok,
                                                   tmp_path) -> None:
    harness = get(name)
    harness.install(TOOLS, log=lambda _line: None)
    result = asyncio.run(check(harness, tokenizer=policy_tok, tools_dir=TOOLS, root=tmp_path))
    assert result.passed, f"{result.problems}\n{result.output[-3000:]}"
    assert result.turns >= harness.min_turns
    # The turn carrying the tool result extends the call's turn token for token; aider
    # and Terminus 2 have no tools (they edit or type in text), so none of their turns
    # carries a tool result.
    assert result.chain_extended is (None if harness.finish in ("whole-file", "terminus-json")
                                     else True)
