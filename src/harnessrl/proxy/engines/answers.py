"""An OpenAI-compatible engine's answers, typed: chat completions (`message`/`delta`,
logprobs per content token) and text completions (`text`, `token_logprobs`), whole or as
stream chunks. Decoding straight into these skips every field we do not use
(top_logprobs, bytes, ...) and gives token ids as tuples without a copy."""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec

from harnessrl.errors import EngineError
from harnessrl.proxy.engines.upstream import engine_error
from harnessrl.types import TokenId, Usage


class Logprob(msgspec.Struct):
    logprob: float


class Logprobs(msgspec.Struct):
    content: list[Logprob] | None = None  # chat completions
    token_logprobs: list[float | None] = []  # text completions


class Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class ToolCall(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    function: Function | None = None


class Message(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(msgspec.Struct):
    text: str = ""  # text completions
    message: Message | None = None  # chat completions
    delta: Message | None = None  # chat completion chunks
    finish_reason: str | None = None
    token_ids: tuple[TokenId, ...] | None = None
    prompt_token_ids: tuple[TokenId, ...] | None = None  # text completions
    logprobs: Logprobs | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Body(msgspec.Struct):
    model: str = ""
    prompt_token_ids: tuple[TokenId, ...] | None = None  # chat completions
    choices: list[Choice] = []
    usage: _Usage | None = None
    error: Any = None


class StreamChoice(msgspec.Struct):
    """A chat completion chunk's choice: only what a stream chunk carries."""

    delta: Message | None = None
    finish_reason: str | None = None
    token_ids: tuple[TokenId, ...] | None = None
    logprobs: Logprobs | None = None


class StreamBody(msgspec.Struct):
    """A chat completion chunk, decoded narrowly: one is decoded per token."""

    model: str = ""
    prompt_token_ids: tuple[TokenId, ...] | None = None
    choices: list[StreamChoice] = []
    usage: _Usage | None = None
    error: Any = None


_decode_body = msgspec.json.Decoder(Body).decode
_decode_chunk = msgspec.json.Decoder(StreamBody).decode


def decode(raw: bytes | str, what: str) -> Body:
    """An answer or a chunk (`what` names it in the error); an error body is an error."""
    return _checked(_decoded(_decode_body, raw, what))


def decode_chunk(raw: bytes | str) -> StreamBody:
    """A chat completion chunk; an error body is an error."""
    try:  # the common chunk, with no calls between: one is decoded per token
        body = _decode_chunk(raw)
    except msgspec.DecodeError:
        pass
    else:
        if body.error is None:
            return body
    try:
        return _checked(_decoded(_decode_chunk, raw, "a chunk"))
    except EngineError:
        if not isinstance(raw, bytes):
            raise
        # Told as the text it is in the stream, as before chunks stayed bytes.
        return _checked(_decoded(_decode_chunk, raw.decode("utf-8", "replace"), "a chunk"))


def _decoded(decoder: Any, raw: bytes | str, what: str) -> Any:
    try:
        return decoder(raw)
    except msgspec.DecodeError as exc:
        if isinstance(raw, bytes):  # not UTF-8, say: read as SSE text is (bad bytes replaced)
            with contextlib.suppress(msgspec.DecodeError):
                return decoder(raw.decode("utf-8", errors="replace"))
        raise EngineError(f"the engine sent {what} that is not the expected JSON ({exc}): "
                          f"{raw[:200]!r}") from exc


def _checked(body: Any) -> Any:
    if body.error is not None:
        raise engine_error(500, {"error": body.error}, b"")
    return body


def usage(body: Body | StreamBody) -> Usage | None:
    counted = body.usage
    return None if counted is None else Usage(counted.prompt_tokens, counted.completion_tokens)
