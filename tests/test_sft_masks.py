"""SFT on a teacher's conversations: the student's template renders them and the loss mask
covers exactly the assistant turns the teacher sampled, never a harness's own example turns
(issue 40's SFT arm trains on it)."""

from __future__ import annotations

import copy
import json

import pytest

from harnessrl.train.export.sft import message_rows, tokenized_messages
from harnessrl.types import (
    ChatRequest,
    Completion,
    Message,
    Outcome,
    Text,
    Timings,
    Tokens,
    Tool,
    ToolCall,
    ToolResult,
    Turn,
)

CALL = {"id": "c1", "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": "wc -l a.csv"})}}
MESSAGES = [
    {"role": "system", "content": "Answer with tools."},
    {"role": "user", "content": "How many rows does a.csv have?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "5 a.csv", "tool_call_id": "c1"},
    {"role": "assistant", "content": "It has 4 data rows."},
]
TOOLS = [{"type": "function", "function": {
    "name": "bash", "parameters": {"type": "object",
                                   "properties": {"command": {"type": "string"}}}}}]


def test_mask_is_the_assistant_turns_and_the_ids_are_the_whole_render(tokenizer):
    ids, mask = tokenized_messages(tokenizer, MESSAGES, TOOLS)
    whole = tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False)
    assert tokenizer.decode(ids) == whole and len(mask) == len(ids)
    learned = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert '"command": "wc -l a.csv"' in learned and "It has 4 data rows." in learned
    for not_learned in ("Answer with tools.", "How many rows", "5 a.csv", "<tools>"):
        assert not_learned not in learned
    # two assistant turns: two runs of ones, each ending the turn with the end token
    runs = sum(1 for a, b in zip([0, *mask], mask, strict=False) if b and not a)
    assert runs == 2 and learned.count(tokenizer.eos_token) == 2


def test_a_conversation_without_assistant_turns_learns_nothing(tokenizer):
    ids, mask = tokenized_messages(tokenizer, MESSAGES[:2])
    assert ids and not any(mask)


def test_a_template_that_rewrites_history_is_refused(tokenizer):
    other = copy.copy(tokenizer)
    other.chat_template = ("{{ messages | length }}{% for m in messages %}{{ m.role }}: "
                           "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}"
                           "assistant: {% endif %}")
    with pytest.raises(ValueError, match="prefix"):
        tokenized_messages(other, MESSAGES, TOOLS)


# ------------------------------------------------------------------ a harness's own turns
def _turn(index: int, messages: tuple[Message, ...], *reply: Text | ToolCall) -> Turn:
    request = ChatRequest("teacher", messages, tools=(Tool("bash", "runs"),))
    completion = Completion("teacher", reply, "stop", None, Tokens(None, None, None))
    return Turn("r1", index, "openai_chat", "ok", Timings(1.0 + index), b"{}",
                request=request, completion=completion)


def _learned(tokenizer, row) -> str:
    ids, mask = tokenized_messages(tokenizer, row["messages"], json.loads(row["tools"]))
    return tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])


def _row(turns: list[Turn]) -> dict:
    outcome = Outcome(harness="h", harness_version="1", task="t", sample=0, rollout="r1",
                      status="done", reward=1.0)
    [row] = message_rows(outcome, turns)
    return row


def test_a_harness_example_assistant_turn_is_context_not_learned(tokenizer):
    """aider's prompt carries its own worked example ("Hello" -> "Hey") and "Ok." turns as
    assistant messages: the teacher's reply is learned, they are not."""
    def say(role, text):
        return Message(role, (Text(text),))

    prompt = (say("system", "Act as an expert developer."),
              say("user", "Change the greeting to be more casual"),
              say("assistant", 'Ok, I will:\n\nshow_greeting.py\n```\nprint("Hey")\n```'),
              say("user", "I added these files to the chat."), say("assistant", "Ok."),
              say("user", "Write answer.txt with the count of sales staff."))
    row = _row([_turn(0, prompt, Text("Done.\n\nanswer.txt\n```\n3\n```"))])
    assert [m["sampled"] for m in row["messages"] if m["role"] == "assistant"] == [
        False, False, True]
    assert row["sampled_turns"] == 1
    learned = _learned(tokenizer, row)
    assert "answer.txt" in learned and "3" in learned
    for example in ("Hey", "show_greeting", "Ok."):
        assert example not in learned


def test_the_teachers_earlier_calls_are_learned_though_the_harness_replays_them_reworded(
        tokenizer):
    """A harness replays the model's call with a new id and re-serialised arguments: it is
    still the teacher's turn, and learned."""
    user = (Message("system", (Text("Use bash."),)), Message("user", (Text("Count rows."),)))
    call = ToolCall("call_a", "bash", '{"command":"wc -l a.csv"}')
    replayed = ToolCall("toolu_1", "bash", '{"command": "wc -l a.csv"}')
    history = (*user, Message("assistant", (replayed,)),
               Message("user", (ToolResult("toolu_1", (Text("5 a.csv"),)),)))
    row = _row([_turn(0, user, call), _turn(1, history, Text("It has 4 data rows."))])
    assert [m["sampled"] for m in row["messages"] if m["role"] == "assistant"] == [True, True]
    learned = _learned(tokenizer, row)
    assert "wc -l a.csv" in learned and "It has 4 data rows." in learned
    assert "5 a.csv" not in learned
    # the call's markup is the template's single added token, learned where the call starts
    ids, mask = tokenized_messages(tokenizer, row["messages"], json.loads(row["tools"]))
    markup = tokenizer.convert_tokens_to_ids("<tool_call>")
    assert tokenizer.encode("<tool_call>", add_special_tokens=False) == [markup]
    flags = [m for i, m in zip(ids, mask, strict=True) if i == markup]
    assert flags[-1] == 1 and sum(flags) == 1  # (the tools prompt shows the markup too)
