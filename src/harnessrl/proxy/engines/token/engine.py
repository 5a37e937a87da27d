"""vLLM in token mode (token-in, token-out): the proxy renders the prompt itself.

The conversation is rendered with the model's own tokenizer and chat template
(`render.Renderer`), reusing the exact ids of the rollout's earlier turns wherever the new
text extends them; the ids go to vLLM's `/v1/completions` as a token prompt with
`return_token_ids` and `logprobs`, streamed when the client streams; the sampled text is
parsed into reasoning and tool calls here (`toolformats`), in the model's own format.

Why: in chat mode vLLM tokenizes the re-sent history again, and any reply the model did
not write in the tokenizer's canonical ids (or whose text the harness or the template
changes) breaks the chain of turns that training needs. Here the ids the model sampled
stay in the prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncGenerator
from typing import Any

import msgspec

from harnessrl.errors import EngineError
from harnessrl.proxy.engines import openai_wire
from harnessrl.proxy.engines.answers import Choice, decode, usage
from harnessrl.proxy.engines.base import TurnSource
from harnessrl.proxy.engines.token import formats
from harnessrl.proxy.engines.token.family import FamilyRenderer, reply_key
from harnessrl.proxy.engines.token.render import Rendered, Renderer
from harnessrl.proxy.engines.token.replies import (
    ReplyParser,
    TextParser,
    VLLMParsers,
    WholeParser,
    family_parse,
)
from harnessrl.proxy.engines.token.toolformats import make_parser
from harnessrl.proxy.engines.upstream import FIRST_BYTE_TIMEOUT, Upstream
from harnessrl.proxy.engines.vllm import (
    ExtraBody,
    merge_chunks,
    served_models,
    weight_version,
)
from harnessrl.types import (
    ChatRequest,
    Chunk,
    Delta,
    EngineEvent,
    Finished,
    FinishReason,
    Started,
    Usage,
)

log = logging.getLogger(__name__)
_encode = msgspec.json.encode
# Tokens that end an assistant message in the templates we know, besides the tokenizer's
# EOS; one is a stop token only if the template writes it (its text then follows the
# reply in the next prompt, so the sampled ids are reused there).
_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")
# Formats whose calls open without a special token (bare JSON, Python lists): early text
# may turn out to be a call, so their text goes out when the reply is whole.
_HOLD_TEXT = frozenset({"llama-3", "llama3_json", "llama4_json", "pythonic",
                        "llama4_pythonic"})
_PROMPT_TAIL = 64  # prompt ids a family parser sees (whether the prompt opened reasoning)


class TokenEngine:
    """`tokenizer`: the served model's tokenizer (a local path or a loaded tokenizer);
    `renderer`, `tool_parser`, `reasoning_parser`, `chat_template`, `chat_template_kwargs`:
    how the model is rendered and parsed (`formats.resolve`; refused here when they cannot
    be decided); `extra_body`: fields merged into each vLLM request (tests use it to force
    text with structured outputs); `render_window=False` renders every prompt's whole
    conversation through the template."""

    name = "vllm-token"

    def __init__(self, base_url: str, tokenizer: Any, *, tool_parser: str | None = None,
                 reasoning_parser: str | None = None, renderer: str | None = None,
                 chat_template: str | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None,
                 extra_body: ExtraBody | None = None,
                 read_timeout: float = 600.0, connect_timeout: float = 10.0,
                 api_key: str | None = None, memory: int = 4,
                 render_window: bool = True,
                 first_byte_timeout: float = FIRST_BYTE_TIMEOUT,
                 stream_interval: float = 0.0) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.weight_version: str | None = None
        self.http = Upstream(self.base_url, read_timeout=read_timeout,
                             connect_timeout=connect_timeout, api_key=api_key,
                             first_byte_timeout=first_byte_timeout,
                             stream_interval=stream_interval)
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.format = formats.resolve(
            tokenizer, renderer=renderer, tool_call_parser=tool_parser,
            reasoning_parser=reasoning_parser, chat_template=chat_template,
            chat_template_kwargs=chat_template_kwargs)
        log.info("token mode: %s", self.format.why)
        self.tokenizer = tokenizer
        self.renderer: Renderer
        self._vllm_parsers: VLLMParsers | None = None
        if self.format.renderer is not None:
            self.renderer = FamilyRenderer(tokenizer, self.format.renderer, memory=memory,
                                           configured=self.format.template_kwargs)
            self.stop_ids = list(dict.fromkeys(self.format.renderer.get_stop_token_ids()))
        else:
            self.renderer = Renderer(tokenizer, chat_template=chat_template, memory=memory,
                                     windowed=render_window,
                                     template_kwargs=self.format.template_kwargs)
            self.stop_ids = _stop_ids(tokenizer, self.renderer.template)
            self._vllm_parsers = self._template_parsers()
        self.tool_parser = self.format.tool_call_parser or self.format.family
        self.extra_body = extra_body
        self.max_model_len: int | None = None
        self.renders: Counter[str] = Counter()  # render modes so far: full/extended/fallback
        self._store: TurnSource | None = None

    def forget_rollout(self, key: str) -> None:
        """The rollout is closed: its reusable ids are no longer needed."""
        self.renderer.forget(key)

    def bind_store(self, store: TurnSource) -> None:
        """Where a rollout's earlier turns are found after a restart."""
        self._store = store

    async def start(self) -> None:
        await self.http.start()
        self.weight_version = await weight_version(self.http)
        served = await served_models(self.http)
        lengths = [m.get("max_model_len") for m in served]
        self.max_model_len = next((n for n in lengths if isinstance(n, int)), None)

    async def close(self) -> None:
        await self.http.close()

    async def models(self) -> list[str]:
        return [m["id"] for m in await served_models(self.http)]

    async def count_tokens(self, request: ChatRequest) -> int:
        rendered = await asyncio.to_thread(self.renderer.render, request)
        return len(rendered.ids)

    # ---------------------------------------------------------------- rendering
    async def render(self, request: ChatRequest, key: str | None = None) -> Rendered:
        if key and self._store is not None and not self.renderer.knows(key):
            await asyncio.to_thread(self._restore, key)
        rendered = await asyncio.to_thread(self.renderer.render, request, key)
        self.renders[rendered.mode] += 1
        if rendered.mode == "fallback":
            log.warning("token mode: rollout %s: the prompt extends an earlier turn's text "
                        "but not at a safe token boundary; tokenized in full", key)
        return rendered

    def _restore(self, key: str) -> None:
        assert self._store is not None
        done = []
        for turn in self._store.turns(key):
            tokens = turn.completion.tokens if turn.completion is not None else None
            if (turn.status == "ok" and turn.engine == self.name and tokens is not None
                    and tokens.prompt_ids and tokens.completion_ids is not None):
                done.append((tokens.prompt_ids, tokens.completion_ids))
        self.renderer.restore(key, done)

    def _body(self, request: ChatRequest, rendered: Rendered, *, stream: bool) -> bytes:
        body: dict[str, Any] = {
            "model": request.model, "prompt": rendered.ids.tolist(),
            **openai_wire.sampling(request.sampling),
            "logprobs": 0, "return_token_ids": True, "stream": stream,
            "stop_token_ids": self.stop_ids,
        }
        if request.sampling.max_tokens is None and self.max_model_len is not None:
            # /v1/completions defaults to 16 tokens; chat mode's default is the room left.
            body["max_tokens"] = max(1, self.max_model_len - len(rendered.ids))
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.extra_body is not None:
            body.update(self.extra_body(request) or {})
        return _encode(body)

    def _template_parsers(self) -> VLLMParsers | None:
        name = self.format.tool_call_parser
        if name in formats.OWN_TOOL_PARSERS and self.format.reasoning_parser is None:
            make_parser(name)
            return None
        assert name is not None
        try:
            return VLLMParsers(self.tokenizer, name, self.format.reasoning_parser,
                               self.stop_ids)
        except (RuntimeError, KeyError, ValueError) as exc:
            raise ValueError(f"--tool-call-parser {name!r} cannot read this model's "
                             f"replies: {exc}") from None

    def _text_of(self, ids: list[int]) -> str:
        stops = set(self.stop_ids)
        return self.renderer.decode([i for i in ids if i not in stops])

    def _started(self, request: ChatRequest, rendered: Rendered, reported: Any) -> Started:
        ids = tuple(reported) if reported is not None else tuple(rendered.ids)
        flags = ("render_fallback",) if rendered.mode == "fallback" else ()
        flags += tuple(f"render_break:{reason}" for reason in rendered.breaks)
        if len(ids) != len(rendered.ids) or ids != tuple(rendered.ids):
            flags += ("prompt_ids_changed",)  # the engine did not use the ids we sent
        return Started(request.model, ids, flags)

    def _parser(self, request: ChatRequest, rendered: Rendered) -> ReplyParser:
        tools = openai_wire.tools(request.tools) if request.tools else None
        family = self.format.family
        if family is not None:
            tail = rendered.ids[-_PROMPT_TAIL:].tolist()
            parse = family_parse(self.format.renderer, self.tokenizer, tools, tail)
            return WholeParser(parse, stream_text=family not in _HOLD_TEXT,
                               decode=self._text_of)
        name = self.format.tool_call_parser or ""
        if self._vllm_parsers is not None:
            return WholeParser(self._vllm_parsers.parse_for(tools),
                               stream_text=name not in _HOLD_TEXT, decode=self._text_of)
        thinking = rendered.text.rstrip("\n").endswith("<think>")
        return TextParser(make_parser(name, request.tools, in_reasoning=thinking))

    # ---------------------------------------------------------------- calls
    async def complete(self, request: ChatRequest, rollout: str | None = None
                       ) -> list[EngineEvent]:
        rendered = await self.render(request, rollout)
        payload = self._body(request, rendered, stream=False)
        raw = await self.http.answer(f"{self.base_url}/v1/completions", payload)
        body = decode(raw, "an answer")
        if not body.choices:
            raise EngineError("the engine answered with no choices")
        choice = body.choices[0]
        parser = self._parser(request, rendered)
        ids, logprobs = _tokens(choice)
        deltas = parser.feed(choice.text, ids or ()) + parser.finish()
        self._remember(rollout, rendered, ids, choice.finish_reason, deltas)
        events: list[EngineEvent] = [self._started(request, rendered, choice.prompt_token_ids),
                                     Chunk(tuple(deltas), ids, logprobs)]
        if choice.finish_reason is not None:  # without one the reply is not known to be whole
            events.append(Finished(_finish(choice.finish_reason, parser.calls), usage(body)))
        return events

    async def stream(self, request: ChatRequest, rollout: str | None = None
                     ) -> AsyncGenerator[EngineEvent, None]:
        rendered = await self.render(request, rollout)
        payload = self._body(request, rendered, stream=True)
        parser = self._parser(request, rendered)
        state = _StreamState()
        reads = self.http.events(f"{self.base_url}/v1/completions", payload)
        async with contextlib.aclosing(reads):
            async for read in reads:
                # Tokens that arrived in one read go on as one chunk (one write).
                events = [e for data in read for e in state.feed(data, parser)]
                for event in self._started_first(request, rendered, state, events):
                    yield event
        for event in self._started_first(request, rendered, state, [], last=True):
            yield event
        if state.finish is None:
            raise EngineError("the engine stream ended before a finish_reason")
        last = parser.finish()
        yield Chunk(tuple(last), (), ())
        self._remember(rollout, rendered, tuple(state.ids), state.finish,
                       [*state.deltas, *last])
        yield Finished(_finish(state.finish, parser.calls), state.usage)

    def _started_first(self, request: ChatRequest, rendered: Rendered, state: _StreamState,
                       events: list[EngineEvent], *, last: bool = False) -> list[EngineEvent]:
        """`Started` goes out before the first chunk, with the prompt ids vLLM reports in
        its first chunk."""
        events = merge_chunks(events)
        if not state.started and (events or last):
            state.started = True
            events.insert(0, self._started(request, rendered, state.prompt_ids))
        return events

    def _remember(self, key: str | None, rendered: Rendered,
                  ids: tuple[int, ...] | None, finish: str | None,
                  deltas: list[Delta]) -> None:
        if ids is not None and finish in ("stop", "length"):
            self.renderer.remember(key, rendered, ids, reply=reply_key(deltas))


def _tokens(choice: Choice) -> tuple[tuple[int, ...] | None, tuple[float, ...] | None]:
    values = choice.logprobs.token_logprobs if choice.logprobs is not None else None
    if values is None or any(v is None for v in values):
        return choice.token_ids, None  # a missing logprob is left missing, never invented
    return choice.token_ids, tuple(values)  # type: ignore[arg-type]


def _finish(reason: str | None, calls: int) -> FinishReason:
    if reason == "length":
        return "length"
    if reason == "abort":
        return "error"
    return "tool_calls" if calls else "stop"


class _StreamState:
    """vLLM completion chunks (already split from SSE) in, engine events out."""

    def __init__(self) -> None:
        self.prompt_ids: tuple[int, ...] | None = None
        self.started = False
        self.ids: list[int] = []
        self.finish: str | None = None
        self.usage: Usage | None = None
        self.deltas: list[Delta] = []  # all sent, to know the reply's echo next turn

    def feed(self, data: str, parser: ReplyParser) -> list[EngineEvent]:
        if data == "[DONE]":
            return []
        body = decode(data, "a chunk")
        self.usage = usage(body) or self.usage
        events: list[EngineEvent] = []
        for choice in body.choices:
            if choice.prompt_token_ids is not None and self.prompt_ids is None:
                self.prompt_ids = choice.prompt_token_ids
            ids, logprobs = _tokens(choice)
            self.ids.extend(ids or ())
            deltas = parser.feed(choice.text or "", ids or ())
            self.deltas.extend(deltas)
            if deltas or ids:
                events.append(Chunk(tuple(deltas), ids, logprobs))
            if choice.finish_reason is not None:
                self.finish = choice.finish_reason
        return events


def _stop_ids(tokenizer: Any, template: str) -> list[int]:
    """The template's end-of-turn token and EOS: where a reply ends."""
    vocab = tokenizer.get_vocab()
    found = [vocab[t] for t in _END_TOKENS if t in vocab and t in template]
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        found.insert(0, eos)
    return list(dict.fromkeys(found))
