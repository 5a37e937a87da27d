import json

from hypothesis import given
from hypothesis import strategies as st

from harnessrl.proxy.engines.token.parsers import HermesParser
from harnessrl.types import ReasoningDelta, TextDelta, ToolCallDelta

TEXT = (
    "<think>\nI should list files.\n</think>\n\nLet me look.\n"
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "write", "arguments": {"path": "a.txt", "text": "<b>"}}\n</tool_call>'
)


def parse(text: str, cuts: list[int]) -> tuple[str, str, list[tuple[str, str]]]:
    ids = iter(range(100))
    parser = HermesParser(new_id=lambda: f"call_{next(ids)}")
    deltas = []
    start = 0
    for cut in sorted(cuts):
        deltas += parser.feed(text[start:cut])
        start = cut
    deltas += parser.feed(text[start:]) + parser.finish()
    text_out = "".join(d.text for d in deltas if isinstance(d, TextDelta))
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    calls = [(d.name, d.arguments) for d in deltas if isinstance(d, ToolCallDelta)]
    assert [d.index for d in deltas if isinstance(d, ToolCallDelta)] == list(range(len(calls)))
    return text_out, reasoning, calls


def test_reasoning_text_and_two_calls() -> None:
    text, reasoning, calls = parse(TEXT, [])
    assert reasoning == "I should list files."
    assert text == "Let me look."
    assert [name for name, _ in calls] == ["bash", "write"]
    assert json.loads(calls[0][1]) == {"command": "ls -la"}
    assert json.loads(calls[1][1]) == {"path": "a.txt", "text": "<b>"}


@given(st.lists(st.integers(min_value=0, max_value=len(TEXT)), max_size=15))
def test_any_split_parses_the_same(cuts: list[int]) -> None:
    assert parse(TEXT, cuts) == parse(TEXT, [])


def test_malformed_call_stays_text() -> None:
    text, _, calls = parse("a <tool_call>{not json}</tool_call> b", [])
    assert calls == []
    assert text == "a <tool_call>{not json}</tool_call> b"


def test_call_cut_off_by_length_stays_text() -> None:
    text, _, calls = parse('x<tool_call>{"name": "ba', [3, 9])
    assert calls == [] and text == 'x<tool_call>{"name": "ba'


def test_partial_marker_at_end_is_text() -> None:
    assert parse("hello <tool_", [7])[0] == "hello <tool_"


def test_template_layout_is_dropped_but_other_newlines_kept() -> None:
    text, reasoning, _ = parse("<think>\n\ntwo lines\n\n</think>\n\nA\n\nB\n", [])
    assert reasoning == "\ntwo lines\n"
    assert text == "A\n\nB\n"
    assert parse("<think>x</think>y", [])[:2] == ("y", "x")


def test_parsed_message_renders_back_to_the_sampled_text(tokenizer) -> None:
    """Through the Hermes template, parse then render is the identity on the reply."""
    ids = iter(range(100))
    parser = HermesParser(new_id=lambda: f"call_{next(ids)}")
    deltas = parser.feed(TEXT) + parser.finish()
    calls = [{"id": d.id, "type": "function", "function": {"name": d.name,
                                                           "arguments": d.arguments}}
             for d in deltas if isinstance(d, ToolCallDelta)]
    message = {"role": "assistant",
               "content": "".join(d.text for d in deltas if isinstance(d, TextDelta)),
               "reasoning_content": "".join(d.text for d in deltas
                                            if isinstance(d, ReasoningDelta)),
               "tool_calls": calls}
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "u"}, message],
                                             tokenize=False)
    assert f"<|im_start|>assistant\n{TEXT}<|im_end|>" in rendered
