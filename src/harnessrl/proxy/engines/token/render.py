"""Token mode's prompt rendering: the model's own chat template and tokenizer, reusing the
exact ids of a rollout's earlier turns wherever the new prompt's text extends them.

Why: a harness sends its whole history back each turn. Tokenizing that text again gives
the tokenizer's canonical ids, which are not always the ids the model sampled (a model
may write "hello" as "hel"+"lo"); the next prompt then no longer starts with the
previous prompt + completion, and the turns cannot be trained on as one sequence. Here
the earlier ids are kept and only the new text is tokenized, so a history sent back
unchanged is, token for token, what the model saw and produced.

Cost: only the text after the longest reused prefix is tokenized, and for templates that
allow it (`window.is_local`) only the turn's new messages are rendered, so both grow with
a turn's new tokens, not with the conversation.

The seam: tokenizing `prefix` and `suffix` apart equals tokenizing `prefix + suffix` when
the cut sits next to an added token (`<|im_end|>`, `<tool_call>`, ...), because the
tokenizer splits the text at those before any merge. Elsewhere a merge could cross the
cut, so the text from the last added token before the cut is tokenized again and checked
against the kept ids; if they disagree the whole prompt is tokenized afresh (`fallback`).

Pure: no I/O; the tokenizer is any Hugging Face (fast) tokenizer.
"""

from __future__ import annotations

import contextlib
import json
import logging
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from harnessrl.proxy.engines import openai_wire
from harnessrl.proxy.engines.token.window import is_local, windowed
from harnessrl.types import ChatRequest, Message

log = logging.getLogger(__name__)

RenderMode = Literal["full", "extended", "fallback", "bridged"]
# Kept (text offset, id count) pairs per state, newest last: enough to find the last few
# turns' prompts and completions without scanning a rollout's whole history.
_ANCHORS = 16


@dataclass(frozen=True, slots=True)
class Rendered:
    """A rendered prompt. `reused` ids came from an earlier turn; `mode` says how:
    `full` (nothing to reuse), `extended` (earlier ids + the new text's ids),
    `fallback` (an earlier turn's text matched but the seam was unsafe, so the whole
    prompt was tokenized again) or `bridged` (a `renderers` family's bridge extended the
    last turn). `breaks`: why the prompt does not extend the rollout's last turn, when
    that is known (see `family`)."""

    text: str
    ids: array  # array('i')
    reused: int
    mode: RenderMode
    # What the template was given, kept so the next turn can render only its new messages:
    # the request's messages, each one's template dicts, all of them flat, the options.
    source: tuple[Message, ...] = ()
    parts: tuple[list[dict[str, Any]], ...] = ()
    messages: tuple[dict[str, Any], ...] | None = None
    kwargs: dict[str, Any] | None = None
    breaks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TurnState:
    """Text and ids of one turn (prompt + completion) with the points where they align."""

    text: str
    ids: array
    anchors: tuple[tuple[int, int], ...]  # (text offset, id count), ascending
    prompt: Rendered | None = None  # the prompt of this turn, with its template input
    prompt_len: int = 0  # how many of `ids` are the prompt's
    reply: Any = None  # what the harness was given (family.reply_key), to know its echo


class Renderer:
    """Renders requests for one model; remembers each rollout's last few turns.

    `memory` turns per rollout are kept (several, because harnesses interleave side calls
    such as titles with the main conversation) and `max_rollouts` rollouts, least
    recently used first out; a forgotten rollout is rendered in full (or re-loaded by
    the engine from the store).
    """

    needs_template = True  # a subclass that renders without the Jinja template says False

    def __init__(self, tokenizer: Any, *, chat_template: str | None = None,
                 memory: int = 4, max_rollouts: int = 1024, windowed: bool = True,
                 verify_every: int = 16,
                 template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = chat_template or getattr(tokenizer, "chat_template", None) or ""
        if not self.template and self.needs_template:
            raise ValueError("the tokenizer has no chat template; token mode needs one")
        self.template_kwargs = dict(template_kwargs or {})
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        # Templates that test `arguments is string` render the sampled JSON text verbatim
        # (exact); the others iterate a mapping, so they get the parsed object.
        self._string_arguments = "arguments is string" in self.template
        self._boundaries = _boundary_tokens(tokenizer)
        self._lengths = sorted({len(t) for t in self._boundaries}, reverse=True)
        self._seam_tokens = [t for t in self._boundaries if t in self.template]
        self.memory = memory
        self.max_rollouts = max_rollouts
        self._states: OrderedDict[str, list[TurnState]] = OrderedDict()
        # Windowed renders are checked against a full render every `verify_every`-th time;
        # one difference turns windowing off for good.
        self.windowed = windowed and self.needs_template and is_local(self._battery_render)
        self.verify_every = verify_every
        self._windowed_count = 0

    # ------------------------------------------------------------ tokenizer access
    def encode(self, text: str) -> list[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)

    def text(self, request: ChatRequest) -> str:
        """The prompt text the template makes of `request`, ready for the reply."""
        parts = self._converted(request.messages, None)
        return self._template([m for p in parts for m in p], self._kwargs(request), True)

    def _converted(self, messages: tuple[Message, ...], previous: Rendered | None
                   ) -> tuple[list[dict[str, Any]], ...]:
        """Each message as the template's dicts (a function of that message alone): one
        equal to the previous prompt's at the same place (structs compared in C) keeps its
        dicts, so converting costs the new messages only."""
        old = previous.source if previous is not None else ()
        parts: list[list[dict[str, Any]]] = []
        for position, message in enumerate(messages):
            if position < len(old) and old[position] == message:
                parts.append(previous.parts[position])  # type: ignore[union-attr]
                continue
            converted = openai_wire._message(message)  # one message, as messages() does
            if not self._string_arguments:
                converted = [_parsed_arguments(m) for m in converted]
            parts.append(converted)
        return tuple(parts)

    def _kwargs(self, request: ChatRequest) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(self.template_kwargs)
        if request.tools:
            kwargs["tools"] = openai_wire.tools(request.tools)
        effort = request.reasoning_effort
        if effort is not None:  # as vLLM hands it to the template in chat mode
            kwargs["reasoning_effort"] = effort
            kwargs.setdefault("enable_thinking", effort != "none")
        return kwargs

    def _template(self, messages: list[dict[str, Any]], kwargs: dict[str, Any],
                  generation: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, chat_template=self.template, tokenize=False,
            add_generation_prompt=generation, **kwargs)

    def _battery_render(self, messages: list[dict[str, Any]], generation: bool) -> str:
        if not self._string_arguments:
            messages = [_parsed_arguments(m) for m in messages]
        tools = [{"type": "function", "function": {"name": "bash", "parameters": {
            "type": "object", "properties": {"command": {"type": "string"}}}}}]
        return self._template(messages, {**self.template_kwargs, "tools": tools}, generation)

    # ------------------------------------------------------------ rendering
    def render(self, request: ChatRequest, rollout: str | None = None) -> Rendered:
        states = self._states.get(rollout or "", ())
        parts = self._converted(request.messages, states[-1].prompt if states else None)
        messages = tuple(m for p in parts for m in p)
        kwargs = self._kwargs(request)
        text = self._windowed_text(messages, kwargs, states) if self.windowed else None
        if text is None:
            text = self._template(list(messages), kwargs, True)
        rendered = self.render_text(text, rollout)
        return Rendered(rendered.text, rendered.ids, rendered.reused, rendered.mode,
                        request.messages, parts, messages, kwargs)

    def _windowed_text(self, messages: tuple[dict[str, Any], ...], kwargs: dict[str, Any],
                       states: Sequence[TurnState]) -> str | None:
        """The prompt from an earlier turn's prompt and the new messages alone."""
        for state in reversed(states):
            old = state.prompt
            if old is None or old.messages is None or old.kwargs != kwargs:
                continue
            text = windowed(lambda m, g: self._template(m, kwargs, g), messages,
                            old.messages, old.text)
            if text is not None:
                return self._verified(text, messages, kwargs)
        return None

    def _verified(self, text: str, messages: tuple[dict[str, Any], ...],
                  kwargs: dict[str, Any]) -> str:
        self._windowed_count += 1
        if self._windowed_count % self.verify_every:
            return text
        full = self._template(list(messages), kwargs, True)
        if full != text:
            log.warning("token mode: the chat template renders a conversation differently "
                        "from its parts; rendering every prompt in full from now on")
            self.windowed = False
        return full

    def render_text(self, text: str, rollout: str | None = None) -> Rendered:
        """Ids for `text`, reusing the longest matching earlier turn of `rollout`."""
        offset, count, state = self._best_match(text, self._states.get(rollout or "", ()))
        if state is None or offset == 0:
            return Rendered(text, array("i", self.encode(text)), 0, "full")
        ids = self._extend(text, state.ids, offset, count)
        if ids is None:
            return Rendered(text, array("i", self.encode(text)), 0, "fallback")
        return Rendered(text, ids, count, "extended")

    def _best_match(self, text: str, states: Sequence[TurnState]
                    ) -> tuple[int, int, TurnState | None]:
        best: tuple[int, int, TurnState | None] = (0, 0, None)
        # The common case first: the whole previous turn is a prefix of the new prompt.
        for state in states:
            if len(state.text) > best[0] and text.startswith(state.text):
                best = (len(state.text), len(state.ids), state)
        if best[2] is not None:
            return best
        for state in states:
            for offset, count in reversed(state.anchors):
                if offset <= best[0]:
                    break
                if text.startswith(state.text[:offset]):
                    best = (offset, count, state)
                    break
        return best

    def _extend(self, text: str, ids: array, offset: int, count: int) -> array | None:
        if self._safe_cut(text, offset):
            out = ids[:count]
            out.extend(self.encode(text[offset:]))
            return out
        # Tokenize again from the last added token before the cut: the kept ids of that
        # stretch must be its canonical ids, and no merge may cross the cut.
        start = self._last_boundary(text, offset)
        head = self.encode(text[start:offset])
        window = self.encode(text[start:])
        if (len(head) <= count and window[:len(head)] == head
                and ids[count - len(head):count].tolist() == head):
            out = ids[:count]
            out.extend(window[len(head):])
            return out
        return None

    def _safe_cut(self, text: str, offset: int) -> bool:
        if offset >= len(text):
            return True
        for size in self._lengths:
            if ((size <= offset and text[offset - size:offset] in self._boundaries)
                    or text[offset:offset + size] in self._boundaries):
                return True
        return False

    def _last_boundary(self, text: str, offset: int) -> int:
        found = 0
        for token in self._seam_tokens:
            at = text.rfind(token, found, offset)
            if at >= 0:
                found = max(found, at + len(token))
        return found

    # ------------------------------------------------------------ memory
    def remember(self, rollout: str | None, rendered: Rendered, completion_ids: Sequence[int],
                 completion_text: str | None = None, reply: Any = None) -> None:
        """Keep a finished turn so the rollout's next prompt can reuse its ids."""
        if not rollout:
            return
        prompt_len = len(rendered.ids)
        text = rendered.text + (completion_text if completion_text is not None
                                else self.decode(completion_ids))
        ids = array("i", rendered.ids)
        ids.extend(completion_ids)
        states = self._states.pop(rollout, [])
        # The state this prompt extended is contained in the new one: drop it, keep its
        # anchors (they still describe the new text's start).
        base = next((s for s in states if rendered.mode in ("extended", "bridged")
                     and text.startswith(s.text)), None)
        inherited = base.anchors if base is not None else ()
        anchors = (*inherited, (len(rendered.text), prompt_len), (len(text), len(ids)))
        states = [s for s in states if s is not base]
        # The template input, without a second copy of the ids.
        prompt = Rendered(rendered.text, array("i"), 0, rendered.mode, rendered.source,
                          rendered.parts, rendered.messages, rendered.kwargs)
        states.append(TurnState(text, ids, tuple(sorted(set(anchors)))[-_ANCHORS:], prompt,
                             prompt_len, reply))
        self._states[rollout] = states[-self.memory:]
        while len(self._states) > self.max_rollouts:
            self._states.popitem(last=False)

    def restore(self, rollout: str, turns: Sequence[tuple[Sequence[int], Sequence[int]]]
                ) -> None:
        """Re-create a rollout's memory from stored (prompt ids, completion ids), oldest
        first: after a restart the text is the ids' own decoding."""
        for prompt_ids, completion_ids in turns[-self.memory:]:
            prompt_text = self.decode(prompt_ids)
            self.remember(rollout, Rendered(prompt_text, array("i", prompt_ids), 0, "full"),
                          completion_ids)
        self._states.setdefault(rollout, [])

    def knows(self, rollout: str) -> bool:
        if rollout in self._states:
            self._states.move_to_end(rollout)
            return True
        return False

    def forget(self, rollout: str) -> None:
        self._states.pop(rollout, None)


def _boundary_tokens(tokenizer: Any) -> frozenset[str]:
    """Added tokens the tokenizer splits on before any merge, whole and without eating
    the whitespace next to them (lstrip/rstrip would move the seam)."""
    found: set[str] = set()
    for token in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if any(getattr(token, flag, False) for flag in ("lstrip", "rstrip", "single_word")):
            continue
        content = getattr(token, "content", str(token))
        if content:
            found.add(content)
    return frozenset(found)


def _parsed_arguments(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = []
    for call in calls:
        function = dict(call["function"])
        # Not JSON (or too deep to follow): the template gets the text the model wrote.
        with contextlib.suppress(TypeError, ValueError, RecursionError):
            function["arguments"] = json.loads(function["arguments"])
        fixed.append({**call, "function": function})
    return {**message, "tool_calls": fixed}
