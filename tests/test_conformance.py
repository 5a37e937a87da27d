"""Every real harness and each of its dialect variants, unmodified and headless, writes
hello.txt through the proxy with the scripted policy; the workspace and the trace are
checked (see rollout/conformance.py). In chat mode all of them; in token mode (the proxy's
TokenEngine against the scripted completions server) the harnesses and variants issue 18
added, and a backend that drops a token, which the check must fail. Installs each pinned
harness into ~/.cache/harnessrl/tools on first use, those this session selected all at
once."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harnessrl.harnesses import all_variants, get
from harnessrl.proxy.engines.scripted_completions import ScriptedCompletions
from harnessrl.rollout.conformance import Result, check, policy_tokenizer
from tests.helpers import DropsAToken

pytestmark = [pytest.mark.harness, pytest.mark.slow]
TOOLS = Path("~/.cache/harnessrl/tools").expanduser()
NAMES = [h.name for h in all_variants()]
# Issue 18's harnesses, and every dialect variant (all of them came with it).
ISSUE_18 = {"continue", "copilot", "droid", "gptme", "grok", "mistral-vibe", "nanocoder",
            "openclaw", "terminus-2"}
TOKEN_NAMES = [h.name for h in all_variants() if h.family in ISSUE_18 or h.name != h.family]
# The token-mode runs overlap: a harness run mostly waits on its own start-up and the
# sandbox, and the suite's time budget is a few minutes for all of them.
TOKEN_WORKERS = 3
BROKEN = "pi"  # the harness the broken backend is tried with (one of the quickest)


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


def test_terminus_runs_under_a_home_too_deep_for_a_tmux_socket(installed, policy_tok,
                                                              tmp_path) -> None:
    """tmux's socket (HOME/tmux-UID/default) would pass the 107 bytes a socket path holds:
    the launcher moves it to a private directory under /tmp, and removes that after."""
    harness = get("terminus-2")
    harness.install(TOOLS, log=lambda _line: None)
    root = tmp_path / ("d" * 100)
    before = set(Path("/tmp").glob("hrl-tmux-*"))
    result = asyncio.run(check(harness, tokenizer=policy_tok, tools_dir=TOOLS, root=root))
    assert result.passed, f"{result.problems}\n{result.output[-3000:]}"
    assert set(Path("/tmp").glob("hrl-tmux-*")) == before


def _result(run: Result | Exception) -> Result:
    if isinstance(run, Exception):
        raise run
    return run


def _no_tools(name: str) -> bool:
    return get(name).finish in ("whole-file", "terminus-json")


@pytest.fixture(scope="module")
def token_runs(request, installed, policy_tok, tmp_path_factory
               ) -> dict[str, Result | Exception]:
    """The selected token-mode checks, TOKEN_WORKERS at a time; `!broken` is BROKEN's
    run against DropsAToken."""
    selected = {item.callspec.params["name"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")
                and item.originalname == "test_harness_writes_the_file_in_token_mode"}
    jobs = {name: (name, None) for name in sorted(selected)}
    if any(item.module is request.module
           and item.originalname == "test_the_token_arm_fails_a_backend_that_drops_a_token"
           for item in request.session.items):
        jobs["!broken"] = (BROKEN, DropsAToken)

    def run(job: tuple[str, type[ScriptedCompletions] | None]) -> Result | Exception:
        name, backend = job
        harness = get(name)
        root = tmp_path_factory.mktemp(f"token-{harness.slug}")
        extra = {} if backend is None else {"backend": backend}
        try:  # one run's error is its own test's, not every test's
            harness.install(TOOLS, log=lambda _line: None)
            return asyncio.run(check(harness, tokenizer=policy_tok, tools_dir=TOOLS,
                                     root=root, mode="token", **extra))
        except Exception as error:
            return error

    with ThreadPoolExecutor(max_workers=TOKEN_WORKERS) as pool:
        return dict(zip(jobs, pool.map(run, jobs.values()), strict=True))


@pytest.mark.parametrize("name", TOKEN_NAMES)
def test_harness_writes_the_file_in_token_mode(name: str, token_runs) -> None:
    """The same check through the proxy's token mode: the proxy renders every prompt and
    keeps the sampled ids, so each turn continuing a conversation extends it exactly."""
    result = _result(token_runs[name])
    assert result.mode == "token"
    assert result.passed, f"{result.problems}\n{result.output[-3000:]}"
    assert result.turns >= get(name).min_turns
    assert result.chain_extended is (None if _no_tools(name) else True)
    assert result.extension_rate in (None, 1.0)


def test_the_token_arm_fails_a_backend_that_drops_a_token(token_runs) -> None:
    result = _result(token_runs["!broken"])
    assert not result.passed and result.chain_extended is False
    assert "the turn carrying the tool result does not extend the call" in result.problems
