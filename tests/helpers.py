"""What several test files share, so that none imports another: the recorded harness
requests, a proxy served in a thread, a stored turn, harness-like drivers of each
dialect, and a broken token-mode backend. Fixtures stay in conftest.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harnessrl.proxy.engines.scripted_completions import Sample, ScriptedCompletions
from harnessrl.proxy.serve import in_thread
from harnessrl.types import (
    ChatRequest,
    Completion,
    Message,
    Text,
    Timings,
    Tokens,
    Tool,
    ToolCall,
    Turn,
    Usage,
)

CACHE = Path(os.environ.get("HARNESSRL_TEST_CACHE", Path.home() / ".cache" / "harnessrl" / "test"))

# ------------------------------------------------------------------ recorded requests
# Real requests the harnesses sent to a loopback recorder, redacted (long harness text
# replaced by "<N chars of harness text>", keys masked): tests/recorded/<harness>/*.json,
# each {"method", "path", "query", "headers", "body"}.
RECORDED = Path(__file__).parent / "recorded"


def recorded_requests(*harnesses: str) -> list[Path]:
    """The recorded request files of `harnesses` (of every harness when none is named),
    sorted. A harness without any is an error, not an empty list: a test parametrized
    over nothing would be skipped."""
    dirs = ([RECORDED / h for h in harnesses] if harnesses
            else sorted(p for p in RECORDED.iterdir() if p.is_dir()))
    if missing := [d.name for d in dirs if not any(d.glob("*.json"))]:
        raise FileNotFoundError(f"no recorded requests in {RECORDED} for {missing}")
    return sorted(p for d in dirs for p in d.glob("*.json"))


REDACTED = re.compile(r"<(\d+) chars of harness text>")


def unredacted(value: Any) -> Any:
    """A recorded body with each redacted text ("<N chars of harness text>") back at its
    length, as filler: a system prompt's size decides how much of a prompt it is."""
    if isinstance(value, str) and (m := REDACTED.fullmatch(value)):
        return ("You are a coding agent working in a sandbox. " * 200)[:int(m[1])]
    if isinstance(value, dict):
        return {k: unredacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unredacted(v) for v in value]
    return value


# ------------------------------------------------------------------ a proxy in a thread
class ServedProxy:
    """A proxy served in a thread, for sync SDK clients; its store is closed (the writer
    stopped, reads still work) when `running` ends."""

    def __init__(self, proxy) -> None:
        self.proxy = proxy
        self.store = proxy.store
        self.url = ""

    @contextlib.contextmanager
    def running(self) -> Iterator[ServedProxy]:
        with self.store, in_thread(self.proxy.app()) as (url, _server):
            self.url = url
            yield self

    def new_rollout(self, **options) -> dict:
        import httpx

        resp = httpx.post(f"{self.url}/rollouts", json=options)
        resp.raise_for_status()
        return resp.json()


def engine_events(engine, request, *, stream: bool) -> list:
    """Every event one engine call gives, streamed or whole, the engine started and closed
    around it."""

    async def run() -> list:
        await engine.start()
        try:
            if stream:
                return [e async for e in engine.stream(request, "k")]
            return await engine.complete(request, "k")
        finally:
            await engine.close()

    return asyncio.run(run())


def make_proxy(engine, run_dir: Path, **config):
    from harnessrl.proxy.app import Proxy
    from harnessrl.proxy.config import ProxySettings
    from harnessrl.proxy.sessions import Sessions
    from harnessrl.store.writer import TraceStore

    sessions_options = {k: config.pop(k) for k in ("sampling", "unset_sampling") if k in config}
    sessions = Sessions(TraceStore(run_dir), **sessions_options)
    return Proxy(engine, sessions, ProxySettings(**config))


# ------------------------------------------------------------------ a stored turn
def make_turn(key: str, index: int, n: int = 3) -> Turn:
    """A finished chat turn with `n` completion ids and distinct logprobs."""
    request = ChatRequest(model="m", messages=(Message("user", (Text("hi"),)),))
    tokens = Tokens(tuple(range(100 + index)), tuple(range(n)),
                    tuple(-0.1 * i - 1e-9 for i in range(n)))
    completion = Completion("m", (Text("yo"),), "stop", Usage(100 + index, n), tokens)
    return Turn(rollout=key, index=index, dialect="openai_chat", status="ok",
                timings=Timings(1.0, 2.0, 3.0), raw_request=b'{"x": 1}',
                raw_response=b"data: [DONE]\n\n", request=request, completion=completion)


def tool_turn(index: int, *, tools: bool, calls: int, text: str = "ok") -> Turn:
    """A finished chat turn whose request offers a bash tool (or none) and whose reply
    makes `calls` native tool calls."""
    request = ChatRequest(model="m", messages=(Message("user", (Text("do it"),)),),
                          tools=(Tool("bash"),) if tools else ())
    parts = (Text(text), *(ToolCall(f"c{index}.{n}", "bash", '{"command": "ls"}')
                           for n in range(calls)))
    completion = Completion("m", parts, "tool_calls" if calls else "stop", None,
                            Tokens((1, 2), (3, 4, 5), (-0.1, -0.2, -0.3)))
    return Turn(rollout="r", index=index, dialect="openai_chat", status="ok",
                timings=Timings(1.0), raw_request=b"{}", request=request, completion=completion)


# ------------------------------------------------------------------ harness-like drivers
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}},
          "required": ["command"]}


def call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


# Three turns with reasoning and tool calls, written as the model's own output.
REPLIES = [
    "<think>\nI will look first.\n</think>\n\n" + call("bash", {"command": "ls"}),
    "<think>\nNow write it.\n</think>\n\nWriting.\n"
    + call("bash", {"command": "echo hi > hello.txt"}),
    "Done: hello.txt holds hi.",
]


# ------------------------------------------------------------------ a broken backend
class DropsAToken(ScriptedCompletions):
    """A broken backend: it reports one id fewer than it sampled (the text stays whole),
    so the ids the proxy keeps are not the ones the model wrote."""

    def sample(self, prompt, reply, max_tokens, stop_ids) -> Sample:
        s = super().sample(prompt, reply, max_tokens, stop_ids)
        n = len(s.ids) // 2
        pieces = [*s.pieces[:n - 1], s.pieces[n - 1] + s.pieces[n], *s.pieces[n + 1:]]
        return Sample(s.prompt_ids, s.ids[:n] + s.ids[n + 1:], pieces,
                      s.logprobs[:n] + s.logprobs[n + 1:], s.finish)


# ------------------------------------------------------------------ serve --workers N
@contextlib.contextmanager
def serve_workers_cli(args: list[str], run_dir: Path, n: int = 2,
                      timeout: float = 240.0) -> Iterator[tuple[str, list[int]]]:
    """`harnessrl serve --workers N ARGS` as real processes on a free port, until every
    worker answers; yields (shared URL, each worker's private port)."""
    import re
    import signal
    import subprocess
    import sys
    import threading
    import time

    import httpx

    from harnessrl.proxy.engines.vllm_server import free_port

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "harnessrl.cli", "serve", "--workers", str(n), *args,
         "--run-dir", str(run_dir), "--port", str(port)], stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        lines = [process.stderr.readline()]
        while not (found := re.search(r"their own ports ([\d, ]+);", lines[-1])):
            assert lines[-1] and len(lines) < 50, "".join(lines)
            lines.append(process.stderr.readline())
        threading.Thread(target=process.stderr.read, daemon=True).start()  # never blocks
        private = [int(p) for p in found.group(1).split(", ")]
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        for base in [f"http://127.0.0.1:{p}" for p in private] + [url]:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                        break
                assert time.monotonic() < deadline, f"{base} did not come up"
                time.sleep(0.2)
        yield url, private
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        finally:
            process.kill()


# ------------------------------------------------------------------ train configs
# Replies cut at max_tokens: every reply trained (the default masks truncated replies:
# tests/test_grpo.py). Rewards there are coin flips: a group that comes out uniform is
# dropped and replaced (the default), so every step has a gradient and a checkpoint holds
# an optimizer state; EVERY_GROUP_KEPT keeps them (a step the optimizer does not take)
# where a test compares the rows two runs trained.
EVERY_REPLY_TRAINED: dict[str, Any] = {"truncated_turns": "train", "rejected_turns": "train"}
EVERY_GROUP_KEPT: dict[str, Any] = {**EVERY_REPLY_TRAINED, "drop_uniform_groups": False}


def train_toml(path: Path, *, run_dir: Path, model: Path, url: str, max_tokens: int,
               harnesses: list[str], tasks: Path, rollout: dict[str, Any] | None = None,
               **tables: dict[str, Any] | None) -> Path:
    """The train config file (TOML) the real-vLLM train runs of the tests and benches
    write: the model at a running vLLM, `harnesses` on the `tasks` file, no retries, the
    host not hidden; `rollout` adds [rollout] keys and every other keyword is a table
    (`grpo={...}`, a dict value inside it a sub-table such as [grpo.trl]; None: none)."""
    sections: dict[str, dict[str, Any]] = {
        "model": {"path": str(model)},
        "engine": {"url": url, "max_tokens": max_tokens},
        "rollout": {"harnesses": harnesses, "tasks": str(tasks), "retries": 0,
                    "hide_host": False, **(rollout or {})},
        **{name: table for name, table in tables.items() if table is not None}}
    lines = [f"run_dir = {_toml(str(run_dir))}"]
    for name, table in sections.items():
        lines += _toml_table(name, table)
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml_table(name: str, table: dict[str, Any]) -> list[str]:
    lines = [f"[{name}]"] + [f"{key} = {_toml(value)}" for key, value in table.items()
                             if not isinstance(value, dict)]
    for key, value in table.items():
        if isinstance(value, dict):
            lines += _toml_table(f"{name}.{key}", value)
    return lines


def _toml(value: Any) -> str:
    """A TOML value: JSON's spelling is TOML's for strings, numbers and arrays of them."""
    return ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)
