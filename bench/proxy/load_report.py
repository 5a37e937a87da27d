"""Figures and the Markdown report of `bench/proxy/load.py`."""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "common")]  # bench/ is not a package

from table import Row, figure_table, machine_line, md_table, pct, verdict  # noqa: E402

FLAT = 0.10  # allowed RSS deviation from the first sample after the warm-up
TURNS_TARGET = 20_000  # at the default duration (10 minutes)


def memory(result: Any) -> tuple[float, float, float, float]:
    """RSS at the first sample after the warm-up, min and max after it, worst deviation."""
    steady = [s.rss for s in result.samples if s.t >= result.args.warmup]
    if not steady:
        return (float("nan"),) * 4
    base = steady[0]
    return base, min(steady), max(steady), max(abs(v - base) for v in steady) / base


def memory_verdict(args: Any, deviation: float) -> str:
    """Judged only when the warm-up outlasts the longest conversation: before that, RSS
    still grows with the histories in flight (a short run measures its own ramp)."""
    longest = args.max_turns * (args.min_tokens + args.max_tokens) / 2 / args.rate
    if args.warmup < longest:
        return f"not judged: warm-up {args.warmup:g} s < longest conversation {longest:.0f} s"
    return verdict(deviation <= FLAT) + f" ({deviation:.1%})"


def figures(result: Any) -> list[Row]:
    args, tally, store = result.args, result.tally, result.store
    errors = sum(tally.errors.values())
    turns = len(tally.completed)
    base, low, high, deviation = memory(result)
    steady_turns = turns - next((s.turns for s in result.samples if s.t >= args.warmup), 0)
    tokens_per_turn = store["tokens"] / max(1, store["statuses"].get("ok", 0))
    turn_p50 = pct(tally.turn_s, 50)
    lag, idle = result.lag, result.idle_lag
    target_turns = TURNS_TARGET * args.duration / 600
    return [
        Row("errors (HTTP, error events, broken streams)", f"{errors}", "", "0",
            verdict(errors == 0)),
        Row("turns completed by the clients", f"{turns:,}",
            f"{turns / result.wall:.1f} turns/s over {result.wall:.0f} s",
            f"≥ {target_turns:,.0f}", verdict(turns >= target_turns)),
        Row("lost turns (completed, no ok turn stored)", f"{store['lost']}",
            f"{store['rows']:,} turns stored", "0", verdict(store["lost"] == 0)),
        Row("duplicated turns (reply id stored twice, or more turns than requests)",
            f"{store['duplicated'] + store['beyond_sent']}", "", "0",
            verdict(store["duplicated"] + store["beyond_sent"] == 0)),
        Row("store integrity_check", store["integrity"], _statuses(store["statuses"]), "ok",
            verdict(store["integrity"] == "ok")),
        Row("proxy RSS after warm-up (min / max)", f"{low:.1f} / {high:.1f} MiB",
            f"{base:.1f} MiB at warm-up end ({args.warmup:g} s)",
            f"within {FLAT:.0%} over {steady_turns:,} turns", memory_verdict(args, deviation)),
        Row("event-loop lag p99 (p50, max)",
            f"{lag['p99_ms']:.1f} ms ({lag['p50_ms']:.1f}, {lag['max_ms']:.0f})",
            f"idle proxy {idle['p99_ms']:.1f} ms ({idle['p50_ms']:.1f}, {idle['max_ms']:.0f})",
            "reported", ""),
        Row("turn time mean (p50, p99)", f"{statistics.fmean(tally.turn_s or [math.nan]):.2f} s "
            f"({turn_p50:.2f}, {pct(tally.turn_s, 99):.2f})",
            f"engine pace {(tokens_per_turn - 1) / args.rate:.2f} s "
            f"({tokens_per_turn:.0f} tokens at {args.rate:g}/s)", "", ""),
        Row("time to first token p50 (p99)",
            f"{pct(tally.ttft, 50) * 1000:.0f} ms ({pct(tally.ttft, 99) * 1000:.0f})",
            "engine: first token at once", "", ""),
        Row("tokens streamed", f"{store['tokens'] / result.wall:,.0f} tokens/s",
            f"{args.streams} streams x {args.rate:g} = {args.streams * args.rate:,.0f} "
            "tokens/s ceiling", "", ""),
        Row("CPU (% of one core, mean)", f"proxy {_mean_cpu(result, 'proxy_cpu'):.0f}%",
            f"load generator {_mean_cpu(result, 'client_cpu'):.0f}%", "", ""),
        Row("proxy's event-loop thread runnable but waiting for a CPU",
            f"{_mean_cpu(result, 'cpu_wait'):.1f}% of the time",
            "the 2 cores are shared: this part of the lag is the box's", "", ""),
        *_soak(result),
    ]


def _soak(result: Any) -> list[Row]:
    """`--calls N`: the proxy's RSS at the first sample with 1,000, 2,000, ... calls done."""
    calls = result.args.calls
    if not calls:
        return []
    marks = []
    for mark in range(1000, calls + 1, 1000):
        got = next((s for s in result.samples if s.turns >= mark), None)
        if got is not None:
            marks.append(f"{mark:,}: {got.rss:.1f}")
    first = result.samples[0].rss if result.samples else math.nan
    proxy = f"release at {result.args.release}" if result.args.release else "this checkout"
    return [Row("soak: proxy RSS (MiB) at N calls", "; ".join(marks),
                f"{first:.1f} MiB at the first sample; proxy from {proxy}", "flat", "")]


def _mean_cpu(result: Any, name: str) -> float:
    values = [v for s in result.samples if not math.isnan(v := getattr(s, name))]
    return statistics.fmean(values) if values else float("nan")


def _statuses(statuses: dict[str, int]) -> str:
    return "statuses " + ", ".join(f"{k} {v:,}" for k, v in sorted(statuses.items()))


def render(result: Any, command: str, system_words: int) -> str:
    args = result.args
    lines = [f"# Load: {args.streams} concurrent streaming rollouts, four dialects "
             f"({time.strftime('%Y-%m-%d %H:%M')})", "", f"Command: `{command}`", "",
             machine_line(), "",
             f"Workload: {args.streams} streams split evenly over chat, responses, anthropic "
             f"and gemini, raw aiohttp SSE clients in a separate process; conversations of "
             f"{args.min_turns}-{args.max_turns} turns that resend the growing history (a "
             f"{system_words}-word system prompt, every reply), then a new rollout; "
             f"scripted engine at {args.rate:g} tokens/s per stream, replies of "
             f"{args.min_tokens}-{args.max_tokens} tokens; {args.duration:g} s of load, "
             f"warm-up {args.warmup:g} s.", "",
             f"Also running on the machine meanwhile: {result.others}; load {result.loadavg}; "
             f"the whole machine was {result.busy:.0f}% busy (of "
             f"{100 * (os.cpu_count() or 1)}%), of which the proxy "
             f"{_mean_cpu(result, 'proxy_cpu'):.0f}% and the load generator "
             f"{_mean_cpu(result, 'client_cpu'):.0f}%.",
             "", *figure_table(figures(result)), ""]
    if result.tally.error_samples:
        lines += ["Errors seen:", "", *[f"- `{e}`" for e in result.tally.error_samples], ""]
    lines += ["## Proxy memory over time", "",
              *md_table(("s", "turns", "RSS MiB", "proxy CPU %", "load generator CPU %",
                         "proxy waiting for a CPU %"),
                        [(f"{s.t:.0f}", f"{s.turns:,}", f"{s.rss:.1f}", f"{s.proxy_cpu:.0f}",
                          f"{s.client_cpu:.0f}", f"{s.cpu_wait:.1f}")
                         for s in thin(result.samples, 24)]), "",
              "Lag is measured inside the proxy process by a task that sleeps 10 ms and "
              "records how late it wakes (bench/proxy/load_server.py). Memory is VmRSS of the "
              "proxy process, sampled every "
              f"{args.sample_every:g} s. Lost and duplicated turns are checked against the "
              "store after the proxy stopped: each request the client saw complete must "
              "have exactly one `ok` turn with its reply id."]
    return "\n".join(lines) + "\n"


def thin(samples: Sequence[Any], most: int) -> list[Any]:
    if len(samples) <= most:
        return list(samples)
    step = (len(samples) - 1) / (most - 1)
    return [samples[round(i * step)] for i in range(most)]
