"""Drift: why a chain broke, in causes a user can act on. Pure functions, no I/O.

`chains.link` says where a turn's prompt left the closest chain (`ChainBreak.diverged_at`)
and whether that position lies in an earlier turn's sampled completion or in the tokens
inserted before it. This module reads the canonical messages of the turns on both sides
to say what lies there: a completion sent back with its whitespace or tool-call JSON
changed or its reasoning removed, a tool result edited or truncated, a changed system
prompt, dropped or reordered messages, a summary in place of earlier turns, or nothing at
all in the messages (the template's own tokens). When the messages cannot tell (a request
not stored, messages that differ before the ids do, two changes the ids cannot order) the
cause is `unclassified`, never a guess.

The ids around the first difference are kept on both sides (`Drift.old_ids`/`new_ids`)
for a viewer that has the tokenizer to decode them; `old_text`/`new_text` are the
messages' own text around their first differing character, which needs no tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

from harnessrl.rollout.analysis.chains import Chain
from harnessrl.types import (
    CallKind,
    ChainBreak,
    DriftCause,
    Message,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
    Turn,
)

Region = Literal["completion", "inserted", "template", "after", "unknown"]
CONTEXT_IDS = 24  # ids kept on each side of the first difference
CONTEXT_CHARS = 80  # characters of message text kept on each side

# cause: (where it lies, what it is, what it means for training and how to avoid it)
CAUSES: dict[DriftCause, tuple[Region, str, str]] = {
    "whitespace": (
        "completion", "an earlier reply sent back with its whitespace changed (trimmed, "
        "newlines collapsed)",
        "the chain ends there; re-rendering it would train on text the model never "
        "sampled. Token mode reuses the sampled ids; a harness that keeps the reply "
        "verbatim avoids it"),
    "tool_json_reserialized": (
        "completion", "an earlier tool call sent back with its arguments re-serialized "
        "(same JSON value, other spacing or key order)",
        "the model's own call text is lost on re-render. Token mode keeps the sampled ids; "
        "a renderers family that prints arguments the way the model wrote them avoids it"),
    "reasoning_removed": (
        "completion", "an earlier reply sent back without its reasoning",
        "the reasoning the model sampled is not in the next prompt, so the turns cannot be "
        "one sequence. Keep reasoning in history (thinking retention, the harness's "
        "setting to resend it) or train each turn as its own row"),
    "completion_changed": (
        "completion", "an earlier reply's text or tool call edited by the harness",
        "what the next turns saw is not what the model sampled; train the turns apart"),
    "retokenized": (
        "completion", "an earlier reply sent back unchanged, but rendered to other ids "
        "than the model sampled (the tokenizer splits its text otherwise, or the template "
        "prints it otherwise, e.g. drops earlier reasoning or reformats a tool call)",
        "re-tokenization drift proper: token mode (the proxy reuses the sampled ids) "
        "removes it; a chat-mode trainer re-rendering the text would train on other ids"),
    "tool_result_changed": (
        "inserted", "an earlier tool result edited (e.g. cleared or replaced by a note)",
        "only masked tokens changed; the chain breaks but no sampled token is lost"),
    "tool_result_truncated": (
        "inserted", "an earlier tool result shortened",
        "only masked tokens changed; a harness setting for a larger output limit avoids "
        "it"),
    "system_prompt_changed": (
        "inserted", "the system or developer prompt changed (a timestamp, a reminder, a "
        "mode)",
        "every later turn starts a new chain; fix the harness's system prompt (no clock "
        "in it) to keep one sequence"),
    "tools_changed": (
        "inserted", "the tool definitions changed (tools added, removed or reworded)",
        "the prompt's head changes, so the whole chain restarts; pin the tool set"),
    "message_changed": (
        "inserted", "an earlier user or tool message edited in place (a reminder "
        "added, text replaced)",
        "only masked tokens changed; the chain breaks but no sampled token is lost"),
    "messages_dropped": (
        "inserted", "earlier messages left out of the prompt",
        "the next turns saw less than the chain holds; they train as their own rows"),
    "messages_reordered": (
        "inserted", "earlier messages sent back in another order",
        "the next turns saw another history; they train as their own rows"),
    "summary_replaced_turns": (
        "inserted", "a summary in place of earlier turns (context compaction)",
        "by design: the compacted conversation is a new sequence; keep the compaction "
        "call's rows to train the summaries"),
    "template": (
        "template", "the messages are the same, the ids are not: the chat template "
        "rendered them differently (a date, a flag such as thinking)",
        "a renderers family or token mode, which reuse the earlier ids, avoid it"),
    "rewound": (
        "after", "the prompt ends inside the chain: the harness went back (a retry, a "
        "regenerated reply)",
        "the rewound turn trains as its own row; nothing is lost"),
    "side_call": (
        "after", "another conversation (a title, a summary, a subagent)",
        "not drift: its own sequence; the call kinds say what it was for"),
    "unclassified": (
        "unknown", "the stored messages cannot tell (not stored, or they differ before "
        "the ids do, or two changes the ids cannot order)",
        "counted so that the share the atlas cannot explain is visible"),
}


class Drift(msgspec.Struct, frozen=True, omit_defaults=True):
    """The cause of one chain break and what lies around its first difference.

    `message` is the index (in the new prompt's messages) of the first message that
    differs, when the cause is a message; `old_ids` and `new_ids` start at `ids_start`
    in the closest chain's ids and the new prompt's ids."""

    cause: DriftCause
    where: Region
    turn: int
    against: int | None = None
    within_turn: int | None = None
    message: int | None = None
    detail: str | None = None
    old_text: str | None = None
    new_text: str | None = None
    diverged_at: int | None = None
    ids_start: int | None = None
    old_ids: tuple[int, ...] = ()
    new_ids: tuple[int, ...] = ()


_Found = tuple[DriftCause, int | None, str | None, str, str]  # cause, message, detail, texts


def classify(start: ChainBreak, chain: Sequence[Turn], turn: Turn) -> Drift | None:
    """The drift behind `start`, the break of `turn` against the closest chain `chain`
    (its turns in order; turns after `start.against` are ignored). None for a rollout's
    first chain, which broke from nothing."""
    if start.reason == "first":
        return None
    before = [t for t in chain if start.against is None or t.index <= start.against]
    ids = _window(start, before, turn)
    base = {"turn": turn.index, "against": start.against, "within_turn": start.within_turn,
            "diverged_at": start.diverged_at, **ids}
    if start.reason == "rewound" or (
            start.reason == "side_call" and not _same_conversation(before, turn)):
        return Drift(start.reason, "after", **base)
    found = _find(start, before, turn)
    if isinstance(found, str):
        return Drift("unclassified", "unknown", detail=found, **base)
    cause, message, detail, old, new = found
    old_text, new_text = snippet(old, new)
    return Drift(cause, CAUSES[cause][0], message=message, detail=detail,
                 old_text=old_text, new_text=new_text, **base)


def _history(last: Turn) -> tuple[Message, ...]:
    """A chain's whole conversation at its last turn: that turn's prompt and its reply."""
    assert last.request is not None and last.completion is not None
    return (*last.request.messages, Message("assistant", last.completion.parts))


def _same_conversation(chain: Sequence[Turn], turn: Turn) -> bool:
    """Whether a prompt that shares little of the chain's ids (a `side_call` by the ids)
    still holds its conversation: its task and first reply after a changed system prompt
    or tool set, which can be most of a prompt's head."""
    last = chain[-1] if chain else None
    if last is None or last.request is None or last.completion is None \
            or turn.request is None:
        return False
    history = [m for m in _history(last) if m.role != "system"]
    new = [m for m in turn.request.messages if m.role != "system"]
    same = next((k for k, (a, b) in enumerate(zip(history, new, strict=False))
                 if _key(a) != _key(b)), min(len(history), len(new)))
    return same >= 2 and any(m.role == "assistant" for m in new[:same])


def _window(start: ChainBreak, chain: Sequence[Turn], turn: Turn) -> dict[str, object]:
    at = start.diverged_at
    last = chain[-1].completion if chain else None
    if at is None or last is None or turn.completion is None:
        return {}
    old = (*(last.tokens.prompt_ids or ()), *(last.tokens.completion_ids or ()))
    lo = max(0, at - CONTEXT_IDS)
    return {"ids_start": lo, "old_ids": tuple(old[lo:at + CONTEXT_IDS]),
            "new_ids": tuple((turn.completion.tokens.prompt_ids or ())[lo:at + CONTEXT_IDS])}


def _find(start: ChainBreak, chain: Sequence[Turn], turn: Turn) -> _Found | str:
    """The cause, or why it cannot be told (a str)."""
    pos = next((k for k, t in enumerate(chain) if t.index == start.within_turn), None)
    if pos is None or start.within is None:
        return "the break does not say where the prompt left the chain"
    within, last = chain[pos], chain[-1]
    if any(t.request is None or t.completion is None for t in (within, last)) \
            or turn.request is None:
        return "a request of the break was not stored (read with bodies)"
    assert within.request is not None and last.request is not None and last.completion
    old, new = within.request.messages, turn.request.messages
    history = _history(last)
    if start.within == "completion":
        return _in_completion(within, history, new)
    prev = chain[pos - 1].request if pos > 0 else None
    if pos > 0 and prev is None:
        return "a request of the chain was not stored"
    first_new = 0 if prev is None else len(prev.messages) + 1  # after the earlier reply
    tools_differ = within.request.tools != turn.request.tools
    return _in_inserted(history, new, (first_new, len(old)), tools_differ, head=pos == 0)


# ------------------------------------------------------------------ inside a completion
def _in_completion(within: Turn, history: Sequence[Message], new: Sequence[Message]
                   ) -> _Found | str:
    assert within.request is not None and within.completion is not None
    k = len(within.request.messages)  # where the turn's reply sits in the next prompt
    if k >= len(new) or new[k].role != "assistant":
        return f"message {k} of the new prompt is not the reply the ids say it is"
    parts, sent = within.completion.parts, new[k].parts
    reply = Message("assistant", parts)
    if (moved := _moved(reply, new[k], history, new, k)) is not None:
        return moved, k, None, _message_text(parts), _message_text(sent)
    for name, compare in _COMPLETION_CHECKS:
        if (cause := compare(parts, sent)) is not None:
            return cause, k, name, _message_text(parts), _message_text(sent)
    return "retokenized", k, None, _message_text(parts), _message_text(sent)


def _moved(a: Message, b: Message, old: Sequence[Message], new: Sequence[Message], i: int
           ) -> DriftCause | None:
    """Message `i` is another message of the history: messages reordered or dropped."""
    later_old, later_new = {_key(m) for m in old[i + 1:]}, {_key(m) for m in new[i + 1:]}
    if _key(b) not in later_old:
        return None
    return "messages_reordered" if _key(a) in later_new else "messages_dropped"


def _reasoning(parts: Sequence[object]) -> str:
    return "".join(p.text for p in parts if isinstance(p, Reasoning))


def _texts(parts: Sequence[object]) -> str:
    return "".join(p.text for p in parts if isinstance(p, Text))


def _calls(parts: Sequence[object]) -> list[ToolCall]:
    return [p for p in parts if isinstance(p, ToolCall)]


def _check_reasoning(old: Sequence[object], new: Sequence[object]) -> DriftCause | None:
    was, now = _reasoning(old), _reasoning(new)
    if was == now:
        return None
    return "reasoning_removed" if was and not now else "completion_changed"


def _check_text(old: Sequence[object], new: Sequence[object]) -> DriftCause | None:
    was, now = _texts(old), _texts(new)
    if was == now:
        return None
    return "whitespace" if was.split() == now.split() else "completion_changed"


def _check_calls(old: Sequence[object], new: Sequence[object]) -> DriftCause | None:
    was, now = _calls(old), _calls(new)
    if len(was) != len(now) or any(a.name != b.name for a, b in zip(was, now, strict=True)):
        return "completion_changed"
    for a, b in zip(was, now, strict=True):
        if a.arguments != b.arguments:
            return "tool_json_reserialized" if _same_json(a.arguments, b.arguments) \
                else "completion_changed"
    return None


def _same_json(a: str, b: str) -> bool:
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return False


# In the order a template renders a reply: reasoning, text, tool calls.
_COMPLETION_CHECKS = (("reasoning", _check_reasoning), ("text", _check_text),
                      ("tool calls", _check_calls))


# ------------------------------------------------------------------ inside inserted tokens
def _in_inserted(history: Sequence[Message], new: Sequence[Message], span: tuple[int, int],
                 tools_differ: bool, *, head: bool) -> _Found | str:
    """`span`: the messages the ids say the difference lies in (the turn's new ones)."""
    i = next((k for k, (a, b) in enumerate(zip(history, new, strict=False)) if a != b),
             min(len(history), len(new)))
    if i < span[0] - 1:
        return f"message {i} differs, before the ids do (the template may hide it)"
    if i > span[1] or (i == span[1] and tools_differ):  # the turn's messages all agree
        return ("tools_changed" if tools_differ else "template"), None, None, "", ""
    if tools_differ and head:
        return f"the tools and message {i} both changed; the ids cannot say which first"
    a = history[i] if i < len(history) else None
    b = new[i] if i < len(new) else None
    if a is not None and b is not None and b.role == "assistant" and i == span[1]:
        return f"message {i} is a reply where the ids say the prompt left the chain"
    cause = _message_cause(a, b, history, new, i)
    return cause, i, None, _message_text(a.parts) if a else "", _message_text(b.parts) if b else ""


def _key(m: Message) -> tuple[str, str]:
    """A message as rendered text, so a reply and its resent copy (new call ids) match."""
    return m.role, _message_text(m.parts)


def _message_cause(a: Message | None, b: Message | None, old: Sequence[Message],
                   new: Sequence[Message], i: int) -> DriftCause:
    if a is None:  # the whole history is there, and more
        return "template"
    if b is None:
        return "messages_dropped"
    if "system" in (a.role, b.role):
        return "system_prompt_changed"
    if (results := _results(a)) and _results(b).keys() == results.keys():
        return _result_cause(results, _results(b))
    if (moved := _moved(a, b, old, new, i)) is not None:
        return moved
    if len(new) <= len(old):  # shorter than the history it continues, with a new message
        # One reply gone and a message in its place: the harness rejected the reply (a
        # format error sent back instead, as mini-swe-agent does); more gone: a summary.
        # This names the break from the messages; what the trainer masks as rejected is
        # decided from the token ids (chains.dropped_replies), which can differ.
        kept = {_key(m) for m in new}
        gone = [m for m in old[i:] if _key(m) not in kept]
        if len(gone) == 1 and gone[0].role == "assistant":
            return "messages_dropped"
        return "summary_replaced_turns"
    return "message_changed"


def _results(m: Message) -> dict[str, str]:
    return {p.call_id: "".join(c.text for c in p.content if isinstance(c, Text))
            for p in m.parts if isinstance(p, ToolResult)}


def _result_cause(old: dict[str, str], new: dict[str, str]) -> DriftCause:
    for call, was in old.items():
        now = new[call]
        if now == was:
            continue
        shared = _common_chars(was, now)
        # shorter, and mostly the old result's start (a truncation note may follow it)
        return "tool_result_truncated" if len(now) < len(was) and shared * 2 >= len(now) \
            else "tool_result_changed"
    return "message_changed"  # the same results: another part of the message changed


# ------------------------------------------------------------------ text
def _message_text(parts: Sequence[object]) -> str:
    out: list[str] = []
    for p in parts:
        if isinstance(p, Reasoning | Text) and p.text:
            out.append(p.text)
        elif isinstance(p, ToolCall):
            out.append(f"{p.name}({p.arguments})")
        elif isinstance(p, ToolResult):
            out.extend(c.text for c in p.content if isinstance(c, Text))
    return "\n".join(out)


def _common_chars(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((k for k in range(n) if a[k] != b[k]), n)


def snippet(old: str, new: str, context: int = CONTEXT_CHARS) -> tuple[str, str]:
    """Both texts around their first differing character, with "…" where cut."""
    at = _common_chars(old, new)
    lo = max(0, at - context)

    def cut(s: str) -> str:
        return ("…" if lo else "") + s[lo:at + context] + ("…" if at + context < len(s) else "")

    return cut(old), cut(new)


def region(cause: DriftCause) -> Region:
    return CAUSES[cause][0]


def drifts(chains: Sequence[Chain], kinds: Mapping[int, CallKind] | None = None
           ) -> list[Drift]:
    """The drift behind every break of one rollout's chains (`chains.link`). With the
    turns' call `kinds` (`rollout.analysis.kinds.label`), a break between calls of two kinds (a
    title call, then the agent's conversation with the same system prompt) is a
    `side_call`, whatever the messages say."""
    chain_of = {t.index: c for c in chains for t in c.turns}
    out: list[Drift] = []
    for chain in chains:
        against = chain.start.against
        closest = chain_of.get(against) if against is not None else None
        found = classify(chain.start, closest.turns if closest else (), chain.turns[0])
        if found is None:
            continue
        was, now = (kinds.get(against) if kinds and against is not None else None,
                    kinds.get(found.turn) if kinds else None)
        if was is not None and now is not None and was != now and found.cause != "side_call":
            found = msgspec.structs.replace(found, cause="side_call", where="after",
                                            detail=f"a {now} call after a {was} call")
        out.append(found)
    return out
