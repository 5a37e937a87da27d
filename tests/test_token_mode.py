"""Token mode, pure parts: prompt rendering that reuses a rollout's earlier ids, the seam
check and its fallback, the tool-call formats (Hermes JSON, Qwen3-Coder XML, reasoning)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
from array import array
from pathlib import Path

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.proxy.engines.scripted import Reply, detokenize, sampled
from harnessrl.proxy.engines.scripted_completions import Sample, ScriptedCompletions
from harnessrl.proxy.engines.token.engine import TokenEngine
from harnessrl.proxy.engines.token.render import Rendered, Renderer
from harnessrl.proxy.engines.token.toolformats import Qwen3CoderParser, make_parser, typed
from harnessrl.proxy.engines.vllm_server import VLLMServer, tool_call_parser_for
from harnessrl.rollout.analysis.chains import rollout_stats
from harnessrl.types import (
    ChatRequest,
    Message,
    Reasoning,
    ReasoningDelta,
    Text,
    TextDelta,
    Tool,
    ToolCall,
    ToolCallDelta,
    ToolResult,
)
from tests.helpers import CACHE, ServedProxy, engine_events, make_proxy

HARNESS_TOOLS = Path("~/.cache/harnessrl/tools").expanduser()

# A Qwen3-Coder style template for the tiny model's vocabulary: XML calls, arguments as a
# mapping (like the real one), reasoning kept in history.
QWEN3_CODER_TEMPLATE = r"""
{%- macro text(c) -%}{%- if c is string -%}{{- c -}}{%- elif c -%}
{{- c | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\n') -}}
{%- endif -%}{%- endmacro -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' -%}{{- text(messages[0].content) + '\n\n' -}}{%- endif -%}
{{- '# Tools\n\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nCall a function like this:\n<tool_call>\n<function=example>\n'
    '<parameter=name>\nvalue\n</parameter>\n</function>\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' and loop.first -%}
{%- elif m.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- if m.reasoning_content -%}{{- '<think>\n' + m.reasoning_content + '\n</think>\n\n' -}}
{%- endif -%}
{{- text(m.content) -}}
{%- for call in m.tool_calls or [] -%}
{%- set call = call.function -%}
{%- if text(m.content) or not loop.first -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n<function=' + call.name + '>\n' -}}
{%- for name, value in call.arguments | items -%}
{{- '<parameter=' + name + '>\n' -}}
{%- if value is mapping or (value is sequence and value is not string) -%}
{{- value | tojson -}}{%- else -%}{{- value | string -}}{%- endif -%}
{{- '\n</parameter>\n' -}}
{%- endfor -%}
{{- '</function>\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif m.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}
{%- endif -%}
{{- '\n<tool_response>\n' + text(m.content) + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- else -%}
{{- '<|im_start|>' + m.role + '\n' + text(m.content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

BASH = Tool("bash", "Run a command", {"type": "object", "properties": {
    "command": {"type": "string"}, "timeout": {"type": "integer"},
    "ratio": {"type": "number"}, "verbose": {"type": "boolean"},
    "env": {"type": "object"}, "paths": {"type": "array"}, "note": {}}})
XML_CALL = ("<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n"
            "<parameter=timeout>\n30\n</parameter>\n<parameter=verbose>\ntrue\n</parameter>\n"
            "<parameter=env>\n{\"A\": \"1\"}\n</parameter>\n</function>\n</tool_call>")
XML_TEXT = f"<think>\nList first.\n</think>\n\nLooking.\n{XML_CALL}"


def _request(*messages: Message, tools: tuple[Tool, ...] = (BASH,)) -> ChatRequest:
    return ChatRequest(model="m", messages=messages, tools=tools)


def _user(text: str) -> Message:
    return Message("user", (Text(text),))


def _assistant(text: str, *calls: ToolCall) -> Message:
    return Message("assistant", ((Text(text),) if text else ()) + calls)


def _result(call_id: str, text: str) -> Message:
    return Message("tool", (ToolResult(call_id, (Text(text),)),))


def _odd_ids(renderer: Renderer, text: str) -> list[int]:
    """`text` as the model might sample it: one id per character, not the canonical ids."""
    return [i for ch in text for i in renderer.encode(ch)]


@pytest.fixture(scope="module")
def renderer(tokenizer) -> Renderer:
    return Renderer(tokenizer)


# ------------------------------------------------------------------ rendering
def test_first_render_is_the_template_tokenized(renderer, tokenizer) -> None:
    request = _request(Message("system", (Text("sys"),)), _user("hi"))
    rendered = renderer.render(request, "r-first")
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": "bash", "description": "Run a command",
                                                 "parameters": BASH.parameters}}],
        tokenize=False, add_generation_prompt=True)
    assert rendered.mode == "full" and rendered.text == text
    assert rendered.ids.tolist() == tokenizer.encode(text, add_special_tokens=False)


def test_history_sent_back_keeps_the_sampled_ids(renderer) -> None:
    """The model wrote its reply in odd ids; the next prompt starts with them."""
    call = ToolCall("c1", "bash", '{"command": "ls"}')
    first = renderer.render(_request(_user("list")), "r-keep")
    reply = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    sampled = [*_odd_ids(renderer, reply), renderer.tokenizer.eos_token_id]
    renderer.remember("r-keep", first, sampled)
    second = renderer.render(_request(_user("list"), _assistant("", call),
                                      _result("c1", "a.txt")), "r-keep")
    assert second.mode == "extended" and second.reused == len(first.ids) + len(sampled)
    assert second.ids[:second.reused].tolist() == [*first.ids, *sampled]
    assert renderer.decode(second.ids) == second.text
    fresh = renderer.render(_request(_user("list"), _assistant("", call),
                                     _result("c1", "a.txt")))  # no rollout: full
    assert fresh.mode == "full" and fresh.ids != second.ids  # canonical ids differ


def test_render_cost_follows_the_new_text(tokenizer) -> None:
    """Only the text after the reused prefix is tokenized."""
    seen: list[int] = []
    renderer = Renderer(tokenizer)
    encode = renderer.encode
    renderer.encode = lambda text: seen.append(len(text)) or encode(text)  # type: ignore
    messages = [_user("x " * 5000)]
    rendered = renderer.render(_request(*messages), "r-cost")
    for turn in range(5):
        reply = f"step {turn}"
        renderer.remember("r-cost", rendered, [*encode(reply), tokenizer.eos_token_id])
        messages += [_assistant(reply), _user(f"go on {turn}")]
        seen.clear()
        rendered = renderer.render(_request(*messages), "r-cost")
        assert rendered.mode == "extended"
        assert sum(seen) < 100 < len(rendered.text) // 100  # the suffix, not the context


def test_side_call_between_turns_does_not_break_the_main_chain(renderer) -> None:
    main = renderer.render(_request(_user("task")), "r-side")
    renderer.remember("r-side", main, [*renderer.encode("ok"), renderer.tokenizer.eos_token_id])
    title = renderer.render(_request(_user("title for: task"), tools=()), "r-side")
    assert title.mode == "full"
    renderer.remember("r-side", title, [*renderer.encode("T"), renderer.tokenizer.eos_token_id])
    after = renderer.render(_request(_user("task"), _assistant("ok"), _user("more")), "r-side")
    assert after.mode == "extended" and after.reused > len(main.ids)


def test_edited_history_reuses_the_prompt_only(renderer) -> None:
    """The harness changed the reply: the earlier prompt's ids are still reused."""
    first = renderer.render(_request(_user("q")), "r-edit")
    renderer.remember("r-edit", first, [*_odd_ids(renderer, "answer"),
                                        renderer.tokenizer.eos_token_id])
    second = renderer.render(_request(_user("q"), _assistant("ANSWER"), _user("next")), "r-edit")
    assert second.mode == "extended" and second.reused == len(first.ids)
    assert second.ids.tolist() == renderer.encode(second.text)


# ------------------------------------------------------------------ the template window
def _qwen3_style() -> str:
    """The tiny model's template, but (like Qwen3's) reasoning is shown only after the last
    user message: not local, a new user message changes how earlier replies render."""
    from harnessrl.models.template import HERMES_TEMPLATE

    last_user = ("{%- set ns = namespace(last=-1) -%}{%- for m in messages -%}"
                 "{%- if m.role == 'user' -%}{%- set ns.last = loop.index0 -%}{%- endif -%}"
                 "{%- endfor -%}")
    return last_user + HERMES_TEMPLATE.replace(
        "{%- if reasoning -%}", "{%- if reasoning and loop.index0 > ns.last -%}")


def _grow(renderer: Renderer, key: str, turns: int) -> list[Message]:
    """A conversation with tool calls, results, reasoning and new user text; each prompt
    rendered through `renderer` and checked against the template on the whole."""
    messages = [Message("system", (Text("sys"),)), _user("task")]
    for turn in range(turns):
        request = _request(*messages)
        rendered = renderer.render(request, key)
        assert rendered.text == renderer.text(request)  # the window gave the full text
        call = ToolCall(f"c{turn}", "bash", json.dumps({"command": f"ls {turn}"}))
        reply = Message("assistant", (Reasoning(f"think {turn}"), Text(f"step {turn}"), call))
        completion = renderer.text(_request(*messages, reply))[len(rendered.text):]
        sampled = renderer.encode(completion.split("<|im_end|>")[0])
        renderer.remember(key, rendered, [*sampled, renderer.tokenizer.eos_token_id])
        messages += [reply, _result(f"c{turn}", f"out {turn}")]
        if turn % 3 == 2:
            messages.append(_user(f"and now {turn}"))
    return messages


def test_local_templates_render_only_new_messages(tokenizer) -> None:
    calls: list[int] = []
    renderer = Renderer(tokenizer, verify_every=1000)
    template = renderer._template
    renderer._template = lambda m, k, g: calls.append(len(m)) or template(m, k, g)  # type: ignore
    assert renderer.windowed
    assert Renderer(tokenizer, chat_template=QWEN3_CODER_TEMPLATE).windowed
    long = _grow(renderer, "r-window", 12)  # asserts each prompt equals the full render
    calls.clear()
    rendered = renderer.render(_request(*long), "r-window")
    assert calls and max(calls) <= 6 < len(long)  # only a window went through the template
    assert rendered.mode == "extended" and rendered.text == renderer.text(_request(*long))
    calls.clear()
    renderer.render(_request(*long), "r-window-new")
    assert calls == [len(long)]  # a rollout's first prompt goes through whole


def test_non_local_template_is_rendered_in_full(tokenizer) -> None:
    renderer = Renderer(tokenizer, chat_template=_qwen3_style())
    assert not renderer.windowed
    _grow(renderer, "r-qwen3", 8)


def test_windowing_is_checked_and_turned_off_when_wrong(tokenizer) -> None:
    """A template the battery cannot catch (it changes only past 12 messages) is caught by
    the check against a full render."""
    from harnessrl.models.template import HERMES_TEMPLATE

    sly = HERMES_TEMPLATE.replace("{{- '# Tools\\n\\n", "{%- if messages | length > 12 -%}"
                                  "{{- 'Long. ' -}}{%- endif -%}{{- '# Tools\\n\\n")
    assert sly != HERMES_TEMPLATE
    renderer = Renderer(tokenizer, chat_template=sly, verify_every=1)
    assert renderer.windowed
    _grow(renderer, "r-sly", 8)  # every prompt is still the template's
    assert not renderer.windowed


def test_restore_from_stored_ids(tokenizer) -> None:
    """After a restart the memory comes back from stored ids."""
    before = Renderer(tokenizer)
    first = before.render(_request(_user("q")), "r-restart")
    sampled = [*_odd_ids(before, "fine"), tokenizer.eos_token_id]
    after = Renderer(tokenizer)
    assert not after.knows("r-restart")
    after.restore("r-restart", [(first.ids.tolist(), sampled)])
    second = after.render(_request(_user("q"), _assistant("fine"), _user("next")), "r-restart")
    assert second.mode == "extended"
    assert second.ids[:len(first.ids) + len(sampled)].tolist() == [*first.ids, *sampled]


# ------------------------------------------------------------------ the seam
def _state(renderer: Renderer, key: str, text: str, ids: list[int]) -> None:
    """Remember a prompt whose text ends away from any added token."""
    renderer.remember(key, Rendered(text, array("i", ids), 0, "full"), [])


def test_unsafe_seam_with_canonical_ids_is_verified_and_reused(renderer) -> None:
    prefix = "<|im_start|>user\nhello world"
    _state(renderer, "r-seam-ok", prefix, renderer.encode(prefix))
    text = prefix + "<|im_end|>\n"  # the cut is right before an added token: safe
    assert renderer.render_text(text, "r-seam-ok").mode == "extended"
    text = prefix + ", and more"  # not next to an added token: checked by re-tokenizing
    rendered = renderer.render_text(text, "r-seam-ok")
    assert rendered.mode == "extended" and rendered.ids.tolist() == renderer.encode(text)


def test_unsafe_seam_with_odd_ids_falls_back_to_full(renderer) -> None:
    prefix = "<|im_start|>user\nhello world"
    _state(renderer, "r-seam-odd", prefix, [*renderer.encode("<|im_start|>user\n"),
                                            *_odd_ids(renderer, "hello world")])
    rendered = renderer.render_text(prefix + "ly things", "r-seam-odd")
    assert rendered.mode == "fallback"
    assert rendered.ids.tolist() == renderer.encode(prefix + "ly things")


def test_merge_across_the_seam_falls_back(renderer) -> None:
    """Canonical ids on both sides, but the joined text merges across the cut."""
    prefix = "<|im_start|>user\nimp"
    joined = prefix + "ort os"
    assert renderer.encode(prefix) + renderer.encode("ort os") != renderer.encode(joined)
    _state(renderer, "r-merge", prefix, renderer.encode(prefix))
    rendered = renderer.render_text(joined, "r-merge")
    assert rendered.mode == "fallback" and rendered.ids.tolist() == renderer.encode(joined)


_ATOMS = [*"ab \n\t.:{}\"é😀_<>/", "<|im_end|>", "<tool_call>", "\n\n", "  ", "import", "def"]
_CHUNK = st.lists(st.sampled_from(_ATOMS), max_size=8).map("".join)


@settings(max_examples=150)
@given(st.lists(_CHUNK, min_size=1, max_size=6))
def test_extending_equals_tokenizing_whole_when_ids_are_canonical(renderer, pieces) -> None:
    """Whatever the text and wherever the cuts, reusing canonical ids and tokenizing the
    rest gives the ids of tokenizing the whole (or a flagged full tokenization)."""
    key = f"r-prop-{abs(hash(tuple(pieces)))}"
    renderer.forget(key)
    text = "<|im_start|>user\n"
    _state(renderer, key, text, renderer.encode(text))
    for piece in pieces:
        text += piece
        rendered = renderer.render_text(text, key)
        assert rendered.ids.tolist() == renderer.encode(text)
        _state(renderer, key, text, rendered.ids.tolist())


# ------------------------------------------------------------------ formats
def _parse(parser, text: str, cuts: list[int]) -> tuple[str, str, list[tuple[str, str]]]:
    deltas, start = [], 0
    for cut in sorted(cuts):
        deltas += parser.feed(text[start:cut])
        start = cut
    deltas += parser.feed(text[start:]) + parser.finish()
    return ("".join(d.text for d in deltas if isinstance(d, TextDelta)),
            "".join(d.text for d in deltas if isinstance(d, ReasoningDelta)),
            [(d.name, d.arguments) for d in deltas if isinstance(d, ToolCallDelta)])


def _xml(cuts: list[int], text: str = XML_TEXT):
    return _parse(Qwen3CoderParser((BASH,), new_id=lambda: "c"), text, cuts)


def test_qwen3_coder_call_with_typed_arguments() -> None:
    text, reasoning, calls = _xml([])
    assert (text, reasoning) == ("Looking.", "List first.")
    [(name, arguments)] = calls
    assert name == "bash"
    assert json.loads(arguments) == {"command": "ls -la", "timeout": 30, "verbose": True,
                                     "env": {"A": "1"}}


@given(st.lists(st.integers(min_value=0, max_value=len(XML_TEXT)), max_size=15))
def test_qwen3_coder_any_split_parses_the_same(cuts: list[int]) -> None:
    assert _xml(cuts) == _xml([])


@given(st.lists(st.integers(min_value=0, max_value=len(XML_TEXT)), max_size=15))
def test_reasoning_opened_by_the_prompt_any_split(cuts: list[int]) -> None:
    body = XML_TEXT.removeprefix("<think>\n")
    parse = lambda c: _parse(make_parser("qwen3_coder", (BASH,), in_reasoning=True), body, c)  # noqa: E731
    assert parse(cuts)[:2] == ("Looking.", "List first.") and parse(cuts) == parse([])


def test_qwen3_coder_malformed_or_cut_call_stays_text() -> None:
    assert _xml([], "a <tool_call>\n{json?}\n</tool_call>")[2] == []
    assert _xml([], "a <tool_call>\n<function=bash>\nstray\n</function>\n</tool_call>")[2] == []
    cut = "x<tool_call>\n<function=bash>\n<parameter=command>\nls"
    assert _xml([5, 20], cut) == (cut, "", [])


def test_schema_types() -> None:
    assert typed("42", {"type": "integer"}) == 42
    assert typed("4x", {"type": "integer"}) == "4x"  # kept as written, not guessed
    assert typed("2.5", {"type": "number"}) == 2.5 and typed("2", {"type": "number"}) == 2
    assert typed("False", {"type": "boolean"}) is False
    assert typed("[1, 2]", {"type": "array"}) == [1, 2]
    assert typed("007", {"type": "string"}) == "007" and typed("x", None) == "x"
    assert typed("null", {"type": ["string", "null"]}) is None
    assert typed("3", {"anyOf": [{"type": "integer"}, {"type": "string"}]}) == 3
    assert typed('{"a": 1}', {}) == {"a": 1}


def test_hermes_by_name_and_unknown_format() -> None:
    text = '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>'
    assert _parse(make_parser("hermes"), text, [3, 17]) == ("", "hm", [("bash", "{}")])
    with pytest.raises(ValueError, match="llama3_json"):
        make_parser("llama3_json")


def test_xml_call_renders_back_to_the_sampled_text(tokenizer) -> None:
    """Parse then render through a Qwen3-Coder template is the identity on the reply."""
    reply = ("Looking.\n<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n"
             "<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>")
    text, _, [(name, arguments)] = _xml([], reply)
    renderer = Renderer(tokenizer, chat_template=QWEN3_CODER_TEMPLATE)
    request = _request(_user("q"), _assistant(text, ToolCall("c", name, arguments)))
    assert f"<|im_start|>assistant\n{reply}<|im_end|>" in renderer.text(request)


# ------------------------------------------------------------------ wiring
def test_parser_names_and_token_mode_flags(tmp_path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": QWEN3_CODER_TEMPLATE}))
    assert tool_call_parser_for(str(tmp_path)) == "qwen3_coder"
    chat = VLLMServer(model=str(tmp_path), port=1).command()
    token = VLLMServer(model=str(tmp_path), port=1, engine_mode="token").command()
    assert "--tool-call-parser" in chat and "--tool-call-parser" not in token


def test_serve_builds_a_token_engine(tiny_model) -> None:
    from harnessrl.cli import build_parser
    from harnessrl.cli.serve import engine_spec
    from harnessrl.proxy.engines.build import make

    args = build_parser().parse_args(["serve", "--engine-mode", "token", "--tokenizer",
                                      str(tiny_model), "--engine-url", "http://127.0.0.1:9",
                                      "--engine-timeout", "5", "--stream-interval-ms", "20"])
    engine = make(engine_spec(args))
    assert engine.name == "vllm-token" and engine.tool_parser == "hermes"
    assert engine.stop_ids == [engine.renderer.tokenizer.eos_token_id]
    assert engine.http.stream_interval == 0.02


# ------------------------------------------------------------------ against real vLLM
TOOLS = [{"type": "function", "function": {
    "name": "write_file", "description": "Write a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                    "count": {"type": "integer"}},
                   "required": ["path"]}}}]
MESSAGES = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Create hello.txt containing hi."}]
HERMES_CALL = ('<tool_call>\n{"name": "write_file", "arguments": {"path": "hello.txt", '
               '"count": 2}}\n</tool_call>')
XML_WRITE = ("<tool_call>\n<function=write_file>\n<parameter=path>\nhello.txt\n</parameter>\n"
             "<parameter=count>\n2\n</parameter>\n</function>\n</tool_call>")


class Forcer:
    """Makes vLLM sample exactly the queued texts (structured outputs), one per call; the
    ids stay the model's own choice of tokens for that text."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, _request: ChatRequest) -> dict | None:
        if not self.texts:
            return None
        return {"structured_outputs": {"regex": re.escape(self.texts.pop(0))}}


@pytest.fixture(scope="module")
def vllm_url(tiny_model):
    server = VLLMServer(model=str(tiny_model), served_name="tiny", max_model_len=4096,
                        dtype="float32", engine_mode="token", extra_args=["--seed", "0"],
                        log_path=CACHE / "vllm-token-test.log")
    with server:
        yield server.url


@contextlib.contextmanager
def _proxy(vllm_url: str, tiny_model, run_dir, key: str | None = None, **engine_options):
    forcer = Forcer()
    engine = TokenEngine(vllm_url, str(tiny_model), extra_body=forcer, **engine_options)
    sent: list[list[int]] = []
    body = engine._body

    def spy(request, rendered, *, stream):
        sent.append(rendered.ids.tolist())
        return body(request, rendered, stream=stream)

    engine._body = spy  # type: ignore[method-assign]
    served = ServedProxy(make_proxy(engine, run_dir))
    with served.running():
        served.key = key or served.new_rollout()["key"]
        served.client = openai.OpenAI(base_url=f"{served.url}/r/{served.key}/v1",
                                      api_key=served.key, max_retries=0)
        served.forcer, served.sent, served.engine = forcer, sent, engine
        yield served
    served.store.close()


def _ask(served, messages, stream: bool, **create) -> dict:
    """One call; the assistant message to send back, as the OpenAI SDK gives it."""
    create = {"model": "x", "messages": messages, "temperature": 0, "max_tokens": 48, **create}
    if not stream:
        message = served.client.chat.completions.create(**create).choices[0].message
        calls = [{"id": c.id, "type": "function", "function": {
            "name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls or []]
        return {"role": "assistant", "content": message.content,
                **({"tool_calls": calls} if calls else {})}
    text, calls = "", {}
    for chunk in served.client.chat.completions.create(**create, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        text += (delta.content or "") if delta else ""
        for call in (delta.tool_calls or []) if delta else []:
            entry = calls.setdefault(call.index, {"id": call.id, "type": "function",
                                                  "function": {"name": "", "arguments": ""}})
            entry["function"]["name"] += call.function.name or ""
            entry["function"]["arguments"] += call.function.arguments or ""
    return {"role": "assistant", "content": text or None,
            **({"tool_calls": list(calls.values())} if calls else {})}


@pytest.mark.vllm
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_ids_sent_are_ids_stored(vllm_url, tiny_model, tokenizer, tmp_path, stream) -> None:
    with _proxy(vllm_url, tiny_model, tmp_path) as served:
        reply = _ask(served, MESSAGES, stream, max_tokens=16)
        [turn] = served.store.turns(served.key)
    tokens = turn.completion.tokens
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert served.sent == [list(tokens.prompt_ids)]
    assert list(tokens.prompt_ids) == tokenizer.encode(text, add_special_tokens=False)
    direct = httpx.post(f"{vllm_url}/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": list(tokens.prompt_ids), "temperature": 0, "max_tokens": 16,
        "logprobs": 0, "return_token_ids": True}).json()["choices"][0]
    assert list(tokens.completion_ids) == direct["token_ids"]
    assert tokens.logprobs == pytest.approx(direct["logprobs"]["token_logprobs"], abs=1e-4)
    assert (reply["content"] or "") == _parse(make_parser("hermes"), direct["text"], [])[0]
    assert turn.engine == "vllm-token" and turn.flags == () and turn.model == "tiny"


@pytest.mark.vllm
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_tool_call_and_reasoning_parse(vllm_url, tiny_model, tmp_path, stream) -> None:
    with _proxy(vllm_url, tiny_model, tmp_path) as served:
        served.forcer.texts = [f"<think>\nwrite it\n</think>\n\nOn it.\n{HERMES_CALL}"]
        reply = _ask(served, MESSAGES, stream, tools=TOOLS, max_tokens=200)
        [turn] = served.store.turns(served.key)
    [call] = reply["tool_calls"]
    assert call["function"]["name"] == "write_file"
    assert json.loads(call["function"]["arguments"]) == {"path": "hello.txt", "count": 2}
    assert reply["content"] == "On it."
    assert [type(p).__name__ for p in turn.completion.parts] == ["Reasoning", "Text", "ToolCall"]
    assert turn.completion.parts[0].text == "write it"
    assert turn.completion.finish_reason == "tool_calls" and turn.flags == ()


@pytest.mark.vllm
def test_qwen3_coder_xml_call_and_its_history(vllm_url, tiny_model, tmp_path) -> None:
    with _proxy(vllm_url, tiny_model, tmp_path, chat_template=QWEN3_CODER_TEMPLATE,
                tool_parser="qwen3_coder") as served:
        served.forcer.texts = [XML_WRITE, "Done."]
        reply = _ask(served, MESSAGES, True, tools=TOOLS, max_tokens=200)
        [call] = reply["tool_calls"]
        assert json.loads(call["function"]["arguments"]) == {"path": "hello.txt", "count": 2}
        history = [*MESSAGES, reply, {"role": "tool", "tool_call_id": call["id"], "content": "ok"}]
        _ask(served, history, False, tools=TOOLS, max_tokens=20)
        first, second = served.store.turns(served.key)
    before = first.completion.tokens
    assert second.completion.tokens.prompt_ids[:len(before.prompt_ids) + len(
        before.completion_ids)] == before.prompt_ids + before.completion_ids


def _assert_every_turn_extends(turns) -> None:
    for earlier, later in itertools.pairwise(turns):
        e = earlier.completion.tokens
        prefix = e.prompt_ids + e.completion_ids
        assert later.completion.tokens.prompt_ids[:len(prefix)] == prefix, later.index
    assert rollout_stats(turns).extension_rate == 1.0


@pytest.mark.vllm
def test_unchanged_history_re_renders_to_its_earlier_ids(vllm_url, tiny_model, tokenizer,
                                                          tmp_path) -> None:
    """Replies sampled in the model's own (not canonical) ids come back unchanged; a
    restarted proxy finds them in the store."""
    messages = list(MESSAGES)
    with _proxy(vllm_url, tiny_model, tmp_path) as served:
        key = served.key
        served.forcer.texts = [HERMES_CALL, "Written.", HERMES_CALL]
        for position in range(3):
            reply = _ask(served, messages, position % 2 == 1, tools=TOOLS, max_tokens=200)
            messages.append(reply)
            for call in reply.get("tool_calls", []):
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
            if "tool_calls" not in reply:
                messages.append({"role": "user", "content": "Again."})
        assert served.engine.renders == {"full": 1, "extended": 2}
    with _proxy(vllm_url, tiny_model, tmp_path, key=key) as served:
        _ask(served, messages, False, tools=TOOLS, max_tokens=8)
        assert served.engine.renders == {"extended": 1}
        turns = served.store.turns(key)
    _assert_every_turn_extends(turns)
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False,
                                         add_generation_prompt=True)
    canonical = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(turns[-1].completion.tokens.prompt_ids) == text
    assert list(turns[-1].completion.tokens.prompt_ids) != canonical  # reuse mattered


@pytest.mark.vllm
@pytest.mark.harness
@pytest.mark.slow
def test_real_harness_history_keeps_its_ids(vllm_url, tiny_model, tmp_path) -> None:
    """mini-swe-agent, unmodified, writes the file in token mode; every turn's prompt
    starts with the turn before's prompt and completion ids."""
    from harnessrl.harnesses import get
    from harnessrl.proxy.engines.policy import WriteFilePolicy
    from harnessrl.rollout.conformance import FILENAME, Result, _run, random_line

    harness = get("mini-swe-agent")
    harness.install(HARNESS_TOOLS, log=lambda _line: None)
    line = random_line()
    policy = WriteFilePolicy(FILENAME, line, harness.finish)
    with _proxy(vllm_url, tiny_model, tmp_path / "run") as served:
        served.engine.extra_body = lambda request: {
            "structured_outputs": {"regex": re.escape(policy(request).text)}}
        rollout = {"key": served.key, "base_url": f"{served.url}/r/{served.key}"}
        result = Result(harness.name, harness.version, harness.dialect)
        asyncio.run(_run(harness, rollout, HARNESS_TOOLS, tmp_path, line, 240, result))
        turns = served.store.turns(served.key)
    assert result.problems == [] and len(turns) >= 2
    assert all(t.status == "ok" and t.flags == () for t in turns)
    _assert_every_turn_extends(turns)


# ------------------------------------------------------------------ the wire, faked
class FakeCompletions(ScriptedCompletions):
    """The scripted completions server answering `reply` to every request (its
    `fallback`: this engine sends no scripted reply), with faults on demand."""

    def __init__(self, tokenizer, reply: str) -> None:
        super().__init__(tokenizer, model="tiny", max_model_len=1000, fallback=Reply(reply))
        self.mode = "ok"  # ok | error400 | cut | other_prompt
        ids, _ = sampled(tokenizer, Reply(reply))
        self.pieces = list(zip(detokenize(tokenizer, ids), ids, strict=True))

    def sample(self, prompt, reply, max_tokens, stop_ids) -> Sample:
        if self.mode == "other_prompt":
            prompt = prompt[1:]
        return super().sample(prompt, reply, max_tokens, stop_ids)

    async def _completions(self, request):
        if self.mode != "error400":
            return await super()._completions(request)
        # every prompt is too long for the model, after the engine read its length
        limit, self.max_model_len = self.max_model_len, 1
        try:
            return await super()._completions(request)
        finally:
            self.max_model_len = limit

    async def stream_events(self, sample):
        events = super().stream_events(sample)
        async for n, event in _enumerate(events):
            if self.mode == "cut" and n == 3:
                return
            yield event


async def _enumerate(items):
    n = 0
    async for item in items:
        yield n, item
        n += 1


@pytest.fixture(scope="module")
def fake(tokenizer):
    from harnessrl.proxy.serve import in_thread

    server = FakeCompletions(tokenizer, f"Sure.\n{HERMES_CALL}")
    with in_thread(server.app()) as (url, _):
        server.url = url
        yield server


def _events(fake, tiny_model, *, stream: bool, mode: str = "ok") -> list:
    from harnessrl.types import Chunk, Finished, Started

    fake.mode, fake.bodies[:] = mode, []
    tools = (Tool("write_file", None, TOOLS[0]["function"]["parameters"]),)
    request = ChatRequest(model="tiny", messages=(_user("hi"),), tools=tools)

    events = engine_events(TokenEngine(fake.url, str(tiny_model)), request, stream=stream)
    assert isinstance(events[0], Started) and isinstance(events[-1], Finished)
    assert all(isinstance(e, Chunk) for e in events[1:-1])
    return events


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_engine_wire_and_events(fake, tiny_model, stream) -> None:
    from harnessrl.proxy.wire.accumulate import accumulate

    acc = accumulate(_events(fake, tiny_model, stream=stream))
    [body] = fake.bodies
    assert list(acc.prompt_ids) == body["prompt"] and acc.flags() == []
    assert body["max_tokens"] == 1000 - len(body["prompt"])  # not /v1/completions' 16
    assert body["stop_token_ids"] == [2] and body["logprobs"] == 0 and body["return_token_ids"]
    completion = acc.completion()
    assert [c.name for c in completion.tool_calls] == ["write_file"]
    assert completion.parts[0] == Text("Sure.") and completion.finish_reason == "tool_calls"
    assert list(completion.tokens.completion_ids) == [i for _, i in fake.pieces]


def test_engine_faults(fake, tiny_model) -> None:
    from harnessrl.errors import EngineError, InvalidRequest
    from harnessrl.proxy.wire.accumulate import accumulate

    with pytest.raises(InvalidRequest, match="maximum context length"):
        _events(fake, tiny_model, stream=False, mode="error400")
    with pytest.raises(EngineError, match="before a finish_reason"):
        _events(fake, tiny_model, stream=True, mode="cut")
    changed = accumulate(_events(fake, tiny_model, stream=True, mode="other_prompt"))
    assert changed.flags() == ["prompt_ids_changed"]
