from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.proxy.wire.sse import SSEDecoder, SSEEvent, encode

STREAM = (
    b": comment\r\n"
    b"event: message_start\r\ndata: {\"a\": 1}\r\n\r\n"
    b"data: line one\ndata: line two\n\n"
    b"id: 7\rdata: caf\xc3\xa9 \xe2\x9c\x93\r\r"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    SSEEvent('{"a": 1}', "message_start"),
    SSEEvent("line one\nline two"),
    SSEEvent("café ✓", None, "7"),
    SSEEvent("[DONE]", None, "7"),
]


def decode_in_pieces(data: bytes, cuts: list[int]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    start = 0
    for cut in sorted(cuts):
        events += decoder.feed(data[start:cut])
        start = cut
    return events + decoder.feed(data[start:]) + decoder.finish()


def test_whole_stream_decodes_to_the_events() -> None:
    assert decode_in_pieces(STREAM, []) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_byte_split_decodes_the_same(cuts: list[int]) -> None:
    assert decode_in_pieces(STREAM, cuts) == EXPECTED


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                               blacklist_characters="\r\n"), max_size=30),
                max_size=8), st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_encoded_events_round_trip(datas: list[str], cuts: list[int]) -> None:
    wire = b"".join(encode(d.encode(), "e") for d in datas)
    events = decode_in_pieces(wire, [c for c in cuts if c <= len(wire)])
    assert [e.data for e in events] == datas
    assert all(e.event == "e" for e in events)


def test_empty_feed_between_cr_and_lf_keeps_the_crlf_whole() -> None:
    assert decode_in_pieces(b"data: a\r\n\r\n", [7, 7]) == [SSEEvent("a")]


def test_last_event_without_blank_line_is_delivered() -> None:
    assert decode_in_pieces(b"data: x\n\ndata: [DONE]", []) == [SSEEvent("x"), SSEEvent("[DONE]")]


def data_in_pieces(data: bytes, cuts: list[int]) -> list[str]:
    """What `feed_data` gives for the pieces, as text (its common events stay bytes)."""
    decoder = SSEDecoder()
    out: list[bytes | str] = []
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        out += decoder.feed_data(data[start:cut])
        start = cut
    out += [e.data for e in decoder.finish()]
    return [d.decode("utf-8", "replace") if isinstance(d, bytes) else d for d in out]


PIECES = [b"data: {\"a\": 1}\n\n", b": ping\n\n", b"data: x\ndata: y\n\n", b"event: e\ndata: z\n\n",
          b"\n", b"data: caf\xc3\xa9\n\n", b"data:nospace\n\n", b"data: r\r\n\r\n", b"id: 3\n\n",
          b"data: [DONE]\n\n"]


@settings(max_examples=40)  # the fast path is a few branches; 40 mixes reach each
@given(st.lists(st.sampled_from(PIECES), max_size=12),
       st.lists(st.integers(min_value=0, max_value=200), max_size=6))
def test_feed_data_gives_the_data_feed_gives(pieces: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(pieces)
    cuts = [c for c in cuts if c <= len(stream)]
    assert data_in_pieces(stream, cuts) == [e.data for e in decode_in_pieces(stream, cuts)]
