"""Drift causes (rollout/analysis/drift.py): golden cases for every cause.

Each case is a scripted rollout through the real proxy (chat mode, the tiny model's
tokenizer): a real harness request recorded in tests/recorded starts it, two turns
extend it the way the harness does, and the third request is the same conversation with
one change a harness makes (whitespace trimmed, a tool result truncated, ...). The stored
ids and messages must name that change. Two causes that chat mode cannot produce through
the proxy (the same messages rendered to other ids) are hand-built turns with the same
tokenizer; an ambiguous case must come out `unclassified`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import get_args

import httpx
import pytest

from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.rollout.analysis.chains import link
from harnessrl.rollout.analysis.drift import CAUSES, classify, drifts, snippet
from harnessrl.types import (
    ChainBreak,
    ChatRequest,
    Completion,
    DriftCause,
    Message,
    Text,
    Timings,
    Tokens,
    ToolCall,
    Turn,
)
from tests.helpers import RECORDED, ServedProxy, make_proxy, unredacted

REPLIES = [
    f'<think>\nStep {n}: I should look at the files.\n</think>\n\nLooking,  step {n}.\n'
    f'<tool_call>\n{{"name": "terminal", "arguments": {{"command": "ls -la dir{n}"}}}}\n'
    '</tool_call>' for n in range(3)]
RESULT = "".join(f"file{k}.txt  {k * 17} bytes\n" for k in range(40))
BASES = ["hermes-agent/request-1", "opencode/request-2"]

History = list[dict]
Mutation = Callable[[History, dict], tuple[History, dict]]


@pytest.fixture(scope="module")
def served(tokenizer, tmp_path_factory):
    engine = ScriptedEngine(tokenizer, replay(REPLIES), model="scripted")
    with ServedProxy(make_proxy(engine, tmp_path_factory.mktemp("drift"))).running() as s:
        yield s


def _post(served, key: str, body: dict) -> dict:
    resp = httpx.post(f"{served.url}/r/{key}/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["message"]


def converse(served, base: str, mutate: Mutation) -> list[Turn]:
    """Two turns that extend the recorded request, then the mutated third request."""
    body = unredacted(json.loads((RECORDED / f"{base}.json").read_text())["body"])
    body = {**body, "stream": False}
    body.pop("stream_options", None)
    key = served.new_rollout()["key"]
    served.proxy.engine.policy = replay(REPLIES)  # every rollout replies alike
    history: History = list(body["messages"])
    for _ in range(2):
        reply = _post(served, key, {**body, "messages": history})
        reply = {k: v for k, v in reply.items() if v is not None}
        results = [{"role": "tool", "tool_call_id": c["id"], "content": RESULT}
                   for c in reply.get("tool_calls") or []]
        history = [*history, reply, *results]
    new_history, new_body = mutate(copy.deepcopy(history), copy.deepcopy(body))
    _post(served, key, {**new_body, "messages": new_history})
    return served.store.turns(key)


def _n(history: History) -> int:
    """Where the recorded request's own messages end (the first reply)."""
    return next(k for k, m in enumerate(history) if m["role"] == "assistant")


def _set(index: Callable[[History], int], field: str, value: Callable[[object], object]
         ) -> Mutation:
    def mutate(h: History, body: dict) -> tuple[History, dict]:
        h[index(h)][field] = value(h[index(h)].get(field))
        return h, body
    return mutate


def _second_reply(h: History) -> int:
    return _n(h) + 2


def _first_result(h: History) -> int:
    return _n(h) + 1


def _reserialize(h: History, body: dict) -> tuple[History, dict]:
    call = h[_second_reply(h)]["tool_calls"][0]["function"]
    call["arguments"] = json.dumps(json.loads(call["arguments"]), separators=(",", ":"))
    return h, body


def _drop_reasoning(h: History, body: dict) -> tuple[History, dict]:
    del h[_second_reply(h)]["reasoning_content"]
    return h, body


def _system(h: History, body: dict) -> tuple[History, dict]:
    h[0]["content"] = f"{h[0]['content']}\nThe time is 02:14:07."
    return h, body


def _tools(h: History, body: dict) -> tuple[History, dict]:
    body["tools"] = [*body["tools"], {"type": "function", "function": {
        "name": "mcp_fetch", "parameters": {"type": "object", "properties": {}}}}]
    return h, body


def _user_reminder(h: History, body: dict) -> tuple[History, dict]:
    user = _n(h) - 1
    h[user]["content"] = f"{h[user]['content']}\n<reminder>stay brief</reminder>"
    return h, body


def _drop_first_exchange(h: History, body: dict) -> tuple[History, dict]:
    n = _n(h)
    return [*h[:n], *h[n + 2:]], body


def _swap_exchanges(h: History, body: dict) -> tuple[History, dict]:
    n = _n(h)
    return [*h[:n], *h[n + 2:n + 4], *h[n:n + 2]], body


def _summary(h: History, body: dict) -> tuple[History, dict]:
    summary = {"role": "user", "content": "Summary of the work so far: the files of dir0 "
               "and dir1 were listed; next, read file3.txt."}
    return [*h[:_n(h)], summary], body


def _reply_rejected(h: History, body: dict) -> tuple[History, dict]:
    """mini-swe-agent on a reply it cannot parse: the reply (and its result) left out, a
    format error sent in its place (seen with SmolLM2's unparsed `<tool_call>` replies)."""
    error = {"role": "user", "content": "Tool call error:\n\n<error>\nNo tool calls found "
             "in the response. Every response MUST include at least one tool call.\n</error>"}
    return [*h[:-2], error], body


def _rewind(h: History, body: dict) -> tuple[History, dict]:
    return h[:_n(h)], body


def _title(h: History, body: dict) -> tuple[History, dict]:
    return [{"role": "system", "content": "Write a title."},
            {"role": "user", "content": "list files"}], {**body, "tools": []}


def _tools_and_system(h: History, body: dict) -> tuple[History, dict]:
    return _system(*_tools(h, body))


GOLDEN: dict[str, tuple[Mutation, DriftCause, str | None]] = {
    # name: (the harness's change, the cause, where the ids say it lies)
    "whitespace": (_set(_second_reply, "content", lambda c: str(c).replace("  ", " ")),
                   "whitespace", "completion"),
    "reasoning_removed": (_drop_reasoning, "reasoning_removed", "completion"),
    "completion_changed": (_set(_second_reply, "content", lambda c: "Done looking."),
                           "completion_changed", "completion"),
    "tool_result_changed": (_set(_first_result, "content", lambda c: "[output cleared]"),
                            "tool_result_changed", "prompt"),
    "tool_result_truncated": (_set(_first_result, "content",
                                   lambda c: f"{str(c)[:200]}\n[... 38 lines truncated]"),
                              "tool_result_truncated", "prompt"),
    "system_prompt_changed": (_system, "system_prompt_changed", "prompt"),
    "tools_changed": (_tools, "tools_changed", "prompt"),
    "message_changed": (_user_reminder, "message_changed", "prompt"),
    "messages_dropped": (_drop_first_exchange, "messages_dropped", "completion"),
    "messages_reordered": (_swap_exchanges, "messages_reordered", "completion"),
    "summary_replaced_turns": (_summary, "summary_replaced_turns", "prompt"),
    "reply_rejected": (_reply_rejected, "messages_dropped", "prompt"),
    "rewound": (_rewind, "rewound", None),
    "side_call": (_title, "side_call", None),
    "ambiguous": (_tools_and_system, "unclassified", "prompt"),
}


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("case", GOLDEN)
def test_golden_cause(served, base: str, case: str) -> None:
    mutate, cause, within = GOLDEN[case]
    turns = converse(served, base, mutate)
    linked = link(turns)
    assert [len(c.turns) for c in linked.chains] == [2, 1], "the first two turns extend"
    [drift] = drifts(linked.chains)
    assert (drift.cause, drift.turn, drift.against) == (cause, 2, 1), drift
    assert drift.where == CAUSES[cause][0]
    if within is not None:
        assert linked.chains[1].start.within == within
    # the ids around the first difference: the same before it, different at it
    at = drift.diverged_at
    assert at is not None and drift.ids_start is not None
    split = at - drift.ids_start
    assert drift.old_ids[:split] == drift.new_ids[:split]
    if cause not in ("rewound", "unclassified", "side_call"):
        assert drift.old_ids[split:split + 1] != drift.new_ids[split:split + 1]
        assert drift.old_text != drift.new_text or cause in ("tools_changed",)


# ------------------------------------------------------------------ Anthropic: Claude Code
def converse_claude(served, mutate: Callable[[list, dict], tuple[list, dict]]) -> list[Turn]:
    """The recorded Claude Code request, two turns with tool results as Claude Code sends
    them (content blocks in a user message), then the mutated third request."""
    body = unredacted(json.loads((RECORDED / "claude/request-1.json").read_text())["body"])
    body = {**body, "stream": False}
    key = served.new_rollout()["key"]
    served.proxy.engine.policy = replay(REPLIES)
    history: list = list(body["messages"])
    for _ in range(2):
        resp = httpx.post(f"{served.url}/r/{key}/v1/messages",
                          json={**body, "messages": history}, timeout=60)
        assert resp.status_code == 200, resp.text
        content = resp.json()["content"]
        history = [*history, {"role": "assistant", "content": content},
                   {"role": "user", "content": [
                       {"type": "tool_result", "tool_use_id": b["id"], "content": RESULT}
                       for b in content if b["type"] == "tool_use"]}]
    new_history, new_body = mutate(copy.deepcopy(history), copy.deepcopy(body))
    resp = httpx.post(f"{served.url}/r/{key}/v1/messages",
                      json={**new_body, "messages": new_history}, timeout=60)
    assert resp.status_code == 200, resp.text
    return served.store.turns(key)


def _claude_first(h: list) -> int:
    return next(k for k, m in enumerate(h) if m["role"] == "assistant")


def _claude_text(h: list, body: dict) -> tuple[list, dict]:
    reply = h[_claude_first(h) + 2]["content"]
    block = next(b for b in reply if b["type"] == "text")
    block["text"] = block["text"].replace("  ", " ")
    return h, body


def _claude_result(h: list, body: dict) -> tuple[list, dict]:
    h[_claude_first(h) + 1]["content"][0]["content"] = RESULT[:150] + "\n[truncated]"
    return h, body


def _claude_system(h: list, body: dict) -> tuple[list, dict]:
    body["system"][-1]["text"] += "\nThe time is 02:14:07."
    return h, body


def _claude_summary(h: list, body: dict) -> tuple[list, dict]:
    first = _claude_first(h)
    return [*h[:first], {"role": "user", "content": "Summary: dir0 and dir1 listed."}], body


CLAUDE: dict[str, tuple[Callable[[list, dict], tuple[list, dict]], DriftCause]] = {
    "whitespace": (_claude_text, "whitespace"),
    "tool_result_truncated": (_claude_result, "tool_result_truncated"),
    "system_prompt_changed": (_claude_system, "system_prompt_changed"),
    "summary_replaced_turns": (_claude_summary, "summary_replaced_turns"),
}


@pytest.mark.parametrize("case", CLAUDE)
def test_golden_cause_claude(served, case: str) -> None:
    mutate, cause = CLAUDE[case]
    linked = link(converse_claude(served, mutate))
    assert [len(c.turns) for c in linked.chains] == [2, 1], "the first two turns extend"
    [drift] = drifts(linked.chains)
    assert (drift.cause, drift.turn, drift.against) == (cause, 2, 1), drift


# ------------------------------------------------------------------ real request pairs
def _markup(message: dict) -> str:
    """What a model that wrote `message` sampled, in the tiny model's Hermes markup."""
    text = message.get("content") or ""
    if isinstance(text, list):
        text = "".join(p.get("text", "") for p in text)
    calls = "\n".join(
        f'<tool_call>\n{{"name": "{c["function"]["name"]}", '
        f'"arguments": {c["function"]["arguments"]}}}\n</tool_call>'
        for c in message.get("tool_calls") or [])
    return "\n".join(x for x in (text, calls) if x)


@pytest.mark.parametrize("harness", ["hermes-agent", "kimi-cli", "openhands", "mini-swe-agent"])
def test_a_recorded_second_request_extends_the_first(served, harness: str) -> None:
    """Each harness's own two requests, as recorded: the model replies with what the
    second request says it replied, and the harness's history then extends it token for
    token (no drift), in this proxy's chat mode."""
    first, second = (unredacted(json.loads((RECORDED / harness / f"request-{n}.json")
                                           .read_text())["body"]) for n in (1, 2))
    served.proxy.engine.policy = replay([_markup(second["messages"][len(first["messages"])])])
    key = served.new_rollout()["key"]
    for body in (first, second):
        body = {**body, "stream": False}
        body.pop("stream_options", None)
        httpx.post(f"{served.url}/r/{key}/v1/chat/completions", json=body,
                   timeout=60).raise_for_status()
    linked = link(served.store.turns(key))
    assert [len(c.turns) for c in linked.chains] == [2] and drifts(linked.chains) == []


def test_an_unchanged_history_is_no_break(served) -> None:
    turns = converse(served, BASES[0], lambda h, b: (h, b))
    assert [len(c.turns) for c in link(turns).chains] == [3]
    assert drifts(link(turns).chains) == []


def test_every_cause_has_a_golden_case_or_a_hand_built_one() -> None:
    covered = {c for _, c, _ in GOLDEN.values()} | {"retokenized", "template",
                                                    "tool_json_reserialized"}
    assert covered == set(get_args(DriftCause))


# ------------------------------------------------------------------ hand-built turns
def _turn(index: int, messages: list[Message], prompt: list[int], completion: list[int],
          reply: str) -> Turn:
    return Turn(rollout="r", index=index, dialect="openai_chat", status="ok",
                timings=Timings(0.0), raw_request=b"{}",
                request=ChatRequest(model="m", messages=tuple(messages)),
                completion=Completion("m", (Text(reply),), "stop", None, Tokens(
                    tuple(prompt), tuple(completion), tuple(-0.1 for _ in completion))))


def _plain(m: Message) -> str:
    return "".join(p.text for p in m.parts if isinstance(p, Text))


def _render(tokenizer, messages: list[Message], *, prefix: str = "") -> list[int]:
    chat = [{"role": m.role, "content": _plain(m)} for m in messages]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(prefix + text, add_special_tokens=False)


SYSTEM = Message("system", (Text("You are a careful coding agent. " * 8),))
USER = Message("user", (Text("list the files"),))
REPLY = "The files are a.txt and b.txt."
NEXT = Message("user", (Text("now read a.txt"),))


def test_same_reply_other_ids_is_retokenized(tokenizer) -> None:
    # the model sampled its reply one character at a time (ids a tokenizer would not
    # produce); the harness sends it back unchanged and the prompt holds the usual ids
    first = [SYSTEM, USER]
    prompt = _render(tokenizer, first)
    sampled = [i for ch in REPLY for i in tokenizer.encode(ch, add_special_tokens=False)]
    sampled.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    assert sampled[:-1] != tokenizer.encode(REPLY, add_special_tokens=False)
    second = [*first, Message("assistant", (Text(REPLY),)), NEXT]
    turns = [_turn(0, first, prompt, sampled, REPLY),
             _turn(1, second, _render(tokenizer, second), [5], "ok")]
    linked = link(turns)
    [drift] = drifts(linked.chains)
    assert linked.chains[1].start.within == "completion"
    assert drift.cause == "retokenized" and drift.where == "completion"


def test_same_messages_other_rendering_is_template(tokenizer) -> None:
    # the third prompt's template put a blank line between the first reply and the next
    # message (messages unchanged): the ids differ inside the second turn's inserted ids
    first = [SYSTEM, USER]
    reply_ids = [*tokenizer.encode(REPLY, add_special_tokens=False),
                 tokenizer.convert_tokens_to_ids("<|im_end|>")]
    second = [*first, Message("assistant", (Text(REPLY),)), NEXT]
    third = [*second, Message("assistant", (Text("ok"),)), Message("user", (Text("go"),))]
    ok_ids = [*tokenizer.encode("ok", add_special_tokens=False), reply_ids[-1]]
    boundary = "<|im_end|>\n<|im_start|>user\nnow read"
    rendered = tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": m.role, "content": _plain(m)} for m in third], tokenize=False,
        add_generation_prompt=True).replace(boundary, boundary.replace("\n", "\n\n", 1)),
        add_special_tokens=False)
    turns = [_turn(0, first, _render(tokenizer, first), reply_ids, REPLY),
             _turn(1, second, _render(tokenizer, second), ok_ids, "ok"),
             _turn(2, third, rendered, [5], "x")]
    linked = link(turns)
    assert [len(c.turns) for c in linked.chains] == [2, 1]
    assert linked.chains[1].start.within == "prompt"
    [drift] = drifts(linked.chains)
    assert drift.cause == "template" and drift.where == "template"


def test_reserialized_tool_call_arguments(tokenizer) -> None:
    # a template that prints arguments as given: the model wrote compact JSON, the
    # harness sent the call back pretty-printed (the same value)
    compact, pretty = '{"path":"a.txt"}', '{"path": "a.txt"}'
    first = [SYSTEM, USER]
    prompt = _render(tokenizer, first)
    sampled = tokenizer.encode(f"<tool_call>{compact}</tool_call><|im_end|>",
                               add_special_tokens=False)
    resent = Message("assistant", (ToolCall("c1", "read", pretty),))
    second = [*first, resent, NEXT]
    text = tokenizer.decode(prompt) + f"<tool_call>{pretty}</tool_call><|im_end|>\n"
    turns = [Turn(**{**_fields(_turn(0, first, prompt, sampled, "")), "completion": Completion(
                 "m", (ToolCall("c1", "read", compact),), "tool_calls", None,
                 Tokens(tuple(prompt), tuple(sampled), tuple(-0.1 for _ in sampled)))}),
             _turn(1, second, tokenizer.encode(text + "<|im_start|>user\nnow read a.txt",
                                               add_special_tokens=False), [5], "ok")]
    [drift] = drifts(link(turns).chains)
    assert drift.cause == "tool_json_reserialized" and drift.where == "completion"
    assert drift.old_text == "read(" + compact + ")" and drift.new_text == "read(" + pretty + ")"


def _fields(turn: Turn) -> dict:
    return {f: getattr(turn, f) for f in turn.__struct_fields__}


def test_a_request_not_stored_is_unclassified(tokenizer) -> None:
    first = [SYSTEM, USER]
    prompt = _render(tokenizer, first)
    reply_ids = tokenizer.encode(REPLY, add_special_tokens=False)
    second = [*first, Message("assistant", (Text("Something else entirely."),)), NEXT]
    turns = [_turn(0, first, prompt, reply_ids, REPLY),
             _turn(1, second, _render(tokenizer, second), [5], "ok")]
    bare = [Turn(**{**_fields(t), "request": None}) for t in turns]
    [stored] = drifts(link(turns).chains)
    [drift] = drifts(link(bare).chains)
    assert stored.cause == "completion_changed"
    assert drift.cause == "unclassified" and "not stored" in (drift.detail or "")


def test_first_chain_has_no_drift() -> None:
    assert classify(ChainBreak("first", 0), (), _turn(0, [USER], [1], [2], "x")) is None


def test_snippet_cuts_around_the_first_difference() -> None:
    old, new = snippet("a" * 200 + "XYZ" + "b" * 200, "a" * 200 + "XQZ" + "b" * 200, 10)
    # the first difference is at 201 (Y / Q): 10 characters each side of it
    assert old == "…" + "a" * 9 + "XYZ" + "b" * 8 + "…"
    assert new == "…" + "a" * 9 + "XQZ" + "b" * 8 + "…"
    assert snippet("same", "same") == ("same", "same")


def test_every_cause_is_explained() -> None:
    assert set(CAUSES) == set(get_args(DriftCause))
    assert all(where and what and training for where, what, training in CAUSES.values())


def test_recorded_bases_exist() -> None:
    assert all((RECORDED / f"{b}.json").is_file() for b in BASES)
    assert isinstance(RECORDED, Path)
