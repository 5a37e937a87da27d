#!/usr/bin/env python3
"""Token mode's per-turn render cost as a conversation grows, against a full re-render.

A harness-shaped conversation (a system prompt with tools, then per turn an assistant
reply with a tool call and a tool result, Python source as text) grows over `--turns`
turns to about `--tokens` prompt tokens. After each turn the reply's ids are remembered,
as the engine does. At turns 10, 50 and 100 the next prompt is rendered, in the same run:

  token mode   `Renderer.render`: the template renders only the new messages (a window
               after the last turn's prompt), the longest earlier turn is found, only the
               text after it is tokenized, ids joined
  full         the whole conversation through the template, the text tokenized whole
               (what rendering without reuse costs)
  renderers    the same conversation for a `renderers` family (Qwen3: the tiny tokenizer
               with Qwen3's special tokens): `FamilyRenderer.render`, the family's
               `bridge_to_next_turn` from the last turn (what token mode now runs for a
               family it knows), against the family's full `render_ids` of the whole
               conversation

Each is timed `--repeat` times; the median is reported, split into template and
tokenizing. Uses the tiny model's tokenizer (built locally on first use).

    .venv/bin/python bench/proxy/token_render.py [--turns 100] [--tokens 50000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl.proxy.engines.token.family import FamilyRenderer, message_key
from harnessrl.proxy.engines.token.render import Renderer
from harnessrl.types import ChatRequest, Message, Text, Tool, ToolCall, ToolResult

DEFAULT_TOKENIZER = Path("~/.cache/harnessrl/models/tiny-qwen2")
REPORT_AT = (10, 50, 100)
_TOOLS = tuple(Tool(name, f"{name}: " + "does a thing. " * 20, {"type": "object", "properties": {
    "command": {"type": "string"}, "path": {"type": "string"}}}) for name in
    ("bash", "read_file", "write_file", "edit", "grep", "glob", "web_fetch", "todo"))


def _corpus() -> str:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return "".join(p.read_text(errors="replace") for p in sorted(stdlib.glob("*.py"))[:40])


class Conversation:
    """Deterministic turns cut from a corpus, sized to reach `tokens` in `turns` turns."""

    def __init__(self, renderer: Renderer, turns: int, tokens: int) -> None:
        self.corpus = _corpus()
        self.renderer = renderer
        self.messages: list[Message] = [
            Message("system", (Text("You are a coding agent. " + self.corpus[:6000]),)),
            Message("user", (Text("Fix the failing test in the repository."),))]
        base = len(renderer.encode(renderer.text(self.request())))
        chars_per_token = 3.2  # this tokenizer on Python source; corrected as we go
        self.turn_chars = int((tokens - base) / turns * chars_per_token)
        self.cursor = 6000

    def request(self) -> ChatRequest:
        return ChatRequest(model="m", messages=tuple(self.messages), tools=_TOOLS)

    def _take(self, size: int) -> str:
        start = self.cursor % (len(self.corpus) - size)
        self.cursor += size
        return self.corpus[start:start + size]

    def reply(self, turn: int) -> tuple[str, ToolCall]:
        thought = self._take(self.turn_chars // 5)
        call = ToolCall(f"call_{turn}", "bash", '{"command": "pytest -x tests/"}')
        return thought, call

    def add_turn(self, turn: int, thought: str, call: ToolCall) -> None:
        self.messages.append(Message("assistant", (Text(thought), call)))
        result = self._take(self.turn_chars - len(thought))
        self.messages.append(Message("tool", (ToolResult(call.id, (Text(result),)),)))


def _median(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, value = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), value


def measure(tokenizer: Any, turns: int, tokens: int, repeat: int) -> list[dict[str, Any]]:
    renderer = Renderer(tokenizer)
    convo = Conversation(renderer, turns, tokens)
    rows = []
    for turn in range(1, turns + 1):
        request = convo.request()
        if turn in REPORT_AT:
            rows.append(_measure_turn(renderer, request, turn, repeat))
        rendered = renderer.render(request, "bench")
        thought, call = convo.reply(turn)
        reply = f'{thought}\n<tool_call>\n{{"name": "bash", "arguments": {call.arguments}}}\n' \
                "</tool_call>"
        renderer.remember("bench", rendered, [*renderer.encode(reply), tokenizer.eos_token_id])
        convo.add_turn(turn, thought, call)
    return rows


def _measure_turn(renderer: Renderer, request: ChatRequest, turn: int,
                  repeat: int) -> dict[str, Any]:
    token_s, rendered = _median(lambda: renderer.render(request, "bench"), repeat)
    tokenize_s, _ = _median(lambda: renderer.render_text(rendered.text, "bench"), repeat)
    template_s, text = _median(lambda: renderer.text(request), repeat)
    full_s, _ = _median(lambda: renderer.encode(text), repeat)
    # The reused ids hold the replies as "sampled" (tokenized on their own), which need not
    # be the whole text's canonical ids; but they must spell the same text.
    if rendered.text != text or renderer.decode(rendered.ids) != text:
        raise AssertionError(f"turn {turn}: the token-mode render does not spell the prompt")
    return {"turn": turn, "tokens": len(rendered.ids), "new": len(rendered.ids) - rendered.reused,
            "messages": len(request.messages), "token_ms": token_s * 1e3,
            "window_ms": max(token_s - tokenize_s, 0.0) * 1e3, "tokenize_ms": tokenize_s * 1e3,
            "full_ms": (template_s + full_s) * 1e3, "template_ms": template_s * 1e3,
            "full_tokenize_ms": full_s * 1e3}


QWEN3_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>",
                "<tool_response>", "</tool_response>", "<think>", "</think>")


def qwen3_renderer(path: Path) -> FamilyRenderer:
    """The tiny tokenizer with Qwen3's special tokens, under renderers' Qwen3 renderer."""
    import renderers
    from renderers.configs import Qwen3RendererConfig
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)  # no unk: see token_families
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN3_TOKENS)})
    tokenizer.eos_token = "<|im_end|>"
    return FamilyRenderer(tokenizer, renderers.create_renderer(tokenizer,
                                                               Qwen3RendererConfig()))


def measure_family(renderer: FamilyRenderer, turns: int, tokens: int,
                   repeat: int) -> list[dict[str, Any]]:
    convo = Conversation(renderer, turns, tokens)
    rows = []
    for turn in range(1, turns + 1):
        request = convo.request()
        if turn in REPORT_AT:
            rows.append(_measure_family_turn(renderer, request, turn, repeat))
        rendered = renderer.render(request, "bench")
        thought, call = convo.reply(turn)
        reply = (f'{thought}\n<tool_call>\n{{"name": "bash", "arguments": {call.arguments}}}'
                 "\n</tool_call><|im_end|>")
        convo.add_turn(turn, thought, call)
        renderer.remember("bench", rendered, renderer.encode(reply),
                          reply=message_key(convo.messages[-2]))
    return rows


def _measure_family_turn(renderer: FamilyRenderer, request: ChatRequest, turn: int,
                         repeat: int) -> dict[str, Any]:
    bridge_s, rendered = _median(lambda: renderer.render(request, "bench"), repeat)
    parts = renderer._converted(request.messages, None)
    messages = [m for p in parts for m in p]
    full_s, ids = _median(lambda: renderer._full_ids(messages, request), repeat)
    if turn > 1 and rendered.mode != "bridged":
        raise AssertionError(f"turn {turn}: the family did not bridge ({rendered.breaks})")
    if renderer.decode(rendered.ids) != renderer.decode(ids):
        raise AssertionError(f"turn {turn}: the bridged prompt does not spell the render")
    return {"turn": turn, "tokens": len(rendered.ids), "bridge_ms": bridge_s * 1e3,
            "family_full_ms": full_s * 1e3}


def markdown(rows: list[dict[str, Any]], verify_every: int) -> str:
    lines = [
        "| turn | prompt tokens | messages | new tokens | token mode ms (template window + "
        "tokenize new) | full re-render ms (template + tokenize all) | token mode vs full |",
        "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['turn']} | {r['tokens']:,} | {r['messages']} | {r['new']:,} | "
            f"{r['token_ms']:.2f} ({r['window_ms']:.2f} + {r['tokenize_ms']:.2f}) | "
            f"{r['full_ms']:.2f} ({r['template_ms']:.2f} + {r['full_tokenize_ms']:.2f}) | "
            f"{r['full_ms'] / max(r['token_ms'], 1e-9):.0f}x less |")
    return "\n".join(lines) + (
        f"\n\nEvery {verify_every}th windowed render is also checked against a full template "
        "render (amortized: the full template column divided by "
        f"{verify_every}).\n")


def measure_parse(renderer: FamilyRenderer, tokenizer: Any, size: int,
                  repeat: int) -> dict[str, float]:
    """CPU per streamed token of parsing a `size`-token reply (reasoning, text, a call),
    one id per read: renderers' parser re-run as the reply grows (`WholeParser`), against
    the incremental Hermes parser token mode keeps for the template path."""
    from harnessrl.proxy.engines.token.replies import TextParser, WholeParser, family_parse
    from harnessrl.proxy.engines.token.toolformats import make_parser

    text = _corpus()[:size * 4]
    reply = (f"<think>\n{text[:len(text) // 2]}\n</think>\n\n{text[len(text) // 2:]}\n"
             '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>')
    fam_ids = [*renderer.encode(reply), renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    ids = tokenizer.encode(reply, add_special_tokens=False)
    pieces = [tokenizer.decode(ids[:n + 1])[len(tokenizer.decode(ids[:n])):]
              for n in range(len(ids))]

    def whole() -> int:
        parser = WholeParser(family_parse(renderer.family, renderer.tokenizer, None, []))
        for token in fam_ids:
            parser.feed("", [token])
        parser.finish()
        return parser.calls

    def hermes() -> int:
        parser = TextParser(make_parser("hermes"))
        for piece in pieces:
            parser.feed(piece, ())
        parser.finish()
        return parser.calls

    whole_s, calls = _median(whole, repeat)
    hermes_s, hermes_calls = _median(hermes, repeat)
    if calls != 1 or hermes_calls != 1:
        raise AssertionError("a parser missed the call")
    return {"tokens": len(fam_ids), "whole_us": whole_s / len(fam_ids) * 1e6,
            "hermes_us": hermes_s / len(ids) * 1e6}


def family_markdown(rows: list[dict[str, Any]], family: list[dict[str, Any]]) -> str:
    lines = ["| turn | prompt tokens (template / Qwen3) | template path: windowed + joined "
             "ms | renderers Qwen3: bridge ms | renderers Qwen3: full render_ids ms | "
             "template: full re-render ms |", "|---|---|---|---|---|---|"]
    for ours, theirs in zip(rows, family, strict=True):
        lines.append(
            f"| {ours['turn']} | {ours['tokens']:,} / {theirs['tokens']:,} | "
            f"{ours['token_ms']:.2f} | {theirs['bridge_ms']:.2f} | "
            f"{theirs['family_full_ms']:.2f} | {ours['full_ms']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=50_000, help="prompt tokens at the last turn")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--tokenizer", type=Path, help="a model directory (default: the tiny model)")
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    path = args.tokenizer
    if path is None:
        from harnessrl.models.tiny import build_tiny_model

        path = build_tiny_model(DEFAULT_TOKENIZER.expanduser())
    rows = measure(AutoTokenizer.from_pretrained(path), args.turns, args.tokens, args.repeat)
    print("### Token mode: per-turn render cost\n")
    print(markdown(rows, Renderer.__init__.__kwdefaults__["verify_every"]))
    qwen3 = qwen3_renderer(path)
    family = measure_family(qwen3, args.turns, args.tokens, args.repeat)
    print("\n" + family_markdown(rows, family))
    tokenizer = AutoTokenizer.from_pretrained(path)
    print("\n| reply tokens | renderers Qwen3 parse, streamed (re-parsed as it grows) "
          "µs/token | incremental Hermes parser µs/token |\n|---|---|---|")
    for size in (200, 2000):
        r = measure_parse(qwen3, tokenizer, size, args.repeat)
        print(f"| {r['tokens']:,} | {r['whole_us']:.1f} | {r['hermes_us']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
