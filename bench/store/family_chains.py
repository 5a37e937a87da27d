#!/usr/bin/env python3
"""Chain extension per model family, token mode vs chat mode, without a model per family.

No vLLM per family can run here (no weights, no hub), so each family gets the tiny model's
tokenizer with the family's special tokens (tests/token_families.py) and the scripted
completions server sampling the family's own markup. A scripted session (three tool calls,
an answer, a new user message, a call, an answer; the harness echoes each reply with its
reasoning, as an OpenAI client does) runs through the real TokenEngine:

  token mode  the proxy's prompt (the family's bridge, else its render and our join)
  chat mode   what vLLM's chat endpoint would send: the history rendered again by the
              model's template (the family's renderer, which matches it token for token;
              LFM2: the template), the same sampled completion ids

and each turn that continues the conversation counts as extended when its prompt starts
with the previous prompt + completion ids (`rollout.analysis.chains.extends`). Two samplings:
`canonical` (the reply's own tokenization: the best case for chat mode) and `split` (the
first word of each reply written one character per id, as real models sometimes write a
word: bench/store/chain_extension.py sees it on real harnesses with real vLLM).

    PYTHONPATH=src:. .venv/bin/python bench/store/family_chains.py [--families qwen3,lfm2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from tests.token_families import BY_NAME, FAMILIES, Family, engine_settings, family_tokenizer

from harnessrl.proxy.engines.scripted import Reply, default_logprob, detokenize, replay
from harnessrl.proxy.engines.scripted_completions import Sample, ScriptedCompletions
from harnessrl.proxy.engines.token.engine import TokenEngine
from harnessrl.proxy.serve import in_thread
from harnessrl.proxy.wire.accumulate import accumulate
from harnessrl.rollout.analysis.chains import extends
from harnessrl.types import (
    ChatRequest,
    Message,
    Reasoning,
    Text,
    Tokens,
    Tool,
    ToolCall,
    ToolResult,
)

BASH = Tool("bash", "Run a command.", {"type": "object", "properties": {
    "command": {"type": "string"}}, "required": ["command"]})
# The session: what the model answers each turn ("call" or "answer"), and after which
# turns a new user message comes instead of tool results.
SCRIPT = ("call", "call", "call", "answer", "call", "answer")
NEW_USER_AFTER = frozenset({3})


class SplitWord(ScriptedCompletions):
    """Samples the reply's first multi-character plain token one character per id."""

    def sample(self, prompt: list[int], reply: Reply, max_tokens: int | None,
               stop_ids: Any) -> Sample:
        sample = super().sample(prompt, reply, max_tokens, stop_ids)
        special = set(self.tokenizer.all_special_ids)
        for n, token in enumerate(sample.ids):
            piece = self.tokenizer.decode([token])
            chars = [self.tokenizer.convert_tokens_to_ids(self.tokenizer.tokenize(c))
                     for c in piece]
            if token in special or len(piece) < 2 or not all(len(c) == 1 for c in chars):
                continue
            ids = [*sample.ids[:n], *(c[0] for c in chars), *sample.ids[n + 1:]]
            return Sample(prompt, ids, detokenize(self.tokenizer, ids),
                          [default_logprob(i) for i in range(len(ids))], sample.finish)
        return sample


def _echo(completion: Any) -> Message:
    """The reply as the harness sends it back: reasoning, text and calls, in that order."""
    order = {Reasoning: 0, Text: 1, ToolCall: 2}
    parts = sorted((p for p in completion.parts if type(p) in order),
                   key=lambda p: order[type(p)])
    return Message("assistant", tuple(parts))


def _next_messages(turn: int, completion: Any) -> list[Message]:
    if completion.tool_calls:
        return [Message("tool", (ToolResult(c.id, (Text(f"a.txt b.txt {turn}"),)),))
                for c in completion.tool_calls]
    return [Message("user", (Text("Now list them again."),))] if turn in NEW_USER_AFTER else []


def chat_prompt(engine: TokenEngine, request: ChatRequest) -> list[int]:
    """The ids vLLM's chat endpoint would prompt with: the whole history rendered again."""
    renderer = engine.renderer
    return renderer.encode(renderer.text(request))


async def session(family: Family, tokenizer: Any, *, split: bool
                  ) -> dict[str, tuple[int, int]]:
    replies = [family.call if step == "call" else family.answer for step in SCRIPT]
    server = (SplitWord if split else ScriptedCompletions)(tokenizer)
    policy = replay([Reply(r, eos=False) for r in replies])
    counts = {"token": [0, 0], "chat": [0, 0]}
    with in_thread(server.app()) as (url, _):
        engine = TokenEngine(url, tokenizer, extra_body=server.extra_body(policy),
                             **engine_settings(family))
        await engine.start()
        try:
            messages = [Message("system", (Text("You are an agent."),)),
                        Message("user", (Text("List the files."),))]
            last: dict[str, Tokens | None] = {"token": None, "chat": None}
            for turn in range(len(SCRIPT)):
                request = ChatRequest(model="m", messages=tuple(messages), tools=(BASH,))
                completion = accumulate(await engine.complete(request, "bench")).completion()
                sampled = completion.tokens
                prompts = {"token": sampled.prompt_ids, "chat": tuple(chat_prompt(
                    engine, request))}
                for mode, prompt in prompts.items():
                    before = last[mode]
                    if before is not None:
                        counts[mode][1] += 1
                        counts[mode][0] += extends(prompt, before)
                    last[mode] = Tokens(prompt, sampled.completion_ids, sampled.logprobs)
                messages += [_echo(completion), *_next_messages(turn, completion)]
        finally:
            await engine.close()
    return {mode: (n, total) for mode, (n, total) in counts.items()}


def markdown(rows: dict[str, dict[str, dict[str, tuple[int, int]]]]) -> str:
    lines = ["| family | path | canonical ids: token mode | canonical: chat mode | split "
             "word: token mode | split word: chat mode |", "|---|---|---|---|---|---|"]
    for name, runs in rows.items():
        path = "template + vLLM parser" if BY_NAME[name].template else "renderers"
        cells = [f"{n}/{total}" for run in ("canonical", "split")
                 for n, total in (runs[run]["token"], runs[run]["chat"])]
        lines.append(f"| {name} | {path} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(f.name for f in FAMILIES))
    ap.add_argument("--out", type=Path, help="also write the table here")
    args = ap.parse_args(argv)
    from harnessrl.models.tiny import build_tiny_model

    model = build_tiny_model(Path("~/.cache/harnessrl/models/tiny-qwen2").expanduser())
    rows = {}
    for name in args.families.split(","):
        family = BY_NAME[name]
        tokenizer = family_tokenizer(model, family)
        rows[name] = {run: asyncio.run(session(family, tokenizer, split=run == "split"))
                      for run in ("canonical", "split")}
        print(f"  {name}: {json.dumps(rows[name])}", file=sys.stderr, flush=True)
    table = ("### Chain extension per family: token mode vs chat mode (scripted sessions, "
             f"{len(SCRIPT) - 1} continuing turns each)\n\n" + markdown(rows))
    print(table)
    if args.out:
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
