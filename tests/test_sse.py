from hypothesis import given
from hypothesis import strategies as st

from harnessrl.proxy.sse import SSEDecoder, SSEEvent, encode

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
