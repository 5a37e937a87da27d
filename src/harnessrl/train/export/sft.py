"""SFT datasets from captured rollouts, as Hugging Face `datasets` saved as Parquet.

Two kinds, both from *solved* rollouts (verifier reward >= `min_reward`):

- **tokens** (rejection sampling / expert iteration on our own model): each chain of a
  solved rollout (its main chain, or all) is one row of `input_ids` (the chain's first
  prompt, then every sampled completion and the tokens inserted between them, exactly as
  the engine saw and produced them) and `assistant_masks` (1 on sampled tokens, 0 on
  the prompt and inserted tokens). TRL 1.16's `SFTTrainer` takes it as is: an
  `input_ids` column marks a dataset as tokenized, and it builds `labels` (-100 where the
  mask is 0) from `assistant_masks`. Nothing is re-tokenized.
- **messages** (distilling a bigger model): rollouts collected from any OpenAI-compatible
  endpoint, which may return no token ids (their turns are flagged
  `prompt_ids_missing`/`completion_ids_missing` and never trained on as tokens), become
  conversations: `messages` (OpenAI chat shape: the longest conversation of the rollout,
  its last reply included) and `tools` (JSON text, which `SFTTrainer` parses). The
  student's own chat template tokenizes them: this is the one place harnessrl lets text
  be tokenized again, and the rows say so (`retokenized` is true). Each message says
  whether the rollout's model `sampled` it: a harness's prompt can carry assistant turns
  of its own (aider's worked example, its "Ok." acknowledgements), which are context to
  learn from, not replies to learn (`tokenized_messages` leaves them out of the loss).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harnessrl.proxy.engines import openai_wire
from harnessrl.rollout.analysis.chains import link
from harnessrl.store.reader import TraceReader
from harnessrl.train.rows.samples import main_chain, sample
from harnessrl.types import ChatRequest, Message, Outcome, Turn

Kind = Literal["tokens", "messages"]
RETOKENIZED_NOTE = (
    "note: a messages export is text; the student's chat template will tokenize it again, "
    "so its tokens are not the ones the teacher sampled (the one place harnessrl "
    "re-tokenizes). Use the tokens export to train on exact ids.")


@dataclass(frozen=True)
class SFTExport:
    path: Path
    kind: Kind
    rows: int
    rollouts: int  # solved rollouts that gave at least one row
    skipped: dict[str, int]  # solved rollouts that gave none, by reason

    @property
    def retokenized(self) -> bool:
        return self.kind == "messages"


def solved(store: TraceReader, min_reward: float = 1.0) -> Iterator[Outcome]:
    for outcome in store.outcomes():
        if outcome.status == "done" and (outcome.verifier_reward or 0) >= min_reward:
            yield outcome


# ------------------------------------------------------------------ tokens
def token_rows(outcome: Outcome, turns: list[Turn], chains: Literal["main", "all"] = "main"
               ) -> list[dict[str, Any]]:
    linked = link(turns).chains
    chosen = linked if chains == "all" else [c for c in [main_chain(linked)] if c is not None]
    rows = []
    for chain in chosen:
        s = sample(chain)
        rows.append({
            "input_ids": [*s.prompt_ids, *s.completion_ids],
            "assistant_masks": [0] * len(s.prompt_ids) + list(s.mask),
            "rollout": s.rollout, "turns": list(s.turns), "harness": outcome.harness,
            "task": outcome.task, "reward": outcome.reward,
            "weight_versions": [v or "" for v in s.weight_versions],
            "retokenized": False})
    return rows


# ------------------------------------------------------------------ messages
def conversation(turns: list[Turn]) -> tuple[list[dict[str, Any]], str] | None:
    """The rollout's longest conversation (the ok turn whose request holds the most
    messages) with that turn's reply appended, and its tools as JSON text."""
    done = [t for t in turns if t.status == "ok" and t.request and t.completion]
    if not done:
        return None
    turn = max(done, key=lambda t: (len(t.request.messages), t.index))  # type: ignore[union-attr]
    request, completion = turn.request, turn.completion
    assert request is not None and completion is not None
    reply = Message("assistant", completion.parts)
    full = ChatRequest(model=request.model, messages=(*request.messages, reply))
    messages = [_text_only(m) for m in openai_wire.messages(full)]
    _mark_sampled(messages, [t.completion for t in done if t.completion])
    return messages, json.dumps(openai_wire.tools(request.tools))


def _mark_sampled(messages: list[dict[str, Any]], completions: list[Any]) -> None:
    """Flag the assistant messages that are the rollout's own replies: each recorded
    completion claims one message with its text and tool calls, the latest first (a
    harness's example turns come before the model's). A reply the harness replayed
    altered matches nothing and stays unflagged: left out of the loss, never mis-learned."""
    left = Counter(_reply_key(_text_only(m)) for c in completions for m in openai_wire.messages(
        ChatRequest(model="", messages=(Message("assistant", c.parts),))))
    for message in reversed(messages):
        key = _reply_key(message)
        if message["role"] == "assistant" and left[key] > 0:
            message["sampled"] = True
            left[key] -= 1


def _reply_key(message: dict[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A reply as compared across replays: its text (stripped) and its calls, each call's
    arguments as canonical JSON (harnesses re-serialise them; call ids they rename)."""
    def canonical(arguments: Any) -> str:
        try:
            return json.dumps(json.loads(arguments) if isinstance(arguments, str) else arguments,
                              sort_keys=True)
        except ValueError:
            return str(arguments)

    calls = tuple((c["function"]["name"], canonical(c["function"].get("arguments")))
                  for c in message.get("tool_calls") or [])
    return (message.get("content") or "").strip(), calls


def _text_only(message: dict[str, Any]) -> dict[str, Any]:
    """One shape for every row, so Arrow stores the column: content as text (parts joined
    with newlines, as vLLM flattens them for string templates; images dropped)."""
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(p["text"] for p in content if p.get("type") == "text")
    return {"role": message["role"], "content": content or "",
            "tool_calls": message.get("tool_calls") or [],
            "tool_call_id": message.get("tool_call_id") or "",
            "reasoning_content": message.get("reasoning_content") or "",
            "sampled": False}


def message_rows(outcome: Outcome, turns: list[Turn]) -> list[dict[str, Any]]:
    found = conversation(turns)
    if found is None:
        return []
    messages, tools = found
    trainable = sum(1 for t in turns if t.completion and not t.flags
                    and t.completion.tokens.completion_ids is not None)
    return [{"messages": messages, "tools": tools, "rollout": outcome.rollout,
             "harness": outcome.harness, "task": outcome.task, "reward": outcome.reward,
             "model": next((t.model for t in turns if t.model), ""),
             "sampled_turns": sum(m["sampled"] for m in messages),
             "turns_with_ids": trainable, "retokenized": True}]


# ------------------------------------------------------------------ the export
def export_sft(run_dir: Path, out: Path, *, kind: Kind = "tokens", min_reward: float = 1.0,
               chains: Literal["main", "all"] = "main") -> SFTExport:
    """Write the SFT dataset of `run_dir`'s solved rollouts to `out` (Parquet)."""
    from datasets import Dataset

    if not (run_dir / "trace.db").is_file():
        raise FileNotFoundError(f"no trace store in {run_dir}")
    rows: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}
    used = 0
    with TraceReader(run_dir) as store:
        for outcome in solved(store, min_reward):
            turns = store.turns(outcome.rollout)
            found = (token_rows(outcome, turns, chains) if kind == "tokens"
                     else message_rows(outcome, turns))
            if not found:
                why = "no trainable turn" if kind == "tokens" else "no finished turn"
                skipped[why] = skipped.get(why, 0) + 1
            used += bool(found)
            rows.extend(found)
    out.parent.mkdir(parents=True, exist_ok=True)
    if rows:
        Dataset.from_list(rows).to_parquet(str(out))
    else:
        _empty(out, kind)
    return SFTExport(out, kind, len(rows), used, skipped)


def _empty(out: Path, kind: Kind) -> None:
    """A valid Parquet file with the columns and no rows, so pipelines fail on 0 rows,
    not on a missing file."""
    from datasets import Dataset

    names = (["input_ids", "assistant_masks"] if kind == "tokens" else ["messages", "tools"])
    Dataset.from_dict({n: [] for n in names}).to_parquet(str(out))


# ------------------------------------------------------------------ messages -> exact ids
def tokenized_messages(tokenizer: Any, messages: list[dict[str, Any]],
                       tools: list[dict[str, Any]] | None = None) -> tuple[list[int], list[int]]:
    """A conversation (a messages export row) as the student's chat template renders it:
    its token ids and a mask, 1 on the tokens of the assistant turns the model sampled
    (what SFT learns: the reply and its tool calls), 0 on the rest (system prompt, user,
    tool results, the template's headers, and assistant turns flagged `sampled: false`,
    a harness's own examples; a message without the flag counts as sampled). The text
    is tokenized once, whole; each assistant turn's characters are found by rendering
    the conversation up to it (with the generation prompt) and through it. A template
    whose shorter renders are not prefixes of the longer ones cannot be masked this way
    and is refused (ValueError), never mis-masked."""
    def render(upto: int, prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages[:upto], tools=tools or None,
                                             tokenize=False, add_generation_prompt=prompt)

    full = render(len(messages), False)
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant" or not message.get("sampled", True):
            continue
        start, end = render(i, True), render(i + 1, False)
        if not (end.startswith(start) and full.startswith(end)):
            raise ValueError("the chat template does not render a conversation as a prefix "
                             f"of its continuation (at message {i}); its assistant turns "
                             "cannot be masked")
        spans.append((len(start), len(end)))
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= lo and hi <= b for a, b in spans) and hi > lo)
            for lo, hi in encoded["offset_mapping"]]
    return list(encoded["input_ids"]), mask
