#!/usr/bin/env python3
"""Chain extension in chat mode vs token mode, on the same sessions of the real harnesses.

Each harness (unmodified, headless, in a local sandbox) is run once per engine mode
through the proxy against one real vLLM serving the tiny model. Its replies are the
conformance policy's (`--steps` harmless shell calls, then one that writes a file, then
finish the harness's way), forced on the model with vLLM's structured outputs (a regex
that only the policy's text matches), so both modes see the same conversation; the ids
are still the model's own: under the constraint it picks its own tokenization of that
text, often not the tokenizer's canonical one, as real models sometimes do.

Then `harnessrl.rollout.analysis.chains.report` gives, per harness and mode, how many turns extend
the turn before them (prompt ids = earlier prompt + completion ids + new ids).

  chat mode   vLLM renders the history the harness sends back and tokenizes it again
  token mode  the proxy renders it and reuses the ids the model sampled (`--engine-mode token`)

    .venv/bin/python bench/store/chain_extension.py [--harness mini-swe-agent,hermes] [--out FILE]

Per model family (no vLLM per family can run here: no weights, no hub), `--per-family`
runs `bench/store/family_chains.py` instead: each family's tokenizer built at test time, the
scripted completions engine sampling its markup, token mode vs the history re-rendered
as chat mode would.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from harnessrl.harnesses import MODULES, get
from harnessrl.harnesses.base import DEFAULT_TOOLS_DIR, Harness
from harnessrl.proxy.engines.policy import (
    SHELL_TOOLS,
    WriteFilePolicy,
    _pick,
    _shell_arguments,
    tool_call,
)
from harnessrl.proxy.engines.scripted import Reply
from harnessrl.proxy.engines.token.engine import TokenEngine
from harnessrl.proxy.engines.vllm import VLLMEngine
from harnessrl.proxy.engines.vllm_server import VLLMServer
from harnessrl.proxy.serve import running
from harnessrl.rollout.analysis.chains import ChainStats, link, report
from harnessrl.rollout.conformance import FILENAME, Result, _run, random_line
from harnessrl.types import ChatRequest, ToolResult

TOOLS_DIR = DEFAULT_TOOLS_DIR.expanduser()
MODEL_CACHE = Path("~/.cache/harnessrl/models/tiny-qwen2").expanduser()
Force = Callable[[ChatRequest], dict[str, Any]]


def forcing(policy: Callable[[ChatRequest], Any]) -> Force:
    """Structured outputs that let the model write nothing but the policy's reply."""
    return lambda request: {"structured_outputs": {"regex": re.escape(policy(request).text)}}


class Steps:
    """The conformance policy with `extra` harmless shell calls before the write, so a
    session has more turns that continue the one before."""

    def __init__(self, policy: WriteFilePolicy, extra: int) -> None:
        self.policy = policy
        self.extra = extra

    def __call__(self, request: ChatRequest) -> Reply:
        shell = _pick(request.tools, SHELL_TOOLS)
        if shell is None:
            return self.policy(request)  # no tools (aider) or a side call
        done = sum(isinstance(p, ToolResult) for m in request.messages for p in m.parts)
        if done < self.extra:
            return Reply(tool_call(shell.name, _shell_arguments(shell, f"echo step {done}")))
        if done == self.extra:
            return Reply(self.policy._act(request.tools))
        return Reply(self.policy._done(request.tools))


class Policies:
    """The policy of the harness running now (one harness at a time per proxy)."""

    def __init__(self, extra: int = 0) -> None:
        self.current: Steps | None = None
        self.extra = extra

    def __call__(self, request: ChatRequest) -> Any:
        assert self.current is not None
        return self.current(request)


def run_mode(mode: str, harnesses: list[Harness], engine_url: str, model: Path, root: Path,
             timeout: float, extra: int) -> tuple[dict[str, ChainStats], dict[str, str]]:
    policies = Policies(extra)
    force = forcing(policies)
    engine: VLLMEngine = (TokenEngine(engine_url, str(model), extra_body=force)
                          if mode == "token" else VLLMEngine(engine_url, extra_body=force))
    notes: dict[str, str] = {}
    with running(engine, root / mode) as served:
        for harness in harnesses:
            notes[harness.name] = _one(harness, policies, served.url, root / mode, timeout)
        store = served.store
        stats = report(store).harnesses
        for rollout in store.iter_rollouts():
            name = str(rollout.metadata.get("harness"))
            where = Counter(c.start.within for c in link(store.turns(rollout.key)).chains
                            if c.start.reason == "history_rewritten")
            if where:
                notes[name] += "; broke in " + ", ".join(
                    f"{n} {'sampled' if w == 'completion' else 'inserted'}"
                    for w, n in sorted(where.items()))
    return stats, notes


def _one(harness: Harness, policies: Policies, url: str, root: Path, timeout: float) -> str:
    line = random_line()
    policies.current = Steps(WriteFilePolicy(FILENAME, line, harness.finish), policies.extra)
    rollout = httpx.post(f"{url}/rollouts", json={"metadata": {"harness": harness.name}}).json()
    result = Result(harness.name, harness.version, harness.dialect)
    started = time.monotonic()
    asyncio.run(_run(harness, rollout, TOOLS_DIR, root, line, timeout, result))
    seconds = time.monotonic() - started
    print(f"  {harness.name}: {seconds:.0f} s {'; '.join(result.problems) or 'ok'}",
          file=sys.stderr, flush=True)
    return "; ".join(result.problems) or "wrote the file"


def _cell(stats: ChainStats | None) -> str:
    if stats is None or not stats.turns:
        return "no turns"
    rate = stats.extension_rate
    breaks = ", ".join(f"{k} {n}" for k, n in sorted(stats.breaks.items()) if k != "first")
    excluded = ", ".join(f"{k} {n}" for k, n in sorted(stats.excluded.items()))
    text = (f"{'-' if rate is None else f'{rate:.0%}'} ({stats.extended}/"
            f"{stats.extended + stats.breaks['history_rewritten']}; {stats.turns} turns")
    return text + (f"; {breaks}" if breaks else "") + (f"; excl. {excluded}" if excluded
                                                        else "") + ")"


def markdown(results: dict[str, tuple[dict[str, ChainStats], dict[str, str]]],
             names: list[str]) -> str:
    modes = list(results)
    lines = ["| harness | " + " | ".join(f"{m} mode: extension rate" for m in modes)
             + " | harness run |", "|---|" + "---|" * len(modes) + "---|"]
    totals = {m: ChainStats() for m in modes}
    for name in names:
        cells = []
        for mode in modes:
            stats = results[mode][0].get(name)
            if stats is not None:
                totals[mode].add(stats)
            cells.append(_cell(stats))
        runs = "; ".join(f"{m}: {results[m][1].get(name, '-')}" for m in modes)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {runs} |")
    lines.append("| **all** | " + " | ".join(_cell(totals[m]) for m in modes) + " | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--per-family" in argv:  # per family, scripted: bench/store/family_chains.py
        import family_chains  # type: ignore[import-not-found]  (beside this file)

        rest = [a for a in argv if a != "--per-family"]
        return family_chains.main(rest)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--harness", default=",".join(sorted(MODULES)),
                    help="comma-separated (default: all twelve)")
    ap.add_argument("--modes", default="chat,token")
    ap.add_argument("--engine-url", help="a running vLLM with --tool-call-parser hermes "
                                         "(default: start one)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per harness run")
    ap.add_argument("--steps", type=int, default=3,
                    help="shell calls before the file is written (more continuing turns)")
    ap.add_argument("--out", type=Path, help="also write the table here")
    args = ap.parse_args(argv)
    from harnessrl.models.tiny import build_tiny_model

    model = build_tiny_model(MODEL_CACHE)
    harnesses = [get(n) for n in args.harness.split(",")]
    for harness in harnesses:
        harness.install(TOOLS_DIR, log=lambda _line: None)
    server = None
    if args.engine_url is None:
        server = VLLMServer(model=str(model), served_name="tiny", dtype="float32",
                            max_model_len=65536, tool_call_parser="hermes",
                            extra_args=["--seed", "0"])
        args.engine_url = server.start()
    results = {}
    try:
        with tempfile.TemporaryDirectory(prefix="hrl-chain-") as work:
            for mode in args.modes.split(","):
                print(f"{mode} mode:", file=sys.stderr, flush=True)
                results[mode] = run_mode(mode, harnesses, args.engine_url, model, Path(work),
                                         args.timeout, args.steps)
    finally:
        if server is not None:
            server.stop()
    table = ("### Chain extension: chat mode vs token mode, real harnesses, tiny model on "
             "vLLM\n\n" + markdown(results, [h.name for h in harnesses]))
    print(table)
    if args.out:
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
