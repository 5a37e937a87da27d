"""SFT on a teacher's conversations: the student's template renders them and the loss mask
covers exactly the assistant turns (issue 40's SFT arm trains on it)."""

from __future__ import annotations

import copy
import json

import pytest

from harnessrl.train.sft import tokenized_messages

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
