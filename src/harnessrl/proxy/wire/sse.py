"""Server-sent events: an incremental decoder and an encoder. No I/O.

The decoder is a feed/finish state machine: bytes may arrive split anywhere (inside a
line, inside a UTF-8 sequence, between CR and LF) and the events come out the same.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: str
    event: str | None = None
    id: str | None = None


class SSEDecoder:
    """Decodes an SSE byte stream following the WHATWG event-stream rules."""

    def __init__(self) -> None:
        self._buffer = b""
        self._pending_cr = False
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if not chunk:
            return []
        buffer = self._buffer + chunk
        if self._pending_cr and buffer.startswith(b"\n"):
            buffer = buffer[1:]  # the LF of a CRLF split across two chunks
        self._pending_cr = False
        events: list[SSEEvent] = []
        start = 0
        size = len(buffer)
        while start < size:
            cut = _line_end(buffer, start)
            if cut is None:
                break
            end, after = cut
            self._line(buffer[start:end], events)
            start = after
            # A CR that ends the buffer may be the first half of a CRLF.
            self._pending_cr = start == size and buffer[end] == 0x0D
        self._buffer = buffer[start:]
        return events

    def feed_data(self, chunk: bytes) -> list[bytes | str]:
        """The data of the events `chunk` completes: what `feed` gives, data only.

        The common chunk (whole `data: ...` events, LF line ends, nothing buffered) is
        split without decoding it: the data stay bytes, which a JSON decoder reads as they
        are (`loose_text` is the fallback for bytes that are not UTF-8). Anything else goes
        through `feed`, so both paths give the same events."""
        if (self._buffer or self._pending_cr or self._data or self._event is not None
                or not chunk.endswith(b"\n\n") or b"\r" in chunk):
            return [event.data for event in self.feed(chunk)]
        if chunk.startswith(b"data: ") and chunk.find(b"\n", 6) == len(chunk) - 2:
            return [chunk[6:-2]]  # one `data:` event, the common read: no split
        out: list[bytes | str] = []
        for block in chunk[:-2].split(b"\n\n"):
            if block.startswith(b"data: ") and b"\n" not in block:
                out.append(block[6:])
            else:  # comments, other fields, multi-line data, extra blank lines
                events: list[SSEEvent] = []
                for line in block.split(b"\n"):
                    self._line(line, events)
                self._line(b"", events)
                out.extend(event.data for event in events)
        return out

    def finish(self) -> list[SSEEvent]:
        """Flush at end of stream. Unlike a browser, an event missing its closing blank
        line is still delivered: engines that end on `data: [DONE]` alone exist."""
        events: list[SSEEvent] = []
        if self._buffer:
            self._line(self._buffer, events)
            self._buffer = b""
        self._line(b"", events)
        return events

    def _line(self, raw: bytes, events: list[SSEEvent]) -> None:
        if not raw:
            if self._data or self._event is not None:
                events.append(SSEEvent("\n".join(self._data), self._event, self._id))
            self._data, self._event = [], None
            return
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            return
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id":
            self._id = value


def _line_end(buffer: bytes, start: int) -> tuple[int, int] | None:
    """(end of the line, start of the next one), or None if no whole line is buffered."""
    lf = buffer.find(b"\n", start)
    cr = buffer.find(b"\r", start, lf if lf >= 0 else len(buffer))
    if cr >= 0:
        return cr, cr + (2 if buffer[cr + 1 : cr + 2] == b"\n" else 1)
    if lf >= 0:
        return lf, lf + 1
    return None


def encode(data: bytes, event: str | None = None) -> bytes:
    """One SSE event; `data` must be single-line (compact JSON is)."""
    if event is None:
        return b"data: " + data + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"
