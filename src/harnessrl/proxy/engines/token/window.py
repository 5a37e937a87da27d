"""Render only a turn's new messages with the chat template, when the template allows it.

Why: a Jinja chat template costs about 20 µs per message, so rendering a 100-turn
conversation again each turn grows with the whole context. Most templates are *local*:
each message's text depends on the message, its neighbour and the first message (system
prompt, tool list), and the text of a conversation is that of its first messages followed
by that of the rest. For those, the new prompt is the previous prompt without its
generation prompt, plus what a small window renders after the last old message:

    window = [first message, last old message, new messages...]
    new prompt = old prompt - generation prompt + (render(window) - render(window[:2]))

Templates that are not local (Qwen3 drops earlier reasoning once a new user message
arrives) would be rendered wrongly that way, so a template is first put through a battery
of conversations (`is_local`); one that fails any is always rendered in full. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Render = Callable[[list[dict[str, Any]], bool], str]  # (messages, add_generation_prompt)

_CALL = {"id": "call_1", "type": "function",
         "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
_SYSTEM = {"role": "system", "content": "You are an agent."}
_USER = {"role": "user", "content": "Do the task."}
_THINKING = {"role": "assistant", "content": "Looking.", "reasoning_content": "Plan.",
             "tool_calls": [_CALL]}
_CALLING = {"role": "assistant", "content": None, "tool_calls": [_CALL]}
_RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}
_ANSWER = {"role": "assistant", "content": "Done."}
_REASONED = {"role": "assistant", "content": "Done.", "reasoning_content": "Checked."}
# Conversations whose every assistant message is a point where a prompt ended: they cover
# tool results after calls, several results in a row, new user text after an answer, and
# reasoning before and after a new user message (where Qwen3-style templates differ).
_BATTERY: tuple[list[dict[str, Any]], ...] = (
    [_SYSTEM, _USER, _THINKING, _RESULT, _CALLING, _RESULT, _RESULT, _ANSWER, _USER, _ANSWER],
    [_SYSTEM, _USER, _REASONED, _USER, _THINKING, _RESULT, _REASONED, _USER, _REASONED],
    [_USER, _CALLING, _RESULT, _ANSWER, _USER, _CALLING, _RESULT, _RESULT, _REASONED],
)


def windowed(render: Render, messages: Sequence[dict[str, Any]],
             old: Sequence[dict[str, Any]], old_prompt: str) -> str | None:
    """The prompt text for `messages` from `old_prompt` (the text rendered for `old`, a
    prefix of `messages`, with the generation prompt), or None when it cannot be had."""
    start = len(old)
    if start < 2 or len(messages) <= start or list(messages[:start]) != list(old):
        return None
    context = [messages[0], messages[start - 1]]
    bare = render(context, False)
    prompted = render(context, True)
    window = render([*context, *messages[start:]], True)
    if not (prompted.startswith(bare) and window.startswith(bare)):
        return None
    generation = prompted[len(bare):]
    if not old_prompt.endswith(generation):
        return None
    return old_prompt[:len(old_prompt) - len(generation)] + window[len(bare):]


def is_local(render: Render) -> bool:
    """Does the windowed text equal the full render at every point of the battery?"""
    try:
        for conversation in _BATTERY:
            for end, message in enumerate(conversation):
                if message["role"] != "assistant" or end < 2:
                    continue
                old = conversation[:end]
                for stop in range(end + 1, len(conversation) + 1):
                    got = windowed(render, conversation[:stop], old, render(old, True))
                    if got is None or got != render(conversation[:stop], True):
                        return False
    except Exception:  # a template that cannot render the battery is not local
        return False
    return True
