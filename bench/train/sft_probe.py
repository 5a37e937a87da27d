#!/usr/bin/env python3
"""A cheap look at a model before a harness eval (issue 40): greedy replies, with
transformers only (no vLLM, no harness), to held-out prompts exactly as the harnesses
rendered them (the first turn's prompt ids of stored eval rollouts), and how many of them
the harness could act on: a tool call that parses (Hermes `<tool_call>` JSON naming one
of the request's tools) or, for a harness that only writes files (aider), a file listing.
Figures, not a test; it says nothing about whether the action is right.

    python bench/train/sft_probe.py --model runs/seed_table/models/sft-s0 \\
        --runs runs/seed_table/work/eval__base__s0__{mini-swe-agent,aider,pi} --per-harness 5
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

# aider's whole-file format: a file name alone on a line, then a fenced listing
LISTING = re.compile(r"^[\w./-]+\.\w+\s*\n```[^\n]*\n", re.MULTILINE)


def prompts(run_dir: Path, per_harness: int) -> list[dict[str, Any]]:
    """The first turn of each rollout (sorted by task): its harness, task, prompt ids,
    the tools the request offered."""
    from harnessrl.store.reader import TraceReader

    found = []
    with TraceReader(run_dir) as store:
        for outcome in sorted(store.outcomes(), key=lambda o: o.task)[:per_harness]:
            first = next((t for t in store.turns(outcome.rollout) if t.completion
                          and t.completion.tokens.prompt_ids), None)
            if first is None or first.request is None or first.completion is None:
                continue
            found.append({"harness": outcome.harness, "task": outcome.task,
                          "prompt_ids": list(first.completion.tokens.prompt_ids or ()),
                          "tools": {t.name for t in first.request.tools}})
    return found


def actionable(text: str, tools: set[str], whole_file: bool) -> bool:
    """Whether the harness could act on the reply: a listing (whole-file harnesses) or a
    well-formed call of an offered tool."""
    if whole_file:
        return bool(LISTING.search(text))
    from harnessrl.proxy.engines.token.parsers import HermesParser
    from harnessrl.types import ToolCallDelta

    parser = HermesParser()
    deltas = [*parser.feed(text), *parser.finish()]
    return any(isinstance(d, ToolCallDelta) and d.name in tools for d in deltas)


def reply(model: Any, tokenizer: Any, prompt_ids: list[int], max_new: int
          ) -> tuple[str, float]:
    """The greedy reply's text (markup kept) and p(first token = `<tool_call>`)."""
    import torch

    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                             do_sample=False, output_scores=True, return_dict_in_generate=True,
                             pad_token_id=tokenizer.pad_token_id)
    first = torch.log_softmax(out.scores[0][0].float(), dim=-1)
    call = tokenizer.convert_tokens_to_ids("<tool_call>")
    text = tokenizer.decode(out.sequences[0][len(prompt_ids):], skip_special_tokens=False)
    return text, math.exp(first[call].item())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--runs", type=Path, nargs="+", required=True,
                   help="stored eval run dirs (one harness each) whose prompts to reuse")
    p.add_argument("--per-harness", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--jsonl", type=Path, default=None, help="also write each reply here")
    args = p.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harnessrl.harnesses import get

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    rows = []
    for run_dir in args.runs:
        for item in prompts(run_dir, args.per_harness):
            started = time.monotonic()
            text, p_call = reply(model, tokenizer, item["prompt_ids"], args.max_new_tokens)
            whole = get(item["harness"]).finish == "whole-file"
            rows.append({"harness": item["harness"], "task": item["task"], "reply": text,
                         "p_tool_call_first": p_call, "seconds": time.monotonic() - started,
                         "actionable": actionable(text, item["tools"], whole)})
    if args.jsonl:
        args.jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"model {args.model}: greedy, {args.max_new_tokens} new tokens at most")
    for harness in dict.fromkeys(r["harness"] for r in rows):
        mine = [r for r in rows if r["harness"] == harness]
        what = "a file listing" if get(harness).finish == "whole-file" else "a parsed call"
        p_call = sum(r["p_tool_call_first"] for r in mine) / len(mine)
        print(f"  {harness}: {sum(r['actionable'] for r in mine)}/{len(mine)} with {what}; "
              f"p(<tool_call> first) mean {p_call:.3f}; "
              f"{sum(r['seconds'] for r in mine) / len(mine):.1f} s per reply")
        for r in mine[:2]:
            print(f"    {r['task']}: {r['reply'][:160]!r}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
