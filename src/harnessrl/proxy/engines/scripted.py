"""A scripted engine for deterministic tests: it replays chosen text as real token ids.

The text is in the model's own output format (for example Hermes `<tool_call>` JSON), it
is tokenized with a real tokenizer, the prompt is rendered with that tokenizer's chat
template, and the text is parsed back into deltas by the same parser token mode uses, so
the proxy's real paths run. Logprobs are the ones the script states (or, if it states
none, `default_logprob(position)`: a fixed, documented rule, not a measurement).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harnessrl.proxy.engines import openai_wire
from harnessrl.proxy.engines.base import Stateless
from harnessrl.proxy.engines.token.parsers import HermesParser
from harnessrl.types import (
    ChatRequest,
    Chunk,
    EngineEvent,
    Finished,
    FinishReason,
    Started,
    Usage,
)


@dataclass(frozen=True)
class Reply:
    text: str
    logprobs: Sequence[float] | None = None
    eos: bool = True  # append the tokenizer's EOS id, as a model that stops does


Policy = Callable[[ChatRequest], Reply]


def default_logprob(position: int) -> float:
    return -0.05 * (1 + position % 7)


def replay(replies: Sequence[Reply | str]) -> Policy:
    """A policy that answers with the given replies in turn, then starts over."""
    cycle = itertools.cycle([r if isinstance(r, Reply) else Reply(r) for r in replies])
    return lambda _request: next(cycle)


class ScriptedEngine(Stateless):
    name = "scripted"
    weight_version: str | None = "scripted"

    def __init__(self, tokenizer: Any, policy: Policy, *, model: str = "scripted",
                 token_delay: float = 0.0) -> None:
        self.tokenizer = tokenizer
        self.policy = policy
        self.model = model
        self.token_delay = token_delay
        self.calls = 0

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def models(self) -> list[str]:
        return [self.model]

    def render_prompt(self, request: ChatRequest) -> list[int]:
        kwargs: dict[str, Any] = {}
        if request.tools:
            kwargs["tools"] = openai_wire.tools(request.tools)
        text = self.tokenizer.apply_chat_template(
            openai_wire.messages(request), tokenize=False, add_generation_prompt=True, **kwargs)
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def count_tokens(self, request: ChatRequest) -> int:
        return len(self.render_prompt(request))

    def _sample(self, request: ChatRequest) -> tuple[list[int], list[int], list[float], Reply]:
        self.calls += 1
        reply = self.policy(request)
        prompt = self.render_prompt(request)
        ids, logprobs = sampled(self.tokenizer, reply, request.sampling.max_tokens)
        return prompt, ids, logprobs, reply

    async def complete(self, request: ChatRequest, rollout: str | None = None
                       ) -> list[EngineEvent]:
        return [event async for event in self._events(request, one_chunk=True)]

    def stream(self, request: ChatRequest, rollout: str | None = None
               ) -> AsyncGenerator[EngineEvent, None]:
        return self._events(request, one_chunk=False)

    async def _events(self, request: ChatRequest, *, one_chunk: bool
                      ) -> AsyncGenerator[EngineEvent, None]:
        prompt, ids, logprobs, _ = self._sample(request)
        yield Started(self.model, tuple(prompt))
        parser = HermesParser()
        pieces = detokenize(self.tokenizer, ids)
        if one_chunk:
            if self.token_delay:  # sampling takes as long when the client does not stream
                await asyncio.sleep(self.token_delay * len(ids))
            deltas = [d for piece in pieces for d in parser.feed(piece)] + parser.finish()
            yield Chunk(tuple(deltas), tuple(ids), tuple(logprobs))
        else:
            for position, piece in enumerate(pieces):
                if self.token_delay:
                    await asyncio.sleep(self.token_delay)
                deltas = parser.feed(piece)
                if position == len(pieces) - 1:
                    deltas += parser.finish()
                yield Chunk(tuple(deltas), (ids[position],), (logprobs[position],))
        finish = _finish_reason(ids, request, self.tokenizer.eos_token_id, parser)
        yield Finished(finish, Usage(len(prompt), len(ids)))


def sampled(tokenizer: Any, reply: Reply, max_tokens: int | None = None
            ) -> tuple[list[int], list[float]]:
    """The ids a model that wrote `reply` sampled (its text tokenized, then EOS if it
    stops), cut at `max_tokens`, and their logprobs."""
    ids = tokenizer.encode(reply.text, add_special_tokens=False)
    if reply.eos:
        ids.append(tokenizer.eos_token_id)
    if max_tokens is not None:
        ids = ids[:max_tokens]
    logprobs = list(reply.logprobs) if reply.logprobs is not None else [
        default_logprob(i) for i in range(len(ids))]
    if len(logprobs) != len(ids):
        raise ValueError(f"the script states {len(logprobs)} logprobs for {len(ids)} tokens")
    return ids, logprobs


def _finish_reason(ids: list[int], request: ChatRequest, eos: int, parser: HermesParser
                   ) -> FinishReason:
    if ids and ids[-1] == eos:
        return "tool_calls" if parser.calls else "stop"
    limit = request.sampling.max_tokens
    return "length" if limit is not None and len(ids) >= limit else "stop"


def detokenize(tokenizer: Any, ids: list[int]) -> list[str]:
    """The text each id adds; a byte split inside a character waits for its next id."""
    pieces: list[str] = []
    done = ""
    for end in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:end], skip_special_tokens=True)
        if text.endswith("\ufffd"):
            pieces.append("")
            continue
        pieces.append(text[len(done):])
        done = text
    return pieces

