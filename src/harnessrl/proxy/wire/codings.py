"""Content codings of a request body (`Content-Encoding`, RFC 9110 §8.4), undone with the
decoded size capped as it is decoded. No I/O: bytes in, bytes out.

Codex CLI and pi's `openai-codex-responses` provider send `zstd` bodies, other clients
`gzip`; `deflate` comes zlib-wrapped (as the RFC says) or raw (as some clients send it,
told apart by the zlib header), `br` is brotli. Codings are listed in the order they
were applied, so they are undone last first; `identity` is no coding.

A decompressor asked for all of its output at once could write gigabytes for a small
input (1 GB of zeros is a 32 KB zstd frame), so every stage hands on at most `CHUNK`
bytes at a time and the whole is refused once past `limit`: the memory a body costs is
its limit plus a few chunks, whatever it claims to hold. A stage's own output counts
against the limit too, since a stacked coding's inner stage is as much a body as the
outer one. zstd's decompression object has no output bound, so it is fed `_ZSTD_FEED`
bytes at a time: a zstd block holds at most 128 KiB and takes at least 4 bytes, so one
feed writes at most some 8 MiB.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator

import brotli
import zstandard

from harnessrl.errors import CorruptCoding as Corrupt
from harnessrl.errors import TooLarge, UnsupportedCoding

CHUNK = 256 * 1024
_ZSTD_FEED = 256
# The largest zstd window a frame may ask for: libzstd's own default limit (2^27); a
# frame that needs more is refused as too large before its window is allocated.
ZSTD_WINDOW = 1 << 27

Stage = Callable[[Iterable[bytes]], Iterator[bytes]]

def parse(header: str | None) -> tuple[str, ...]:
    """The codings a `Content-Encoding` value names, in the order applied, lowercased,
    `identity` left out; UnsupportedCoding (415) for one this proxy cannot undo."""
    if header is None:
        return ()
    names = tuple(n.strip().lower() for n in header.split(","))
    codings = tuple(n for n in names if n and n != "identity")
    if unknown := [n for n in codings if n not in STAGES]:
        raise UnsupportedCoding(
            f"the body's content coding {unknown[0]!r} is not supported; send it uncompressed "
            f"or coded with one of {', '.join(sorted(STAGES))}", param="content-encoding")
    return codings


def decode(body: bytes, codings: tuple[str, ...], limit: int) -> bytes:
    """`body` with `codings` undone (the last applied first). TooLarge once any stage's
    output passes `limit` bytes (nothing more is decoded); Corrupt for a body that is
    damaged or cut short."""
    if not codings:
        return body
    pieces: Iterable[bytes] = (body,)
    for name in reversed(codings):
        pieces = _capped(STAGES[name](pieces), name, limit)
    return b"".join(pieces)


def undo(body: bytes, header: str | None, limit: int) -> bytes:
    """`decode` with the codings read off a `Content-Encoding` value."""
    return decode(body, parse(header), limit)


def _capped(pieces: Iterator[bytes], name: str, limit: int) -> Iterator[bytes]:
    size = 0
    for piece in pieces:
        size += len(piece)
        if size > limit:
            raise TooLarge(f"the body decodes ({name}) to more than this proxy's limit of "
                           f"{limit} bytes")
        yield piece


# ------------------------------------------------------------------ zlib: gzip, deflate
def _zlib_stage(name: str, wbits: Callable[[bytes], int], *, members: bool) -> Stage:
    """A stage over zlib's decompressor; `members`: several streams may follow each other
    (gzip's members), else data after the end is corrupt."""
    def stage(pieces: Iterable[bytes]) -> Iterator[bytes]:
        inflater = None
        try:
            for data in _first_two(pieces):
                while data:
                    if inflater is not None and inflater.eof and not members:
                        raise Corrupt(f"the body has data after the end of its {name} stream")
                    if inflater is None or inflater.eof:
                        inflater = zlib.decompressobj(wbits(data))
                    yield from _inflate(inflater, data)
                    data = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
        except zlib.error as exc:
            raise Corrupt(f"the body's {name} coding is corrupt ({exc})") from None
        if inflater is None or not inflater.eof:
            raise Corrupt(f"the body's {name} coding is cut short: its stream does not end")
    return stage


def _inflate(inflater: zlib._Decompress, data: bytes) -> Iterator[bytes]:
    """What `data` decodes to, at most CHUNK at a time; what is left of `data` stays in
    the inflater (`unconsumed_tail`, or `unused_data` past the stream's end)."""
    out = inflater.decompress(data, CHUNK)
    if out:
        yield out
    # A full chunk may leave output pending inside zlib with no input left: drain it.
    while len(out) == CHUNK and not inflater.eof and not inflater.unconsumed_tail:
        out = inflater.decompress(b"", CHUNK)
        if out:
            yield out


def _first_two(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """`pieces` with the first holding at least two bytes (when there are two), so the
    zlib header can be looked at."""
    head = b""
    it = iter(pieces)
    for piece in it:
        head += piece
        if len(head) >= 2:
            break
    if head:
        yield head
    yield from it


def _deflate_wbits(data: bytes) -> int:
    """zlib-wrapped when it starts with a zlib header (method 8, window at most 32K,
    check bits), raw otherwise. A raw stream cannot start so: its low nibble 8 would be a
    stored block whose padding bit is set, which no encoder writes."""
    cmf, flg = data[0], data[1] if len(data) > 1 else 0
    wrapped = cmf & 0x0F == 8 and cmf >> 4 <= 7 and (cmf << 8 | flg) % 31 == 0
    return zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS


# ------------------------------------------------------------------ brotli
def _brotli(pieces: Iterable[bytes]) -> Iterator[bytes]:
    inflater = brotli.Decompressor()
    try:
        for data in pieces:
            if not data:
                continue
            if inflater.is_finished():
                raise Corrupt("the body has data after the end of its br stream")
            yield inflater.process(data, output_buffer_limit=CHUNK)
            while not inflater.can_accept_more_data():  # output pending: drain it
                yield inflater.process(b"", output_buffer_limit=CHUNK)
    except brotli.error as exc:
        raise Corrupt(f"the body's br coding is corrupt ({exc})") from None
    if not inflater.is_finished():
        raise Corrupt("the body's br coding is cut short: its stream does not end")


# ------------------------------------------------------------------ zstd
def _zstd(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """Frames one after another (as the format allows), each fed in small bites."""
    decompressor = zstandard.ZstdDecompressor(max_window_size=ZSTD_WINDOW)
    frame = None
    try:
        for data in pieces:
            for at in range(0, len(data), _ZSTD_FEED):
                bite = data[at:at + _ZSTD_FEED]
                while bite:
                    if frame is None or frame.eof:
                        frame = decompressor.decompressobj(write_size=CHUNK)
                    if out := frame.decompress(bite):
                        yield out
                    bite = frame.unused_data if frame.eof else b""
    except zstandard.ZstdError as exc:
        if "too much memory" in str(exc):
            raise TooLarge(f"the body's zstd frame needs a window over {ZSTD_WINDOW} bytes "
                           "to decode") from None
        raise Corrupt(f"the body's zstd coding is corrupt ({exc})") from None
    if frame is None or not frame.eof:
        raise Corrupt("the body's zstd coding is cut short: its frame does not end")


STAGES: dict[str, Stage] = {
    "zstd": _zstd,
    "gzip": _zlib_stage("gzip", lambda _: zlib.MAX_WBITS | 16, members=True),
    "x-gzip": _zlib_stage("gzip", lambda _: zlib.MAX_WBITS | 16, members=True),
    "deflate": _zlib_stage("deflate", _deflate_wbits, members=False),
    "br": _brotli,
}
