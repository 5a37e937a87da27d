"""OpenAI Responses: `POST /v1/responses`, streamed and not (Codex speaks this).

Reasoning the proxy emits carries `encrypted_content` that is *not* encrypted: it is a
versioned, self-contained encoding of the canonical `Reasoning` (see `seal`). The proxy
keeps no per-item state, so the only way to give back exactly the reasoning that was
sampled when a harness resends its history (Codex sends `store: false` and relies on
`encrypted_content`) is to carry it inside the item itself. Opaque values that are not
ours (from a real OpenAI response) are kept as `Reasoning.encrypted` untouched.
"""

from __future__ import annotations

from typing import Any

import msgspec

from harnessrl.errors import HarnessRLError
from harnessrl.proxy.dialects import openai_common
from harnessrl.proxy.dialects.base import (
    NO_OPTIONS,
    Dialect,
    Generate,
    ReplyContext,
    Route,
    StreamOptions,
    fixed,
)
from harnessrl.proxy.dialects.openai_responses_request import (
    expand_history,
    parse_request,
    previous_reply,
    seal,
)
from harnessrl.proxy.wire import sse
from harnessrl.types import (
    ChatRequest,
    Chunk,
    Completion,
    EngineEvent,
    FinishReason,
    Part,
    Reasoning,
    ReasoningDelta,
    Started,
    Text,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)

name = "openai_responses"
id_prefix = "resp_"

_encode = msgspec.json.Encoder().encode


# ------------------------------------------------------------------ response
# finish reason -> (status, incomplete reason)
_STATUS: dict[str, tuple[str, str | None]] = {
    "stop": ("completed", None), "tool_calls": ("completed", None),
    "length": ("incomplete", "max_output_tokens"),
    "content_filter": ("incomplete", "content_filter"), "error": ("failed", None),
}
_TERMINAL_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete",
                   "failed": "response.failed"}


def _item_id(kind: str, ctx: ReplyContext, index: int) -> str:
    # Deterministic per response and position, so stream and final object agree.
    return f"{kind}_{ctx.id.removeprefix(id_prefix)}_{index}"


def _output_items(parts: tuple[Part, ...] | list[Part], ctx: ReplyContext,
                  status: str = "completed") -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, Text) and items and items[-1]["type"] == "message":
            items[-1]["content"].append(_text_part(part.text))  # one message, several parts
        elif isinstance(part, Text | Reasoning | ToolCall):
            items.append(_ITEM_JSON[type(part)](part, _item_id(_KIND[type(part)], ctx,
                                                                len(items)), status))
    return items


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _summary(text: str) -> list[dict[str, str]]:
    return [{"type": "summary_text", "text": text}] if text else []


_KIND = {Text: "msg", Reasoning: "rs", ToolCall: "fc"}
_ITEM_JSON: dict[type, Any] = {
    Text: lambda p, id_, st: {"id": id_, "type": "message", "status": st, "role": "assistant",
                              "content": [_text_part(p.text)]},
    Reasoning: lambda p, id_, st: {"id": id_, "type": "reasoning", "status": st,
                                   "summary": _summary(p.text), "encrypted_content": seal(p)},
    ToolCall: lambda p, id_, st: {"id": id_, "type": "function_call", "status": st,
                                  "call_id": p.id, "name": p.name, "arguments": p.arguments},
}


def _usage(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {"input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


def _response(ctx: ReplyContext, status: str, output: list[dict[str, Any]],
              usage: Usage | None = None) -> dict[str, Any]:
    # The fields the SDK's `Response` model requires, with neutral values: the proxy does
    # not echo the request (Codex's tool list alone is tens of kilobytes per event).
    return {"id": ctx.id, "object": "response", "created_at": ctx.created, "status": status,
            "error": None, "incomplete_details": None, "instructions": None, "model": ctx.model,
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": _usage(usage)}


def _finished(ctx: ReplyContext, parts: tuple[Part, ...] | list[Part], finish: FinishReason,
              usage: Usage | None) -> dict[str, Any]:
    status, reason = _STATUS[finish]
    body = _response(ctx, status, _output_items(parts, ctx, "completed" if reason is None
                                                else "incomplete"), usage)
    if reason is not None:
        body["incomplete_details"] = {"reason": reason}
    if status == "failed":
        body["error"] = {"code": "server_error", "message": "the engine stopped with an error"}
    return body


def render_completion(completion: Completion, ctx: ReplyContext) -> bytes:
    return _encode(_finished(ctx, completion.parts, completion.finish_reason, completion.usage))


class StreamEncoder:
    """Engine events in, Responses SSE events (each with a `sequence_number`) out.

    Each delta kind opens an output item (reasoning, message, or the `index`-th function
    call); a delta of another kind closes it first, so items come out in part order.
    """

    media_type = "text/event-stream"

    def __init__(self, request: ChatRequest, ctx: ReplyContext) -> None:
        self._ctx = ctx
        self._seq = 0
        self._parts: list[Part] = []
        self._open: Any = None  # the key of the open item: "rs", "msg" or a tool index
        # The open item's text (or arguments) as pieces, joined once when it is needed:
        # growing one string per token would copy the item so far on every token.
        self._pieces: list[str] = []
        self._text_where = b""  # the open message's text delta event after its number

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse.encode(_encode(data), kind)

    def _where(self) -> dict[str, Any]:
        index = len(self._parts) - 1
        kind = _KIND[type(self._parts[-1])]
        return {"item_id": _item_id(kind, self._ctx, index), "output_index": index}

    def feed(self, event: EngineEvent) -> bytes:
        if type(event) is Chunk and len(event.deltas) == 1 and self._open == "msg":
            delta = event.deltas[0]  # a token of the open message's text: the common chunk
            if type(delta) is TextDelta and delta.text:
                self._pieces.append(delta.text)
                return self._text_delta(delta.text)
        if isinstance(event, Started):
            start = _response(self._ctx, "in_progress", [])
            return (self._event("response.created", response=start)
                    + self._event("response.in_progress", response=start))
        if isinstance(event, Chunk):
            return b"".join(self._delta(d) for d in event.deltas)
        self._sync()
        body = _finished(self._ctx, self._parts, event.finish_reason, event.usage)
        return self._close() + self._event(_TERMINAL_EVENT[body["status"]], response=body)

    def _delta(self, delta: Any) -> bytes:
        if not isinstance(delta, ToolCallDelta) and not delta.text:
            return b""
        key = delta.index if isinstance(delta, ToolCallDelta) else _KIND[_PART[type(delta)]]
        out = b""
        if key != self._open:
            out = self._close() + self._start(delta)
            self._open = key
        return out + _ON_DELTA[type(delta)](self, delta)

    def _start(self, delta: Any) -> bytes:
        self._text_where = b""
        if isinstance(delta, ToolCallDelta):
            self._parts.append(ToolCall(delta.id or "", delta.name or "", ""))
        else:
            self._parts.append(_PART[type(delta)](""))
        item = _output_items(self._parts[-1:], self._ctx, "in_progress")[0]
        item["id"] = self._where()["item_id"]
        if item["type"] == "message":
            item["content"] = []
        if item["type"] == "reasoning":
            item["summary"] = []
            del item["encrypted_content"]
        out = self._event("response.output_item.added", output_index=len(self._parts) - 1,
                          item=item)
        return out + _ON_START.get(item["type"], lambda s: b"")(self)

    def _append(self, text: str) -> None:
        self._pieces.append(text)

    def _sync(self) -> None:
        """The open item's pieces into its part."""
        if self._pieces:
            last, grows = self._parts[-1], _GROWS[type(self._parts[-1])]
            self._parts[-1] = msgspec.structs.replace(
                last, **{grows: getattr(last, grows) + "".join(self._pieces)})
            self._pieces = []

    def _text_delta(self, text: str) -> bytes:
        """`response.output_text.delta`, preformatted: the bytes `_event` would give."""
        if not self._text_where:
            where = self._where()
            self._text_where = (b',"item_id":' + _encode(where["item_id"])
                                + b',"output_index":%d,"content_index":0,"delta":'
                                % where["output_index"])
        seq = self._seq
        self._seq += 1
        return (b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
                b'"sequence_number":%d' % seq + self._text_where + _encode(text)
                + b',"logprobs":[]}\n\n')

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._sync()
        self._open = None
        part, where = self._parts[-1], self._where()
        out = _ON_CLOSE[type(part)](self, part, where)
        item = _output_items([part], self._ctx)[0]
        item["id"] = where["item_id"]
        return out + self._event("response.output_item.done",
                                 output_index=where["output_index"], item=item)

    def error(self, err: HarnessRLError) -> bytes:
        # `response.failed` ends the lifecycle for clients that follow it (Codex); the
        # `error` event after it carries an `error` object, which makes the openai SDK
        # raise `APIError` with our message instead of ending quietly.
        self._sync()
        body = _response(self._ctx, "failed", _output_items(self._parts, self._ctx,
                                                            "incomplete"))
        body["error"] = {"code": _FAILED_CODES.get(err.kind, "server_error"),
                         "message": err.message}
        inner = openai_common.error_body(err)["error"]
        return (self._event("response.failed", response=body)
                + self._event("error", code=inner["code"], message=err.message,
                              param=err.param, error=inner))


_PART: dict[type, Any] = {TextDelta: Text, ReasoningDelta: Reasoning}
_GROWS = {Text: "text", Reasoning: "text", ToolCall: "arguments"}
_FAILED_CODES = {"rate_limit": "rate_limit_exceeded", "invalid_request": "invalid_prompt"}

_ON_START = {
    "message": lambda s: s._event("response.content_part.added", **s._where(), content_index=0,
                                  part=_text_part("")),
    "reasoning": lambda s: s._event("response.reasoning_summary_part.added", **s._where(),
                                    summary_index=0, part={"type": "summary_text", "text": ""}),
}


def _on_text(s: StreamEncoder, d: TextDelta) -> bytes:
    s._append(d.text)
    return s._text_delta(d.text)


def _on_reasoning(s: StreamEncoder, d: ReasoningDelta) -> bytes:
    s._append(d.text)
    return s._event("response.reasoning_summary_text.delta", **s._where(), summary_index=0,
                    delta=d.text)


def _on_tool(s: StreamEncoder, d: ToolCallDelta) -> bytes:
    if not d.arguments:
        return b""
    s._append(d.arguments)
    return s._event("response.function_call_arguments.delta", **s._where(), delta=d.arguments)


_ON_DELTA: dict[type, Any] = {TextDelta: _on_text, ReasoningDelta: _on_reasoning,
                              ToolCallDelta: _on_tool}


def _close_text(s: StreamEncoder, p: Text, where: dict[str, Any]) -> bytes:
    return (s._event("response.output_text.done", **where, content_index=0, text=p.text,
                     logprobs=[])
            + s._event("response.content_part.done", **where, content_index=0,
                       part=_text_part(p.text)))


def _close_reasoning(s: StreamEncoder, p: Reasoning, where: dict[str, Any]) -> bytes:
    return (s._event("response.reasoning_summary_text.done", **where, summary_index=0,
                     text=p.text)
            + s._event("response.reasoning_summary_part.done", **where, summary_index=0,
                       part={"type": "summary_text", "text": p.text}))


def _close_tool(s: StreamEncoder, p: ToolCall, where: dict[str, Any]) -> bytes:
    return s._event("response.function_call_arguments.done", **where, name=p.name,
                    arguments=p.arguments)


_ON_CLOSE: dict[type, Any] = {Text: _close_text, Reasoning: _close_reasoning,
                              ToolCall: _close_tool}


def stream_encoder(request: ChatRequest, ctx: ReplyContext,
                   _options: StreamOptions = NO_OPTIONS) -> StreamEncoder:
    return StreamEncoder(request, ctx)


# The error shape and models list are OpenAI's, shared with the other OpenAI dialect.
render_error = openai_common.render_error
render_models = openai_common.render_models

DIALECT = Dialect(
    name=name, id_prefix=id_prefix,
    routes=(Route("POST", "/v1/responses", fixed(Generate())),
            Route("POST", "/responses", fixed(Generate()))),
    parse_request=parse_request, render_completion=render_completion,
    stream_encoder=stream_encoder, render_models=render_models, render_error=render_error,
    previous_reply=previous_reply, expand_history=expand_history)
