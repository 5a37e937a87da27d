"""Token mode per model family, on `renderers` (hand-coded families) or the model's own
chat template with vLLM's parser by name (LFM2): a tokenizer with the family's special
tokens built at test time, the scripted completions server sampling the family's own
tool-call and reasoning markup, through the proxy to an OpenAI client. Each family:
render, sample, parse (the client gets the tool call), and the next turn's prompt extends
the last prompt + completion exactly. Then the refusals and broken markup."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from harnessrl.proxy.engines.scripted import Reply, replay
from harnessrl.proxy.engines.scripted_completions import ScriptedCompletions
from harnessrl.proxy.engines.token.engine import TokenEngine
from harnessrl.proxy.serve import in_thread, running
from harnessrl.rollout.analysis.chains import exclusion, extends
from tests.token_families import BY_NAME, FAMILIES, Family, engine_settings, family_tokenizer

BASH = {"type": "object", "properties": {"command": {"type": "string"}},
        "required": ["command"]}
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a command.",
                                           "parameters": BASH}}]


def _rollout(url: str) -> str:
    resp = httpx.post(f"{url}/rollouts", json={"metadata": {"harness": "driver"}})
    resp.raise_for_status()
    return resp.json()["key"]


def _ask(client, messages, *, stream: bool) -> dict:
    if not stream:
        message = client.chat.completions.create(model="m", messages=messages,
                                                 tools=TOOLS).choices[0].message
        return message.model_dump(exclude_none=True)
    text, reasoning, calls = "", "", {}
    for chunk in client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                                stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        text += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for c in delta.tool_calls or []:
            entry = calls.setdefault(c.index, {"id": c.id, "type": "function",
                                               "function": {"name": "", "arguments": ""}})
            entry["function"]["name"] += (c.function.name or "") if c.function else ""
            entry["function"]["arguments"] += (c.function.arguments or "") if c.function \
                else ""
    out: dict = {"role": "assistant", "content": text}
    if reasoning:
        out["reasoning_content"] = reasoning
    if calls:
        out["tool_calls"] = [calls[i] for i in sorted(calls)]
    return out


def _two_turns(tokenizer, family: Family, tmp_path: Path, *, stream: bool,
               replies: list[str] | None = None):
    server = ScriptedCompletions(tokenizer)
    policy = replay([Reply(r, eos=False) for r in replies or [family.call, family.answer]])
    with in_thread(server.app()) as (url, _):
        engine = TokenEngine(url, tokenizer, extra_body=server.extra_body(policy),
                             **engine_settings(family))
        with running(engine, tmp_path / "run") as served:
            key = _rollout(served.url)
            client = openai.OpenAI(base_url=f"{served.url}/r/{key}/v1", api_key="x")
            messages: list = [{"role": "system", "content": "You are an agent."},
                              {"role": "user", "content": "List the files."}]
            first = _ask(client, messages, stream=stream)
            messages.append(first)
            for call in first.get("tool_calls") or []:
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": "a.txt"})
            second = _ask(client, messages, stream=stream)
            turns = served.store.turns(key)
    return engine, first, second, turns


@pytest.fixture(scope="module")
def tokenizers(tiny_model):
    return {f.name: family_tokenizer(tiny_model, f) for f in FAMILIES}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("name", [f.name for f in FAMILIES])
def test_family_call_parses_and_the_next_turn_extends(tokenizers, tmp_path, name,
                                                      stream) -> None:
    family = BY_NAME[name]
    engine, first, second, turns = _two_turns(tokenizers[name], family, tmp_path,
                                              stream=stream)
    [call] = first["tool_calls"]
    assert call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "ls"}
    if family.reasoning is not None:
        assert (first.get("reasoning_content") or "").strip() == family.reasoning
    assert "Done." in second["content"] and "tool_calls" not in second
    assert len(turns) == 2 and all(exclusion(t) is None for t in turns), \
        [t.flags for t in turns]
    earlier, later = (t.completion.tokens for t in turns)  # type: ignore[union-attr]
    assert extends(later.prompt_ids, earlier)
    # the ids sampled are the reply's text tokenized, and the bridge kept them verbatim
    sampled = tokenizers[name].encode(family.call, add_special_tokens=False)
    assert list(earlier.completion_ids) == sampled
    expected = "chat template" if family.template else family.name
    assert expected in engine.format.why


def test_thinking_dropped_at_a_new_user_message_is_a_recorded_break(tokenizers, tmp_path
                                                                     ) -> None:
    """Qwen3's template drops earlier reasoning once a new user message comes: the bridge
    refuses, the family renders the conversation as its template does, and the turn says
    why the chain broke; asked to keep reasoning (`thinking_retention`), it extends."""
    family = BY_NAME["qwen3"]
    answer = "<think>\nplan\n</think>\n\nHello.<|im_end|>"
    for retention, extended in ((None, False), ("all", True)):
        server = ScriptedCompletions(tokenizers["qwen3"])
        settings = engine_settings(family)
        if retention:
            settings["chat_template_kwargs"] = {"thinking_retention": retention}
        with in_thread(server.app()) as (url, _):
            engine = TokenEngine(url, tokenizers["qwen3"], **settings,
                                 extra_body=server.extra_body(replay([Reply(answer, eos=False)])))
            with running(engine, tmp_path / f"run-{retention}") as served:
                key = _rollout(served.url)
                client = openai.OpenAI(base_url=f"{served.url}/r/{key}/v1", api_key="x")
                messages: list = [{"role": "user", "content": "Hi."}]
                messages.append(_ask(client, messages, stream=False))
                messages.append({"role": "user", "content": "And again."})
                _ask(client, messages, stream=False)
                turns = served.store.turns(key)
        earlier, later = (t.completion.tokens for t in turns)  # type: ignore[union-attr]
        assert extends(later.prompt_ids, earlier) is extended
        assert exclusion(turns[1]) is None  # a break is recorded, the turn still trains
        if not extended:
            assert "render_break:bridge_refused" in turns[1].flags


def test_broken_tool_markup_reaches_the_harness_as_text(tokenizers, tmp_path) -> None:
    family = BY_NAME["qwen3"]
    broken = "Listing.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {oops\n</tool_call>" \
             "<|im_end|>"
    _, first, _, turns = _two_turns(tokenizers["qwen3"], family, tmp_path,
                                         stream=True, replies=[broken, family.answer])
    assert "tool_calls" not in first and "{oops" in first["content"]
    assert turns[0].status == "ok" and turns[0].completion is not None
    assert list(turns[0].completion.tokens.completion_ids) == tokenizers["qwen3"].encode(
        broken, add_special_tokens=False)


def test_lfm2_broken_call_is_text(tokenizers, tmp_path) -> None:
    family = BY_NAME["lfm2"]
    broken = "<|tool_call_start|>[bash(command=]<|tool_call_end|><|im_end|>"
    _, first, _, turns = _two_turns(tokenizers["lfm2"], family, tmp_path, stream=False,
                                    replies=[broken, family.answer])
    assert "tool_calls" not in first and "bash(command=" in first["content"]
    assert turns[0].status == "ok"


# ------------------------------------------------------------------ refusals at start-up
def test_unknown_parser_is_refused_naming_the_flag(tiny_model) -> None:
    tokenizer = family_tokenizer(tiny_model, BY_NAME["lfm2"])
    with pytest.raises(ValueError, match="--tool-call-parser 'no_such_parser'"):
        TokenEngine("http://127.0.0.1:9", tokenizer, tool_parser="no_such_parser")


def test_model_with_no_detectable_format_is_refused(tiny_model) -> None:
    tokenizer = family_tokenizer(tiny_model, BY_NAME["lfm2"], template=(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"))
    with pytest.raises(ValueError, match="set --tool-call-parser"):
        TokenEngine("http://127.0.0.1:9", tokenizer)


def test_unknown_family_and_contradicting_parser_are_refused(tokenizers) -> None:
    with pytest.raises(ValueError, match="--renderer"):
        TokenEngine("http://127.0.0.1:9", tokenizers["qwen3"], renderer="no-such-family")
    with pytest.raises(ValueError, match="does not read 'qwen3' tool calls"):
        TokenEngine("http://127.0.0.1:9", tokenizers["qwen3"], renderer="qwen3",
                    tool_parser="lfm2")


def test_tiny_model_keeps_its_template_and_hermes(tokenizer) -> None:
    engine = TokenEngine("http://127.0.0.1:9", tokenizer)
    assert engine.format.family is None and engine.tool_parser == "hermes"


# ------------------------------------------------------------------ the settings
def test_serve_run_and_train_config_carry_the_format_settings(tiny_model, tmp_path) -> None:
    import msgspec

    from harnessrl.cli import build_parser
    from harnessrl.cli.run import _run_engine_spec
    from harnessrl.cli.serve import engine_spec
    from harnessrl.proxy.engines.build import make
    from harnessrl.train.config import TrainSettings
    from harnessrl.train.engines import engine_spec as train_spec

    model = tmp_path / "qwen3-like"
    family_tokenizer(tiny_model, BY_NAME["qwen3"]).save_pretrained(model)
    settings = ["--engine-mode", "token", "--renderer", "qwen3", "--chat-template-kwargs",
                '{"thinking_retention": "all"}', "--engine-url", "http://127.0.0.1:9"]
    serve = build_parser().parse_args(["serve", "--tokenizer", str(model), *settings])
    engine = make(engine_spec(serve))
    assert engine.format.family == "qwen3"  # type: ignore[attr-defined]
    assert engine.renderer.family.effective_thinking_retention == "all"  # type: ignore
    run = build_parser().parse_args(["run", "--harness", "pi", "--tasks", "bundled",
                                     "--tokenizer", str(model), *settings,
                                     "--reasoning-parser", "qwen3"])
    spec = _run_engine_spec(run)
    assert (spec.kind, spec.renderer, spec.reasoning_parser) == ("token", "qwen3", "qwen3")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--tokenizer", str(model),
                                   "--chat-template-kwargs", "[1]", *settings[:2]])
    config = msgspec.convert({"engine": {"mode": "token", "tool_call_parser": "lfm2",
                                         "chat_template_kwargs": {"enable_thinking": False}}},
                             type=TrainSettings)
    spec = train_spec(config, model, tmp_path)
    assert (spec.tool_call_parser, dict(spec.chat_template_kwargs or {})) == (
        "lfm2", {"enable_thinking": False})


def test_unknown_reasoning_parser_is_refused_naming_the_flag(tokenizers) -> None:
    with pytest.raises(ValueError, match="--reasoning-parser 'no_such_reasoner'"):
        TokenEngine("http://127.0.0.1:9", tokenizers["lfm2"], tool_parser="lfm2",
                    reasoning_parser="no_such_reasoner")


def test_a_parser_that_fails_leaves_the_reply_as_text() -> None:
    from harnessrl.proxy.engines.token.replies import WholeParser
    from harnessrl.types import TextDelta

    def broken(_ids, _final):
        raise RuntimeError("parser bug")

    parser = WholeParser(broken, decode=lambda ids: " ".join(map(str, ids)))
    assert parser.feed("", [1, 2]) == []
    assert parser.finish() == [TextDelta("1 2")] and parser.calls == 0


def test_a_hub_name_renderers_lists_picks_its_family(tiny_model) -> None:
    tokenizer = family_tokenizer(tiny_model, BY_NAME["qwen3"])
    tokenizer.name_or_path = "Qwen/Qwen3-8B"
    engine = TokenEngine("http://127.0.0.1:9", tokenizer)
    assert engine.format.family == "qwen3" and "the model's name" in engine.format.why
    assert engine.stop_ids == engine.format.renderer.get_stop_token_ids()


@pytest.mark.parametrize("name", ["qwen3.5", "glm-4.5", "kimi-k2"])
def test_conformance_policy_in_a_familys_markup_passes_the_trace_check(tiny_model, tmp_path,
                                                                       name) -> None:
    """What tests/test_conformance_families.py runs with real harnesses, driven here by an
    OpenAI client: the conformance policy speaking the family's markup, two turns, and
    the conformance trace check (tokens, flags, the tool result's turn extends the call)."""
    from harnessrl.harnesses import get
    from harnessrl.proxy.engines.policy import WriteFilePolicy
    from harnessrl.rollout.conformance import Result, _check_trace
    from tests.token_families import speaking

    family = BY_NAME[name]
    tokenizer = family_tokenizer(tiny_model, family)
    harness = get("pi")
    policy = speaking(family, tokenizer)(WriteFilePolicy("hello.txt", "amber 7", "answer"))
    server = ScriptedCompletions(tokenizer)
    with in_thread(server.app()) as (url, _):
        engine = TokenEngine(url, tokenizer, extra_body=server.extra_body(policy),
                             renderer=name)
        with running(engine, tmp_path / "run") as served:
            key = _rollout(served.url)
            client = openai.OpenAI(base_url=f"{served.url}/r/{key}/v1", api_key="x")
            messages: list = [{"role": "user", "content": "write hello.txt"}]
            for _ in range(2):
                reply = _ask(client, messages, stream=True)
                messages.append(reply)
                for call in reply.get("tool_calls") or []:
                    messages.append({"role": "tool", "tool_call_id": call["id"],
                                     "content": "ok"})
            turns = served.store.turns(key)
    assert "printf" in json.loads(messages[1]["tool_calls"][0]["function"]["arguments"])[
        "command"]
    result = Result(harness.name, harness.version, harness.dialect, "token")
    _check_trace(harness, turns, result)
    assert result.passed or result.problems == [], result.problems
    assert result.chain_extended is True and result.extension_rate == 1.0
