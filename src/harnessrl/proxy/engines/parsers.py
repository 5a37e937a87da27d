"""Parse sampled text into deltas: `<think>` reasoning and Hermes/Qwen `<tool_call>` JSON.

A feed/finish state machine over text pieces: tags may be split across pieces, and the
deltas that come out are the same however the text was cut. Used by engines that sample
raw text (the scripted engine; token mode).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

from harnessrl.types import Delta, ReasoningDelta, TextDelta, ToolCallDelta

_THINK = ("<think>", "</think>")
_CALL = ("<tool_call>", "</tool_call>")


class HermesParser:
    def __init__(self, new_id: Callable[[], str] | None = None) -> None:
        self._pending = ""
        self._mode = "text"  # text | think | call
        self._call = ""
        self._calls = 0
        self._new_id = new_id or (lambda: f"call_{uuid.uuid4().hex[:24]}")

    @property
    def calls(self) -> int:
        """How many tool calls were parsed so far."""
        return self._calls

    def feed(self, piece: str) -> list[Delta]:
        self._pending += piece
        out: list[Delta] = []
        while self._pending:
            if not self._step(out):
                break
        return out

    def _step(self, out: list[Delta]) -> bool:
        """Consume what can be decided now; False when more text is needed."""
        close = {"think": _THINK[1], "call": _CALL[1]}.get(self._mode)
        markers = [close] if close else [_THINK[0], _CALL[0]]
        at, marker = _first(self._pending, markers)
        if marker is None:
            keep = _partial_suffix(self._pending, markers)
            self._emit(self._pending[: len(self._pending) - keep], out)
            self._pending = self._pending[len(self._pending) - keep :]
            return False
        self._emit(self._pending[:at], out)
        self._pending = self._pending[at + len(marker) :]
        if marker == _CALL[1]:
            out.append(self._finish_call())
        self._mode = {_THINK[0]: "think", _CALL[0]: "call"}.get(marker, "text")
        return True

    def _emit(self, text: str, out: list[Delta]) -> None:
        if not text:
            return
        if self._mode == "call":
            self._call += text
        elif self._mode == "think":
            out.append(ReasoningDelta(text))
        else:
            out.append(TextDelta(text))

    def _finish_call(self) -> Delta:
        raw, self._call = self._call.strip(), ""
        try:
            call = json.loads(raw)
            name, arguments = call["name"], call.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            # Not a well-formed call: the model's text is kept as text, not dropped.
            return TextDelta(f"{_CALL[0]}{raw}{_CALL[1]}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        index, self._calls = self._calls, self._calls + 1
        return ToolCallDelta(index=index, id=self._new_id(), name=str(name), arguments=arguments)

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self._mode == "call":  # cut off inside a call (length limit): keep it as text
            out.append(TextDelta(f"{_CALL[0]}{self._call}{self._pending}"))
        else:
            self._emit(self._pending, out)
        self._pending, self._call = "", ""
        return out


def _first(text: str, markers: list[str]) -> tuple[int, str | None]:
    best, found = len(text), None
    for marker in markers:
        at = text.find(marker)
        if 0 <= at < best:
            best, found = at, marker
    return best, found


def _partial_suffix(text: str, markers: list[str]) -> int:
    """Length of the longest tail of `text` that could be the start of a marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest
