"""Token mode with a non-Hermes family, one real harness per dialect: the proxy renders
with `renderers`' Qwen3.5 renderer (XML tool calls, reasoning opened by the prompt) over a
tokenizer with Qwen3.5's special tokens built at test time, the scripted completions
server samples the conformance policy's replies in Qwen3.5's markup, and each harness
(unmodified, headless) writes hello.txt; the trace is checked as every conformance run is,
and every turn continuing a conversation extends it token for token."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from harnessrl.harnesses import get
from harnessrl.rollout.conformance import check
from tests.token_families import BY_NAME, family_tokenizer, speaking

pytestmark = [pytest.mark.harness, pytest.mark.slow]
TOOLS = Path("~/.cache/harnessrl/tools").expanduser()
FAMILY = BY_NAME["qwen3.5"]
# One harness per dialect: pi speaks three of them (quick to start), gemini-cli the fourth.
HARNESSES = ["pi", "pi@responses", "pi@anthropic", "gemini"]


@pytest.mark.parametrize("name", HARNESSES)
def test_harness_in_token_mode_on_a_renderers_family(name, tiny_model, tmp_path) -> None:
    harness = get(name)
    harness.install(TOOLS, log=lambda _line: None)
    tokenizer = family_tokenizer(tiny_model, FAMILY)
    result = asyncio.run(check(harness, tokenizer=tokenizer, tools_dir=TOOLS, root=tmp_path,
                               mode="token", token_options={"renderer": FAMILY.name},
                               speaks=speaking(FAMILY, tokenizer)))
    assert result.passed, f"{result.problems}\n{result.output[-3000:]}"
    assert result.chain_extended is True and result.extension_rate in (None, 1.0)
