"""Parse sampled text into deltas: `<think>` reasoning and Hermes/Qwen `<tool_call>` JSON.

A feed/finish state machine over text pieces: tags may be split across pieces, and the
deltas that come out are the same however the text was cut. Used by engines that sample
raw text (the scripted engine; token mode).

The newlines a Hermes/Qwen chat template puts around blocks (`<think>\n…\n</think>\n\n`,
a newline before each `<tool_call>`) are layout, not content: they are dropped here, so
that rendering the parsed message with the template gives back the sampled text and the
next turn's prompt extends this turn's tokens.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

from harnessrl.types import Delta, ReasoningDelta, TextDelta, ToolCallDelta

_THINK = ("<think>", "</think>")
_CALL = ("<tool_call>", "</tool_call>")
# Layout the template writes right after a marker, and markers whose preceding newline
# the template writes itself.
_AFTER = {_THINK[0]: "\n", _THINK[1]: "\n\n"}
_NEWLINE_BEFORE = frozenset({_THINK[1], _CALL[0]})


class HermesParser:
    """`in_reasoning`: the prompt already opened `<think>` (templates that start the reply
    in reasoning), so the text starts as reasoning."""

    def __init__(self, new_id: Callable[[], str] | None = None, *,
                 in_reasoning: bool = False) -> None:
        self._pending = ""
        self._mode = "think" if in_reasoning else "text"  # text | think | call
        self._call = ""
        self._calls = 0
        self._skip = ""  # layout still to drop from the text that follows
        self._held = ""  # a trailing newline that may turn out to be layout
        self._new_id = new_id or (lambda: f"call_{uuid.uuid4().hex[:24]}")

    @property
    def calls(self) -> int:
        """How many tool calls were parsed so far."""
        return self._calls

    def feed(self, piece: str) -> list[Delta]:
        out: list[Delta] = []
        if not self._pending and "<" not in piece:
            # The common token: every marker starts with "<", so none begins in it and
            # `_step` would emit it whole; skip the marker search (once per token).
            self._emit(piece, out)
            return out
        self._pending += piece
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
        if marker in _NEWLINE_BEFORE:
            self._held = ""
        self._flush(out)
        if marker == _CALL[1]:
            out.append(self._finish_call())
        self._mode = {_THINK[0]: "think", _CALL[0]: "call"}.get(marker, "text")
        self._skip = _AFTER.get(marker, "")
        return True

    def _emit(self, text: str, out: list[Delta]) -> None:
        if self._mode == "call":
            self._call += text
            return
        while self._skip and text:
            if text[0] != self._skip[0]:
                self._skip = ""  # not the template's layout: keep the text as it is
                break
            text, self._skip = text[1:], self._skip[1:]
        if not text:
            return
        text, self._held = self._held + text, ""
        if text.endswith("\n"):
            text, self._held = text[:-1], "\n"
        self._out(text, out)

    def _out(self, text: str, out: list[Delta]) -> None:
        if text:
            out.append(ReasoningDelta(text) if self._mode == "think" else TextDelta(text))

    def _flush(self, out: list[Delta]) -> None:
        held, self._held = self._held, ""
        self._out(held, out)

    def _finish_call(self) -> Delta:
        raw, self._call = self._call.strip(), ""
        parsed = self.parse_call(raw)
        if parsed is None:
            # Not a well-formed call: the model's text is kept as text, not dropped.
            return TextDelta(f"{_CALL[0]}{raw}{_CALL[1]}")
        name, arguments = parsed
        index, self._calls = self._calls, self._calls + 1
        return ToolCallDelta(index=index, id=self._new_id(), name=name, arguments=arguments)

    def parse_call(self, raw: str) -> tuple[str, str] | None:
        """(name, arguments JSON) from the text between the call tags, or None when it is
        not a call. Subclasses parse other call formats inside the same tags."""
        try:
            call = json.loads(raw)
            name, arguments = call["name"], call.get("arguments", {})
        except (ValueError, KeyError, TypeError, RecursionError):
            return None
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        return str(name), arguments

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self._mode == "call":  # cut off inside a call (length limit): keep it as text
            out.append(TextDelta(f"{_CALL[0]}{self._call}{self._pending}"))
        else:
            self._emit(self._pending, out)
            self._flush(out)
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
