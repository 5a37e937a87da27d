"""Token mode on a `renderers` family: its renderer renders the prompt, and a turn that
follows a remembered one is made by the family's `bridge_to_next_turn`, which keeps the
earlier prompt + the sampled completion ids verbatim and renders only the new messages.

A turn is bridged when the harness sent back the remembered prompt's messages unchanged,
then the reply it was given (its text and calls; reasoning the harness may drop), then
only tool results or user messages. Otherwise, or when the family's bridge refuses (its
template drops earlier reasoning at a new user message, unless `thinking_retention` says
keep it), the whole conversation is rendered by the family, and our own text join
(`render.Renderer.render_text`) reuses the earlier ids where the text still extends them
(flagged `render_fallback`). A prompt that does not extend the rollout's last turn is
flagged `render_break:<reason>`: `history_changed`, `reply_edited`, `assistant_added`,
`bridge_refused` or `bridge_trimmed`.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from harnessrl.errors import InvalidRequest
from harnessrl.proxy.engines import openai_wire
from harnessrl.proxy.engines.token.render import Rendered, Renderer, TurnState
from harnessrl.types import ChatRequest, Delta, Message, Text, TextDelta, ToolCall, ToolCallDelta

ReplyKey = tuple[str, tuple[tuple[str, str], ...]]


class FamilyRenderer(Renderer):
    """`family`: a `renderers` Renderer for the tokenizer's model, made with the
    `configured` chat-template kwargs."""

    needs_template = False

    def __init__(self, tokenizer: Any, family: Any, *, memory: int = 4,
                 max_rollouts: int = 1024, configured: Mapping[str, Any] | None = None
                 ) -> None:
        super().__init__(tokenizer, memory=memory, max_rollouts=max_rollouts, windowed=False)
        self.family = family
        self.configured = dict(configured or {})
        self._by_effort: dict[str, Any] = {}

    def family_for(self, request: ChatRequest) -> Any:
        """The renderer for this call. A `renderers` renderer takes its template options
        when it is made, not per call, so a call's `reasoning_effort` gets a renderer of its
        own (made once per effort), set as vLLM sets the template's kwargs in chat mode:
        `reasoning_effort` where the family has it (gpt-oss, Qwen3.8, GLM-5.3, DeepSeek V4,
        ...) and `enable_thinking` off for "none", on otherwise, unless configured."""
        effort = request.reasoning_effort
        if effort is None:
            return self.family
        made = self._by_effort.get(effort)
        if made is None:
            made = self._by_effort[effort] = self._with_effort(effort)
        return made

    def _with_effort(self, effort: str) -> Any:
        import pydantic
        import renderers

        config = self.family.config
        fields = type(config).template_field_names()
        options: dict[str, Any] = {}
        thinking = "enable_thinking" in fields and "enable_thinking" not in self.configured
        if thinking:
            options["enable_thinking"] = effort != "none"
        # "none" is thinking off where the family can say so (its efforts may not list it)
        if "reasoning_effort" in fields and not (thinking and effort == "none"):
            options["reasoning_effort"] = effort
        if not options:
            return self.family  # a template with no such option ignores it
        try:
            return renderers.create_renderer(
                self.tokenizer, renderers.merge_chat_template_kwargs(config, options))
        except (ValueError, TypeError) as exc:
            why = (exc.errors()[0]["msg"] if isinstance(exc, pydantic.ValidationError)
                   else str(exc).splitlines()[0])  # pydantic's: "Input should be 'low', ..."
            raise InvalidRequest(f"reasoning_effort {effort!r} is not one this model's "
                                 f"{config.name} renderer takes ({why})",
                                 param="reasoning_effort") from exc

    def text(self, request: ChatRequest) -> str:
        parts = self._converted(request.messages, None)
        return self.decode(self._full_ids([m for p in parts for m in p], request))

    def _full_ids(self, messages: list[dict[str, Any]], request: ChatRequest) -> list[int]:
        return self.family_for(request).render_ids(messages, tools=_tools(request),
                                      add_generation_prompt=True)

    def render(self, request: ChatRequest, rollout: str | None = None) -> Rendered:
        states = self._states.get(rollout or "", [])
        parts = self._converted(request.messages, states[-1].prompt if states else None)
        messages = tuple(m for p in parts for m in p)
        reason = ""
        for state in reversed(states):
            bridged, why = self._bridge(state, request, parts)
            if bridged is not None:
                return Rendered(bridged[0], bridged[1], len(state.ids), "bridged",
                                request.messages, parts, messages)
            reason = reason or why
        ids = self._full_ids(list(messages), request)
        text = self.decode(ids)
        if not states:
            return Rendered(text, array("i", ids), 0, "full", request.messages, parts,
                            messages)
        joined = self.render_text(text, rollout)  # our join: the bridge gave nothing
        last = states[-1]
        extends = joined.reused >= len(last.ids) and text.startswith(last.text)
        breaks = () if extends else (reason or "history_changed",)
        if joined.mode == "extended":  # ids reused by our join, not by the family's bridge
            return Rendered(text, joined.ids, joined.reused, "fallback", request.messages,
                            parts, messages, None, breaks)
        return Rendered(text, array("i", ids), 0, joined.mode, request.messages, parts,
                        messages, None, breaks)

    def _bridge(self, state: TurnState, request: ChatRequest,
                parts: tuple[list[dict[str, Any]], ...]
                ) -> tuple[tuple[str, array] | None, str]:
        prompt = state.prompt
        if prompt is None or not prompt.source:
            return None, "history_changed"
        old = len(prompt.source)
        sent = request.messages
        if len(sent) <= old + 1 or sent[:old] != prompt.source:
            return None, "history_changed"
        echo = sent[old]
        if echo.role != "assistant" or (state.reply is not None
                                        and message_key(echo) != state.reply):
            return None, "reply_edited"
        if any(m.role == "assistant" for m in sent[old + 1:]):
            return None, "assistant_added"
        new = [m for p in parts[old + 1:] for m in p]
        earlier = state.ids.tolist()
        result = self.family_for(request).bridge_to_next_turn(
            earlier[:state.prompt_len], earlier[state.prompt_len:], new,
            tools=_tools(request))
        if result is None:
            return None, "bridge_refused"
        ids, n = result.token_ids, len(earlier)
        if ids[:n] != earlier:  # the bridge trimmed the earlier turn (C speed, ~0.1 ms)
            return None, "bridge_trimmed"
        out = state.ids[:]  # a copy of the kept ids (memcpy), then only the new ones
        out.extend(ids[n:])
        return (state.text + self.decode(ids[n:]), out), ""


def _tools(request: ChatRequest) -> list[dict[str, Any]] | None:
    return openai_wire.tools(request.tools) if request.tools else None


# ---------------------------------------------------------------- the reply, as sent
def _canonical(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, ensure_ascii=False)
    except (ValueError, RecursionError):
        return arguments


def message_key(message: Message) -> ReplyKey:
    """What of an assistant message must match the reply the harness was given."""
    text = "".join(p.text for p in message.parts if isinstance(p, Text))
    calls = tuple((p.name, _canonical(p.arguments)) for p in message.parts
                  if isinstance(p, ToolCall))
    return text.strip(), calls


def reply_key(deltas: Sequence[Delta]) -> ReplyKey:
    """`message_key` of the reply made of `deltas`."""
    text: list[str] = []
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        if isinstance(delta, TextDelta):
            text.append(delta.text)
        elif isinstance(delta, ToolCallDelta):
            call = calls.setdefault(delta.index, ["", ""])
            call[0] += delta.name or ""
            call[1] += delta.arguments
    return "".join(text).strip(), tuple((n, _canonical(a)) for n, a in calls.values())
