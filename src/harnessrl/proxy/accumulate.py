"""Fold a stream of engine events into one `Completion`. Pure; no I/O.

Used for every call, streamed or not, so a streamed turn is stored exactly like a
non-streamed one. It also checks the capture: one logprob per sampled id, ids on every
chunk or on none.
"""

from __future__ import annotations

from harnessrl.types import (
    Chunk,
    Completion,
    EngineEvent,
    Finished,
    FinishReason,
    Part,
    Reasoning,
    ReasoningDelta,
    Started,
    Text,
    TextDelta,
    Tokens,
    ToolCall,
    ToolCallDelta,
    Usage,
)


class Accumulator:
    def __init__(self) -> None:
        self.model: str | None = None
        self.prompt_ids: tuple[int, ...] | None = None
        self._parts: list[Part] = []
        self._calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
        self._ids: list[int] = []
        self._logprobs: list[float] = []
        self._chunks_with_ids = 0
        self._chunks_with_logprobs = 0
        self._chunks = 0
        self.finish_reason: FinishReason | None = None
        self.usage: Usage | None = None
        self._engine_flags: tuple[str, ...] = ()

    def feed(self, event: EngineEvent) -> None:
        if isinstance(event, Chunk):
            self._chunk(event)
        elif isinstance(event, Started):
            self.model, self.prompt_ids = event.model, event.prompt_ids
            self._engine_flags = event.flags
        elif isinstance(event, Finished):
            self.finish_reason, self.usage = event.finish_reason, event.usage

    def _chunk(self, chunk: Chunk) -> None:
        self._chunks += 1
        if chunk.token_ids is not None:
            self._chunks_with_ids += 1
            self._ids.extend(chunk.token_ids)
        if chunk.logprobs is not None:
            self._chunks_with_logprobs += 1
            self._logprobs.extend(chunk.logprobs)
        for delta in chunk.deltas:
            if isinstance(delta, TextDelta):
                self._append(Text, delta.text)
            elif isinstance(delta, ReasoningDelta):
                self._append(Reasoning, delta.text)
            elif isinstance(delta, ToolCallDelta):
                call = self._calls.setdefault(delta.index, ["", "", ""])
                call[0] = delta.id or call[0]
                call[1] = delta.name or call[1]
                call[2] += delta.arguments

    def _append(self, kind: type[Text] | type[Reasoning], text: str) -> None:
        # Consecutive pieces of the same kind merge into one part, keeping the order
        # of reasoning and text as the model produced them.
        if self._parts and type(self._parts[-1]) is kind:
            self._parts[-1] = kind(self._parts[-1].text + text)  # type: ignore[union-attr]
        else:
            self._parts.append(kind(text))

    @property
    def token_count(self) -> int:
        return len(self._ids)

    def flags(self) -> list[str]:
        """Names of capture problems; an empty list means the tokens can be trusted."""
        flags = list(self._engine_flags)
        if self.prompt_ids is None:
            flags.append("prompt_ids_missing")
        if self._chunks_with_ids not in (0, self._chunks) or not self._chunks_with_ids:
            flags.append("completion_ids_missing")
        if self._chunks_with_logprobs != self._chunks or len(self._logprobs) != len(self._ids):
            flags.append("logprob_count_mismatch")
        if self.usage is not None and self._ids and self.usage.completion_tokens != len(self._ids):
            flags.append("usage_count_mismatch")
        return flags

    def completion(self) -> Completion:
        calls = tuple(ToolCall(*self._calls[i]) for i in sorted(self._calls))
        return Completion(
            model=self.model or "",
            parts=(*self._parts, *calls),
            finish_reason=self.finish_reason or "error",
            usage=self.usage,
            tokens=Tokens(
                prompt_ids=self.prompt_ids,
                completion_ids=tuple(self._ids) if self._chunks_with_ids else None,
                logprobs=tuple(self._logprobs) if self._chunks_with_logprobs else None,
            ),
        )


def accumulate(events: list[EngineEvent]) -> Accumulator:
    acc = Accumulator()
    for event in events:
        acc.feed(event)
    return acc
