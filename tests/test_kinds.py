"""Call kinds (rollout/analysis/kinds.py) on scripted rollouts through the proxy, started from
real harness requests (tests/recorded): opencode's title call, a Claude Code subagent
started by its Agent tool, a scripted compaction; and the rows the training config keeps
when it leaves a kind out."""

from __future__ import annotations

import json

import httpx
import pytest

from harnessrl.proxy.engines.scripted import ScriptedEngine, replay
from harnessrl.rollout.analysis.chains import link
from harnessrl.rollout.analysis.kinds import CALL_KINDS, HINTS, label
from harnessrl.train.async_grpo.groups import score_group
from harnessrl.train.rows.samples import samples_for_rollout
from harnessrl.types import Outcome
from tests.helpers import RECORDED, ServedProxy, make_proxy, unredacted

TASK = "Find the file that configures the build and report its path."
SUMMARY = ("Summary of the session: the agent listed the files of the repository and found "
           "build.cfg; it still has to report the path.")


@pytest.fixture(scope="module")
def served(tokenizer, tmp_path_factory):
    engine = ScriptedEngine(tokenizer, replay(["x"]), model="scripted")
    with ServedProxy(make_proxy(engine, tmp_path_factory.mktemp("kinds"))).running() as s:
        yield s


def _body(name: str) -> dict:
    body = unredacted(json.loads((RECORDED / f"{name}.json").read_text())["body"])
    body["stream"] = False
    body.pop("stream_options", None)
    return body


def _call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class Conversation:
    """One rollout: each `send` posts a body and returns the reply, in its dialect."""

    def __init__(self, served, path: str, harness: str) -> None:
        self.served, self.path = served, path
        self.key = served.new_rollout(metadata={"harness": harness})["key"]

    def send(self, body: dict) -> dict:
        resp = httpx.post(f"{self.served.url}/r/{self.key}{self.path}", json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def turns(self):
        return self.served.store.turns(self.key)


def _chat(reply: dict) -> dict:
    return {k: v for k, v in reply["choices"][0]["message"].items() if v is not None}


def _tool_results(message: dict, content: str) -> list[dict]:
    return [{"role": "tool", "tool_call_id": c["id"], "content": content}
            for c in message.get("tool_calls") or []]


def opencode_rollout(served) -> list:
    served.proxy.engine.policy = replay(
        ["Listing build files", _call("bash", {"command": "ls"}), "It is build.cfg."])
    chat = Conversation(served, "/v1/chat/completions", "opencode")
    chat.send(_body("opencode/request-1"))  # the title call opencode makes first
    main = _body("opencode/request-2")
    reply = _chat(chat.send(main))
    chat.send({**main, "messages": [*main["messages"], reply, *_tool_results(reply, "build.cfg")]})
    return chat.turns()


def claude_rollout(served) -> list:
    served.proxy.engine.policy = replay([
        '{"title": "Find the build config"}',
        _call("Agent", {"description": "find config", "prompt": TASK}),
        _call("Bash", {"command": "ls"}), "It is build.cfg.", "The build config is build.cfg."])
    claude = Conversation(served, "/v1/messages", "claude")
    claude.send(_body("claude/request-title-call"))
    main = _body("claude/request-1")
    agent = claude.send(main)
    # the subagent: its own conversation, its task the Agent call's prompt
    sub = {**main, "system": "You are a subagent. Do the task and report.",
           "messages": [{"role": "user", "content": TASK}],
           "tools": [t for t in main["tools"] if t["name"] in ("Bash", "Read")]}
    bash = claude.send(sub)
    claude.send({**sub, "messages": [*sub["messages"],
                                     {"role": "assistant", "content": bash["content"]},
                                     _anthropic_results(bash, "build.cfg")]})
    claude.send({**main, "messages": [*main["messages"],
                                      {"role": "assistant", "content": agent["content"]},
                                      _anthropic_results(agent, "It is build.cfg.")]})
    return claude.turns()


def _anthropic_results(reply: dict, content: str) -> dict:
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": b["id"], "content": content}
        for b in reply["content"] if b["type"] == "tool_use"]}


def compaction_rollout(served) -> list:
    served.proxy.engine.policy = replay([
        _call("terminal", {"command": "ls"}), _call("terminal", {"command": "cat build.cfg"}),
        SUMMARY, _call("terminal", {"command": "pwd"}), "The path is ./build.cfg."])
    chat = Conversation(served, "/v1/chat/completions", "hermes-agent")
    body = _body("hermes-agent/request-1")
    history = list(body["messages"])
    for _ in range(2):
        reply = _chat(chat.send({**body, "messages": history}))
        history = [*history, reply, *_tool_results(reply, "build.cfg")]
    # the compaction call: a conversation of its own over the transcript
    chat.send({"model": body["model"], "stream": False, "messages": [
        {"role": "system", "content": "You summarize coding sessions."},
        {"role": "user", "content": json.dumps(history[1:])[:2000]}]})
    compacted = [history[0], history[1], {"role": "user", "content": SUMMARY}]
    reply = _chat(chat.send({**body, "messages": compacted}))
    chat.send({**body, "messages": [*compacted, reply, *_tool_results(reply, "/work")]})
    return chat.turns()


def test_opencode_title_call_is_side(served) -> None:
    turns = opencode_rollout(served)
    kinds = label(link(turns).chains, "opencode")
    assert kinds == {0: "side", 1: "main", 2: "main"}
    # without the harness's hint the structure alone cannot tell the first call apart
    assert label(link(turns).chains) == {0: "main", 1: "main", 2: "main"}


def test_claude_subagent_started_by_the_agent_tool(served) -> None:
    turns = claude_rollout(served)
    linked = link(turns)
    assert [[t.index for t in c.turns] for c in linked.chains] == [[0], [1, 4], [2, 3]]
    assert label(linked.chains, "claude") == {
        0: "side", 1: "main", 2: "subagent", 3: "subagent", 4: "main"}


def test_scripted_compaction(served) -> None:
    turns = compaction_rollout(served)
    linked = link(turns)
    assert [[t.index for t in c.turns] for c in linked.chains] == [[0, 1], [2], [3, 4]]
    assert label(linked.chains, "hermes-agent") == {
        0: "main", 1: "main", 2: "compaction", 3: "main", 4: "main"}


def test_rows_say_their_kind_and_the_config_leaves_kinds_out(served) -> None:
    turns = compaction_rollout(served)
    rows = samples_for_rollout(turns, harness="hermes-agent")
    assert [(s.turns, s.kind) for s in rows] == [
        ((0, 1), "main"), ((2,), "compaction"), ((3, 4), "main")]
    kept = samples_for_rollout(turns, ["main", "subagent"], "hermes-agent")
    assert [s.turns for s in kept] == [(0, 1), (3, 4)]
    titles = opencode_rollout(served)
    assert [s.kind for s in samples_for_rollout(titles, harness="opencode")] == ["side", "main"]
    assert [s.kind for s in samples_for_rollout(titles, ["main"], "opencode")] == ["main"]
    # GRPO's rows for a group: the same filter
    outcome = Outcome(harness="opencode", harness_version="1", task="t", sample=0,
                      rollout=titles[0].rollout, status="done", reward=1.0)
    _, all_rows = score_group(0, "t", [(outcome, titles)])
    _, main_rows = score_group(0, "t", [(outcome, titles)], kinds=("main",))
    assert [s.kind for s, _, _ in all_rows] == ["side", "main"]
    assert [s.kind for s, _, _ in main_rows] == ["main"]


def test_hints_name_known_harnesses_and_kinds() -> None:
    assert set(CALL_KINDS) == {"main", "side", "subagent", "compaction"}
    assert all(kind in CALL_KINDS for hints in HINTS.values() for kind, _ in hints)


def test_the_atlas_and_the_report_command(served, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # rich would fold the cells on a narrow terminal
    from harnessrl.cli import main
    from harnessrl.rollout.analysis.atlas import atlas
    from harnessrl.store.reader import TraceReader

    run = tmp_path / "run"
    with ServedProxy(make_proxy(served.proxy.engine, run)).running() as own:
        opencode_rollout(own)
        claude_rollout(own)
        compaction_rollout(own)
    with TraceReader(run) as store:
        found = atlas(store)
    assert set(found) == {(h, "scripted") for h in ("opencode", "claude", "hermes-agent")}
    claude, hermes = found["claude", "scripted"], found["hermes-agent", "scripted"]
    assert claude.kinds == {"side": 1, "main": 2, "subagent": 2}
    assert claude.causes == {"side_call": 2} and claude.stats.chains == 3
    assert hermes.kinds == {"main": 4, "compaction": 1}
    assert hermes.causes == {"side_call": 1, "summary_replaced_turns": 1}
    summary = hermes.examples["summary_replaced_turns"]
    assert summary["turn"] == 3 and SUMMARY[:40] in summary["new_text"]
    assert hermes.rows_per_rollout == 3.0
    assert main(["report", str(run), "--json", str(tmp_path / "atlas.json")]) == 0
    out = capsys.readouterr().out
    assert "drift atlas" in out and "summary_replaced_turns" in out and "subagent 2" in out
    written = json.loads((tmp_path / "atlas.json").read_text())
    assert {e["harness"] for e in written} == {"opencode", "claude", "hermes-agent"}


def test_conformance_drift_table(served) -> None:
    from harnessrl.rollout.conformance import Result, drift_markdown

    runs = []
    for token, rollout in ((False, compaction_rollout), (True, opencode_rollout)):
        turns = rollout(served)
        mode = "token" if token else "chat"
        result = Result("hermes-agent", "1", "openai_chat", mode)
        result.drift.add(turns[0].rollout, turns, "opencode" if token else None)
        runs.append(result)
    table = drift_markdown(runs).splitlines()
    assert table[2] == ("| hermes-agent | chat | 5 | 67% | 3 | side_call 1, "
                        "summary_replaced_turns 1 | compaction 1, main 4 |")
    assert table[3] == "| hermes-agent | token | 3 | 100% | 2 | side_call 1 | main 2, side 1 |"
    example = next(line for line in table if "| summary_replaced_turns | 3 |" in line)
    assert "Summary of the session" in example


def test_the_train_config_names_the_kinds_to_keep() -> None:
    import msgspec

    from harnessrl.train.config import TrainSettings

    assert TrainSettings().grpo.call_kinds == list(CALL_KINDS)
    kept = msgspec.convert({"grpo": {"call_kinds": ["main", "compaction"]}}, TrainSettings)
    assert kept.grpo.call_kinds == ["main", "compaction"]
    with pytest.raises(msgspec.ValidationError, match="call_kinds"):
        msgspec.convert({"grpo": {"call_kinds": ["title"]}}, TrainSettings)
