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
        self._parts: list[Part] = []  # closed runs of text or reasoning
        # The open run: its kind and its pieces, joined once when the run closes (appending
        # to one string per token would copy the reply so far on every token).
        self._run_kind: type[Text] | type[Reasoning] | None = None
        self._run: list[str] = []
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
        if type(event) is Chunk:  # by far the most common event: tested first
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
        deltas = chunk.deltas
        if len(deltas) == 1 and self._run_kind is Text and type(deltas[0]) is TextDelta:
            self._run.append(deltas[0].text)  # a token of the open text run
            return
        for delta in deltas:
            kind = _RUN_KIND.get(type(delta))
            if kind is not None:
                self._append(kind, delta.text)  # type: ignore[union-attr]
            elif isinstance(delta, ToolCallDelta):
                call = self._calls.setdefault(delta.index, ["", "", ""])
                call[0] = delta.id or call[0]
                call[1] = delta.name or call[1]
                call[2] += delta.arguments

    def _append(self, kind: type[Text] | type[Reasoning], text: str) -> None:
        # Consecutive pieces of the same kind merge into one part, keeping the order
        # of reasoning and text as the model produced them.
        if kind is not self._run_kind:
            self._close_run()
            self._run_kind = kind
        self._run.append(text)

    def _close_run(self) -> None:
        if self._run_kind is not None:
            self._parts.append(self._run_kind("".join(self._run)))
            self._run_kind, self._run = None, []

    def _text_parts(self) -> list[Part]:
        """The runs so far, the open one included (it stays open)."""
        if self._run_kind is None:
            return self._parts
        return [*self._parts, self._run_kind("".join(self._run))]

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
            parts=(*self._text_parts(), *calls),
            finish_reason=self.finish_reason or "error",
            usage=self.usage,
            tokens=Tokens(
                prompt_ids=self.prompt_ids,
                completion_ids=tuple(self._ids) if self._chunks_with_ids else None,
                logprobs=tuple(self._logprobs) if self._chunks_with_logprobs else None,
            ),
        )


_RUN_KIND: dict[type, type[Text] | type[Reasoning]] = {TextDelta: Text, ReasoningDelta: Reasoning}


def accumulate(events: list[EngineEvent]) -> Accumulator:
    acc = Accumulator()
    for event in events:
        acc.feed(event)
    return acc
