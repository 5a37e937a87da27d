"""Call kinds: what the harness used each model call for. Pure functions, no I/O.

* `main`: the agent's own conversation (the rollout's first chain and what continues it).
* `side`: a call of its own beside it: a title, a summary of the session, a classifier or
  safety check (a chain that starts as a `side_call`, or a call a harness marks).
* `subagent`: its own conversation, started by a tool call of another one: the chain's
  first user message is an argument of an earlier turn's tool call.
* `compaction`: a call whose reply replaces earlier turns: a later chain's prompt holds
  the reply in a message that was not in the conversation it continues.

Labels come from the chain structure (`chains.link`) and the stored prompts; a harness
that marks its calls (opencode's title prompt, Claude Code's title schema) adds a hint
(`HINTS`). A chain that continues another (a history rewritten or rewound) takes the
kind of the chain it broke from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from harnessrl.rollout.analysis.chains import Chain
from harnessrl.types import CallKind, ChatRequest, Message, Text, ToolCall, Turn

CALL_KINDS: dict[CallKind, str] = {
    "main": "the agent's own conversation",
    "side": "a call beside it: a title, a session summary, a classifier or safety check",
    "subagent": "a conversation of its own, started by a tool call of another",
    "compaction": "a call whose reply replaces earlier turns of a chain (a summary)",
}
ALL_KINDS: tuple[CallKind, ...] = tuple(CALL_KINDS)
# Shorter replies are too common to say one prompt carries another's reply.
MIN_CARRIED_CHARS = 40

Hint = Callable[[ChatRequest], bool]


def _user_starts(prefix: str) -> Hint:
    def hint(request: ChatRequest) -> bool:
        return any(m.role == "user" and _text(m).startswith(prefix) for m in request.messages)
    return hint


def _title_schema(request: ChatRequest) -> bool:
    """Claude Code's title call asks for JSON output with one `title` property."""
    config = request.extra.get("output_config")
    schema = (config.get("format") or {}).get("schema") if isinstance(config, dict) else None
    return isinstance(schema, dict) and set(schema.get("properties") or {}) == {"title"}


# harness: ((kind, does the request say so), ...), as the harnesses were seen to send them
# (../shared/harnesses/*.md and wire/).
HINTS: dict[str, tuple[tuple[CallKind, Hint], ...]] = {
    "opencode": (("side", _user_starts("Generate a title for this conversation")),),
    "kilo": (("side", _user_starts("Generate a title for this conversation")),),
    "claude": (("side", _title_schema),),
}


def _text(m: Message) -> str:
    return "".join(p.text for p in m.parts if isinstance(p, Text))


def _first_user(request: ChatRequest | None) -> str:
    if request is None:
        return ""
    return next((t for m in request.messages if m.role == "user" and (t := _text(m))), "")


def _reply(turn: Turn) -> str:
    parts = turn.completion.parts if turn.completion is not None else ()
    return "".join(p.text for p in parts if isinstance(p, Text)).strip()


def _call_strings(turn: Turn) -> list[str]:
    """Every string value in the turn's tool-call arguments."""
    parts = turn.completion.parts if turn.completion is not None else ()
    out: list[str] = []
    for p in parts:
        if isinstance(p, ToolCall):
            try:
                out.extend(_strings(json.loads(p.arguments)))
            except ValueError:
                out.append(p.arguments)
    return out


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _hinted(turn: Turn, harness: str | None) -> CallKind | None:
    if turn.request is None or harness is None:
        return None
    hints = HINTS.get(harness.split("@")[0], ())  # a variant (opencode@anthropic): its harness's
    return next((kind for kind, says in hints if says(turn.request)), None)


def _spawned(head: Turn, earlier: Sequence[Turn]) -> bool:
    """Whether the chain's first user message was a tool-call argument of an earlier turn."""
    task = _first_user(head.request).strip()
    return bool(task) and any(task == s.strip() for t in earlier for s in _call_strings(t))


def _carrier(head: Turn, against: Sequence[Message], earlier: Sequence[Turn]) -> Turn | None:
    """The earlier turn whose reply this prompt carries in a message new to it."""
    if head.request is None:
        return None
    new = [_text(m) for m in head.request.messages if m not in against]
    for turn in reversed(earlier):
        reply = _reply(turn)
        if len(reply) >= MIN_CARRIED_CHARS and any(reply in text for text in new):
            return turn
    return None


def label(chains: Sequence[Chain], harness: str | None = None) -> dict[int, CallKind]:
    """Each trainable turn's kind, by turn index. Chains are in the order `link` gives
    them (by their first turn)."""
    kinds: dict[int, CallKind] = {}
    chain_of: dict[int, Chain] = {t.index: c for c in chains for t in c.turns}
    for chain in chains:
        head = chain.turns[0]
        earlier = sorted((t for c in chains for t in c.turns if t.index < head.index),
                         key=lambda t: t.index)
        kind = _hinted(head, harness) or _chain_kind(chain, chain_of, kinds, earlier, harness)
        for turn in chain.turns:
            kinds[turn.index] = _hinted(turn, harness) or kind
    return kinds


def _chain_kind(chain: Chain, chain_of: dict[int, Chain], kinds: dict[int, CallKind],
                earlier: Sequence[Turn], harness: str | None) -> CallKind:
    start, head = chain.start, chain.turns[0]
    if start.reason == "first":
        return "main"
    closest = chain_of.get(start.against) if start.against is not None else None
    against = _request(closest.turns[-1] if closest else None)
    if (carried := _carrier(head, against, earlier)) is not None:
        kinds[carried.index] = "compaction"  # its reply replaced the turns before it
        return _continued(carried, chain_of, kinds)
    # a prompt close to a call the harness marked (a title call's system prompt is the
    # agent's own) is not that call: another conversation
    marked = closest is not None and _hinted(closest.turns[0], harness) is not None
    if start.reason == "side_call" or marked:
        if _spawned(head, earlier):
            return "subagent"
        # a harness that asks for a title first: the agent's conversation comes after it
        return "side" if "main" in kinds.values() else "main"
    return kinds.get(start.against, "main") if start.against is not None else "main"


def _request(turn: Turn | None) -> Sequence[Message]:
    return turn.request.messages if turn is not None and turn.request is not None else ()


def _continued(carried: Turn, chain_of: dict[int, Chain], kinds: dict[int, CallKind]
               ) -> CallKind:
    """The kind of the conversation a compaction summarised: its chain's, or when the
    compaction call was a conversation of its own, the one that call broke from."""
    chain = chain_of[carried.index]
    own = len(chain.turns) == 1 and chain.start.against is not None
    kind = kinds.get(chain.start.against if own and chain.start.against is not None
                     else chain.turns[0].index, "main")
    return "main" if kind in ("compaction", "side") else kind


def chain_kind(chain: Chain, kinds: dict[int, CallKind]) -> CallKind:
    """A chain's kind as a row: its first turn's (a compaction call that extends the main
    conversation stays in the main row)."""
    return kinds.get(chain.turns[0].index, "main")
