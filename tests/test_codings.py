"""Request content codings (`proxy/wire/codings.py`): every coding and stack of codings round
trips, the decoded size is capped while decoding, damaged and cut-short bodies are
refused, and bodies written by other encoders (gzip and zstd's own tools) decode."""

from __future__ import annotations

import contextlib
import gzip
import subprocess
import sys
import zlib
from pathlib import Path

import brotli
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from harnessrl.errors import CorruptCoding as Corrupt
from harnessrl.errors import InvalidRequest, TooLarge, UnsupportedCoding
from harnessrl.proxy.wire import codings
from harnessrl.proxy.wire.codings import decode, parse


def _raw_deflate(data: bytes, level: int = 6) -> bytes:
    deflater = zlib.compressobj(level, wbits=-zlib.MAX_WBITS)
    return deflater.compress(data) + deflater.flush()


# How a client applies each coding (the test's encoders, each with a level drawn).
ENCODERS = {
    "gzip": lambda data, level: gzip.compress(data, compresslevel=level % 10, mtime=0),
    "deflate": lambda data, level: zlib.compress(data, level % 10),
    "deflate-raw": lambda data, level: _raw_deflate(data, level % 10),
    "br": lambda data, level: brotli.compress(data, quality=level % 12),
    "zstd": lambda data, level: zstandard.ZstdCompressor(level=level % 20 + 1).compress(data),
}
HEADER_NAME = {"deflate-raw": "deflate"}


def encode(data: bytes, stack: list[str], level: int = 6) -> tuple[bytes, tuple[str, ...]]:
    for name in stack:
        data = ENCODERS[name](data, level)
    return data, tuple(HEADER_NAME.get(n, n) for n in stack)


bodies = st.binary(max_size=4000) | st.text(max_size=3000).map(str.encode)
stacks = st.lists(st.sampled_from(sorted(ENCODERS)), min_size=1, max_size=3)


@given(bodies, stacks, st.integers(0, 30))
def test_every_coding_and_stack_round_trips(body: bytes, stack: list[str], level: int) -> None:
    coded, names = encode(body, stack, level)
    assert decode(coded, names, 1 << 20) == body


@given(bodies, st.sampled_from(sorted(ENCODERS)), st.data())
def test_a_cut_short_body_is_corrupt(body: bytes, name: str, data: st.DataObject) -> None:
    coded, names = encode(body, [name])
    cut = data.draw(st.integers(0, len(coded) - 1))
    with pytest.raises(Corrupt):
        decode(coded[:cut], names, 1 << 20)


@given(st.binary(min_size=1, max_size=3000), st.sampled_from(sorted(ENCODERS)), st.data())
def test_the_cap_is_the_decoded_size(body: bytes, name: str, data: st.DataObject) -> None:
    """Decoded under a limit below its size, a body is refused as too large; at its
    size, it decodes."""
    coded, names = encode(body, [name])
    limit = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(TooLarge):
        decode(coded, names, limit)
    assert decode(coded, names, len(body)) == body


@given(st.binary(min_size=1, max_size=200), st.sampled_from(sorted(ENCODERS)))
def test_data_after_the_end_is_corrupt_except_gzip_members(body: bytes, name: str) -> None:
    coded, names = encode(body, [name])
    if name == "gzip":  # gzip members may follow each other: they are one body
        assert decode(coded + coded, names, 1 << 20) == body + body
    elif name != "zstd":
        with pytest.raises(Corrupt):
            decode(coded + b"\x00junk", names, 1 << 20)
    else:  # so may zstd frames; anything else after a frame is corrupt
        assert decode(coded + coded, names, 1 << 20) == body + body
        with pytest.raises(Corrupt):
            decode(coded + b"junk", names, 1 << 20)


@pytest.mark.parametrize("where", [0.0, 0.5, 0.99])
@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_a_damaged_body_is_corrupt(name: str, where: float) -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"hello hello hello"}]}' * 20
    coded = bytearray(encode(body, [name])[0])
    coded[int(where * len(coded))] ^= 0xFF
    names = encode(body, [name])[1]
    if name == "gzip":  # its header, CRC and length cover every byte of these
        with pytest.raises(Corrupt):
            decode(bytes(coded), names, 1 << 20)
        return
    # Elsewhere a damaged byte fails the decode or, where no checksum covers it, changes it.
    with contextlib.suppress(Corrupt):
        assert decode(bytes(coded), names, 1 << 20) != body


# ------------------------------------------------------------------ golden cases
BODY = b'{"model":"m"}'
# Each as written by another encoder: GNU gzip -n -9, the zstd CLI (with and without its
# checksum), brotli's reference encoder, zlib, and raw deflate.
GOLDEN = [
    ("gzip", "1f8b0800000000000203ab56cacd4f49cd51b252ca55aa05009b6cbaaa0d000000"),
    ("zstd", "28b52ffd04586900007b226d6f64656c223a226d227d278b7c64"),
    ("zstd", "28b52ffd00586900007b226d6f64656c223a226d227d"),
    ("br", "0b06807b226d6f64656c223a226d227d03"),
    ("deflate", "789cab56cacd4f49cd51b252ca55aa05001f070439"),
    ("deflate", "ab56cacd4f49cd51b252ca55aa0500"),
    ("identity", "7b226d6f64656c223a226d227d"),
]


@pytest.mark.parametrize(("header", "coded"), GOLDEN)
def test_golden_bodies_decode(header: str, coded: str) -> None:
    assert codings.undo(bytes.fromhex(coded), header, 1 << 20) == BODY


def test_a_stack_is_undone_last_first() -> None:
    """`Content-Encoding: gzip, zstd`: gzip applied first, so zstd is undone first."""
    coded = zstandard.ZstdCompressor().compress(gzip.compress(BODY))
    assert codings.undo(coded, "gzip, zstd", 1 << 20) == BODY
    with pytest.raises(Corrupt):
        codings.undo(coded, "zstd, gzip", 1 << 20)


@pytest.mark.parametrize(("header", "parsed"), [
    (None, ()), ("", ()), ("identity", ()), ("GZIP", ("gzip",)), ("x-gzip", ("x-gzip",)),
    ("gzip, identity ,zstd", ("gzip", "zstd")), (" br ", ("br",)),
])
def test_parse(header: str | None, parsed: tuple[str, ...]) -> None:
    assert parse(header) == parsed


@pytest.mark.parametrize("header", ["compress", "zstd, lz4", "snappy", "gzip;q=1"])
def test_an_unknown_coding_is_415(header: str) -> None:
    with pytest.raises(UnsupportedCoding) as err:
        parse(header)
    assert err.value.status == 415 and isinstance(err.value, InvalidRequest)


def test_an_empty_coded_body_is_corrupt() -> None:
    for name in ("gzip", "deflate", "br", "zstd"):
        with pytest.raises(Corrupt):
            decode(b"", (name,), 100)


def test_a_zstd_frame_over_the_window_cap_is_too_large() -> None:
    params = zstandard.ZstdCompressionParameters(window_log=28, enable_ldm=True)
    frame = zstandard.ZstdCompressor(compression_params=params).compress(b"x" * 100)
    # A frame's window is its content size when that is known: declare none.
    streamed = zstandard.ZstdCompressor(compression_params=params)
    out = streamed.compressobj()
    frame = out.compress(b"x" * 100) + out.flush()
    with pytest.raises(TooLarge, match="window"):
        decode(frame, ("zstd",), 1 << 20)


BOMB = Path(__file__).parents[1] / "bench" / "proxy" / "zstd_bomb.py"


def test_a_zstd_bomb_is_refused_without_decoding_it_whole() -> None:
    """A ~32 KB zstd frame of 1 GiB of zeros, under a 32 MiB limit: refused, and the
    process's peak memory grows by about the limit, not by the gigabyte."""
    done = subprocess.run([sys.executable, str(BOMB)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    size, _, before, after = done.stdout.split()
    assert int(size) < 40_000
    assert (int(after) - int(before)) * 1024 < 100 << 20, (before, after)
