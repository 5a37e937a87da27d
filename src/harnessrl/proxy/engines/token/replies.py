"""Sampled reply -> deltas for the harness, with the parser token mode resolved for the
model (`formats`): a `renderers` family's `parse_response`, or vLLM's parser by name.

Those parsers read a whole completion (by special-token ids), so `WholeParser` streams by
parsing the ids received so far each time they have grown by an eighth (at most ~40
parses for a 2,000-token reply) and sending the reasoning and content that were added
since; tool calls go out when the reply is complete. A call whose markup is broken
(unclosed, bad JSON, no name) reaches the harness as the text the model wrote, never
dropped, and the turn's ids and text are recorded as sampled.

`hermes` and `qwen3_coder` on the template path keep the incremental parsers in
`parsers`/`toolformats` (`TextParser` adapts them).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from harnessrl.types import Delta, ReasoningDelta, TextDelta, ToolCallDelta

log = logging.getLogger(__name__)
_GROWTH = 8  # re-parse once the ids grew by 1/_GROWTH since the last parse
_EAGER = 16  # below this many ids, every read is parsed (the first words show at once)


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    arguments: str  # JSON text
    id: str | None = None  # the format's own id (Kimi K2 writes one)


@dataclass(slots=True)
class Parsed:
    content: str = ""
    reasoning: str = ""
    calls: list[Call] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)  # the text of calls that did not parse


Parse = Callable[[list[int], bool], Parsed]  # (ids so far, whether the reply is whole)


class ReplyParser(Protocol):
    @property
    def calls(self) -> int: ...

    def feed(self, text: str, ids: Sequence[int]) -> list[Delta]: ...

    def finish(self) -> list[Delta]: ...


class TextParser:
    """An incremental text parser (`parsers.HermesParser` and its subclasses)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @property
    def calls(self) -> int:
        return self.inner.calls

    def feed(self, text: str, ids: Sequence[int]) -> list[Delta]:
        return self.inner.feed(text) if text else []

    def finish(self) -> list[Delta]:
        return self.inner.finish()


class WholeParser:
    """Streams a whole-reply parser's output as deltas (see the module doc).
    `stream_text=False` holds all text to the end: for formats whose calls open without a
    special token (Llama 3's bare JSON), where early text may turn out to be a call."""

    def __init__(self, parse: Parse, *, stream_text: bool = True,
                 new_id: Callable[[], str] | None = None,
                 decode: Callable[[list[int]], str] | None = None) -> None:
        self._parse = parse
        self._decode = decode  # the reply as text, if the parser itself fails
        self._stream = stream_text
        self._ids: list[int] = []
        self._next = 1
        self._sent = {"reasoning": "", "content": ""}
        self._calls = 0
        self._new_id = new_id or (lambda: f"call_{uuid.uuid4().hex[:24]}")
        self.broken: list[str] = []

    @property
    def calls(self) -> int:
        return self._calls

    def feed(self, text: str, ids: Sequence[int]) -> list[Delta]:
        self._ids.extend(ids)
        if not self._stream or len(self._ids) < self._next:
            return []
        size = len(self._ids)
        self._next = size + 1 if size < _EAGER else size + size // _GROWTH
        return self._text_deltas(self._safe_parse(), final=False)

    def finish(self) -> list[Delta]:
        parsed = self._safe_parse(final=True)
        out = self._text_deltas(parsed, final=True)
        for call in parsed.calls:
            out.append(ToolCallDelta(index=self._calls, id=call.id or self._new_id(),
                                     name=call.name, arguments=call.arguments))
            self._calls += 1
        if parsed.broken:
            log.warning("token mode: %d tool call(s) with broken markup passed on as text",
                        len(parsed.broken))
            self.broken = parsed.broken
            out.extend(TextDelta(raw) for raw in parsed.broken)
        return out

    def _safe_parse(self, *, final: bool = False) -> Parsed:
        try:
            return self._parse(self._ids, final)
        except Exception as exc:  # a parser bug must not lose the reply: pass it as text
            log.warning("token mode: the reply parser failed (%s); the reply goes on as "
                        "text", exc)
            if not final or self._decode is None:
                return Parsed()
            return Parsed(content=self._decode(self._ids))

    def _text_deltas(self, parsed: Parsed, *, final: bool) -> list[Delta]:
        out: list[Delta] = []
        for kind, text, make in (("reasoning", parsed.reasoning, ReasoningDelta),
                                 ("content", parsed.content, TextDelta)):
            # Parsers strip the whitespace around a whole reply's parts: a part so far
            # goes out without its trailing whitespace, and is compared without leading.
            text = (text if final else text.rstrip()).lstrip()
            sent = self._sent[kind]
            if text.startswith(sent):
                new = text[len(sent):]
            elif final:  # the parser changed its mind about text already sent
                log.warning("token mode: streamed %s differs from the whole reply's", kind)
                new = ""
            else:
                continue
            if new:
                out.append(make(new))
                self._sent[kind] = text
        return out


# ---------------------------------------------------------------- the two sources
def family_parse(renderer: Any, tokenizer: Any, tools: list[dict[str, Any]] | None,
                 prompt_tail: list[int]) -> Parse:
    """A `renderers` family's `parse_response`; `prompt_tail` (the prompt's last ids) says
    whether the prompt opened reasoning."""
    from renderers import ToolCallParseStatus

    def parse(ids: list[int], _final: bool) -> Parsed:
        reply = renderer.parse_response(list(ids), tools=tools, prompt_ids=prompt_tail)
        parsed = Parsed(reply.content or "", reply.reasoning_content or "")
        for call in reply.tool_calls:
            if call.status == ToolCallParseStatus.OK and call.name:
                parsed.calls.append(Call(call.name, _json(call.arguments), call.id))
            else:
                parsed.broken.append(_raw(tokenizer, ids, call))
        return parsed
    return parse


def _raw(tokenizer: Any, ids: list[int], call: Any) -> str:
    if call.token_span is not None:
        start, end = call.token_span
        return tokenizer.decode(ids[start:end], skip_special_tokens=False)
    return call.raw


def _json(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)


class VLLMParsers:
    """vLLM's tool-call (and reasoning) parser classes by name, for the template path.
    They read decoded text with special tokens kept (vLLM's completions text drops them,
    so the ids are decoded here), without the stop token."""

    def __init__(self, tokenizer: Any, tool_call_parser: str,
                 reasoning_parser: str | None, stop_ids: Sequence[int]) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.reasoning import ReasoningParserManager
        from vllm.tool_parsers import ToolParserManager

        self.tokenizer = tokenizer
        self.tool_class = ToolParserManager.get_tool_parser(tool_call_parser)
        self.reasoning_class = (ReasoningParserManager.get_reasoning_parser(reasoning_parser)
                                if reasoning_parser else None)
        self.stop_ids = frozenset(stop_ids)
        # Where a reply so far stops being plain text: vLLM's parsers give an unfinished
        # call back as content, which must not reach the harness as text.
        self.markup_ids = frozenset(getattr(tokenizer, "all_special_ids", ())) - self.stop_ids
        self._request = ChatCompletionRequest
        self.tool_class(tokenizer)  # a tokenizer without the format's tokens fails here

    def parse_for(self, tools: list[dict[str, Any]] | None) -> Parse:
        make: Any = self._request  # a pydantic model: its defaulted fields are optional
        request = make(model="m", messages=[{"role": "user", "content": ""}],
                       tools=tools or None)

        def parse(ids: list[int], final: bool) -> Parsed:
            end = len(ids)
            while end and ids[end - 1] in self.stop_ids:
                end -= 1
            if not final:
                end = next((n for n, i in enumerate(ids[:end]) if i in self.markup_ids), end)
            text = self.tokenizer.decode(ids[:end], skip_special_tokens=False)
            reasoning = None
            if self.reasoning_class is not None:
                reasoning, text = self.reasoning_class(self.tokenizer).extract_reasoning(
                    text, request)
            info = self.tool_class(self.tokenizer).extract_tool_calls(text or "", request)
            if not info.tools_called:
                return Parsed(text or "", reasoning or "")
            calls = [Call(c.function.name, c.function.arguments) for c in info.tool_calls]
            return Parsed(info.content or "", reasoning or "", calls)
        return parse
