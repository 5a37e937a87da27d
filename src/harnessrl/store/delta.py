"""The trace store's delta codec: how a turn's raw bodies and canonical request are kept
as what is new against an earlier turn of the same rollout, byte for byte.

A stored blob is self-describing and sealed:

    form (1 byte) | packing (1 byte) | header varints | payload | crc32 (4 bytes, LE)

`form` is `W` (the value whole) or `D` (a delta against a base turn's value); `packing`
is `z` (payload zstd-compressed) or `r` (raw: not compressed, see `seal`). The
crc32 covers everything before it, so a blob damaged on disk fails its read with the
turn named (`CorruptTurn`) instead of rebuilding a silently different body.

A body delta (`D`) is `prefix, suffix` varints and the middle: the new body is the base's
first `prefix` bytes, the middle, then the base's last `suffix` bytes. A chat request
that appends messages shares everything up to the last old message and everything after
the messages (tools, sampling), so the middle is the new messages. Finding the shared
ends costs memcmp-speed compares (`bytes.startswith` over a memoryview), not a pass of
Python code over the body, and compression sees only the middle: the commit's work
follows what is new, not the context.
"""

from __future__ import annotations

import sqlite3
import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any

import zstandard

from harnessrl.errors import StoreCorrupt

# zstd contexts are not thread-safe: the writer thread, readers in worker threads and a
# Ray node's threads sharing one corrupted data (and crashed the process). One per thread.
_CONTEXTS = threading.local()


def _context(name: str, make: Callable[[], Any]) -> Any:
    context = getattr(_CONTEXTS, name, None)
    if context is None:
        context = make()
        setattr(_CONTEXTS, name, context)
    return context


def _compress(data: bytes) -> bytes:
    return _context("compressor", lambda: zstandard.ZstdCompressor(level=1)).compress(data)


def _decompress(data: bytes) -> bytes:
    return _context("decompressor", zstandard.ZstdDecompressor).decompress(data)


_CRC = struct.Struct("<I")
WHOLE, DELTA = ord("W"), ord("D")
_ZSTD, _RAW = ord("z"), ord("r")
# Below this a zstd frame (~10 bytes of overhead) is not worth trying.
_MIN_COMPRESS = 64
# A delta must reuse at least this many bytes of its base (and a quarter of the body).
_MIN_SHARED = 64


class CorruptTurn(StoreCorrupt, sqlite3.DatabaseError):
    """A stored turn cannot be rebuilt exactly (a damaged blob, a missing base turn): the
    read fails naming the turn; other turns and rollouts stay readable. The error tree's
    `StoreCorrupt`, and a `sqlite3.DatabaseError` as every other failed read of the store."""

    def __init__(self, rollout: str, index: int, why: str) -> None:
        super().__init__(f"rollout {rollout!r} turn {index}: {why}")
        self.rollout, self.index = rollout, index


# ------------------------------------------------------------------ sealing
def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def _read_varint(blob: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(blob):
            raise ValueError("truncated header")
        byte = blob[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7


def seal(form: int, header: tuple[int, ...], payload: bytes, *, compress: bool = False) -> bytes:
    """`compress`: try zstd (level 1) on the payload. Worth it for a whole body and for
    SSE bytes (5-10x); a delta's middle is new text, which zstd shrinks about 2x at
    ~40 µs per 4 kB on a slow core: more than the rest of the commit, so left raw."""
    packing = _RAW
    if compress and len(payload) >= _MIN_COMPRESS:
        packed = _compress(payload)
        if len(packed) < len(payload):
            packing, payload = _ZSTD, packed
    body = bytes((form, packing)) + b"".join(map(_varint, header)) + payload
    return body + _CRC.pack(zlib.crc32(body))


def unseal(blob: bytes, fields: int) -> tuple[int, tuple[int, ...], bytes]:
    """(form, header, payload) of a sealed blob whose header has `fields` varints; raises
    ValueError if it is damaged."""
    sealed = memoryview(blob)[:-4]
    if len(blob) < 6 or zlib.crc32(sealed) != _CRC.unpack_from(blob, len(blob) - 4)[0]:
        raise ValueError("checksum mismatch (damaged blob)")
    form, packing = blob[0], blob[1]
    at, header = 2, []
    for _ in range(fields if form == DELTA else 0):
        value, at = _read_varint(blob, at)
        header.append(value)
    payload = blob[at:-4]
    if packing == _ZSTD:
        payload = _decompress(payload)
    elif packing != _RAW:
        raise ValueError(f"unknown packing {packing!r}")
    if form not in (WHOLE, DELTA):
        raise ValueError(f"unknown form {form!r}")
    return form, tuple(header), payload


# ------------------------------------------------------------------ byte bodies
def shared_prefix(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of `a` and `b`, by halving: each probe is
    one memcmp over the part not yet known to match."""
    view, lo, hi = memoryview(b), 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.startswith(view[lo:mid], lo):
            lo = mid
        else:
            hi = mid - 1
    return lo


def shared_suffix(a: bytes, b: bytes, limit: int) -> int:
    """The length of the longest common suffix of `a` and `b`, at most `limit`."""
    view, lo, hi = memoryview(b), 0, min(limit, len(a), len(b))
    la, lb = len(a), len(b)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.startswith(view[lb - mid:lb - lo], la - mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def encode_body(body: bytes, base: bytes | None) -> tuple[bytes, bool]:
    """The sealed blob of `body`, and whether it is a delta against `base`."""
    if base:
        prefix = shared_prefix(body, base)
        suffix = shared_suffix(body, base, min(len(body), len(base)) - prefix)
        # A body that shares little with the base (a side call's) is kept whole and
        # compressed, and depends on no other turn.
        if prefix + suffix >= max(_MIN_SHARED, len(body) // 4):
            return seal(DELTA, (prefix, suffix), body[prefix:len(body) - suffix]), True
    return seal(WHOLE, (), body, compress=True), False


def decode_body(blob: bytes, base: Callable[[], bytes]) -> bytes:
    """The body a sealed blob holds; `base()` gives the base turn's body for a delta."""
    form, header, middle = unseal(blob, 2)
    if form == WHOLE:
        return middle
    prefix, suffix = header
    whole = base()
    if prefix + suffix > len(whole):
        raise ValueError(f"delta wants {prefix}+{suffix} bytes of a {len(whole)}-byte base")
    return whole[:prefix] + middle + whole[len(whole) - suffix:]
