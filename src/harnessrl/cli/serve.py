"""`harnessrl serve`: the capture proxy in front of an engine (one process, or --workers N)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from harnessrl.cli.common import (
    DEFAULT_RUN_DIR,
    add_format_arguments,
    at_least_one,
    format_settings,
    interval_ms,
    is_loopback,
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the capture proxy")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR,
                   help="where the trace store (trace.db) lives")
    engine = p.add_mutually_exclusive_group(required=True)
    engine.add_argument("--engine-url", help="a running vLLM server (OpenAI API root)")
    engine.add_argument("--model", help="start vLLM for this model (local path or hub id)")
    engine.add_argument("--scripted", metavar="TOKENIZER_DIR",
                        help="the scripted test engine, with this tokenizer")
    p.add_argument("--script", type=Path, help="scripted engine: JSON list of reply texts")
    p.add_argument("--token-delay", type=float, default=0.0, help="scripted engine: s/token")
    p.add_argument("--served-model-name")
    add_format_arguments(p)
    p.add_argument("--tokenizer", help="token mode: the model's local directory (default: "
                                       "--model)")
    p.add_argument("--chat-template", type=Path, help="token mode: a Jinja chat template file "
                                                      "instead of the tokenizer's")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--dtype")
    p.add_argument("--vllm-arg", action="append", default=[], help="extra vLLM flag (repeat)")
    p.add_argument("--vllm-log", type=Path)
    p.add_argument("--engine-timeout", type=float, default=600.0,
                   help="seconds the engine may stay silent once it has begun to answer "
                        "(the generation limit)")
    p.add_argument("--engine-first-byte-timeout", type=float, default=30.0,
                   help="seconds the engine may stay silent before it begins to answer; "
                        "then it must answer GET /health (within 10 s) or the call fails")
    p.add_argument("--stream-interval-ms", type=interval_ms, default=0.0, metavar="MS",
                   help="read a streamed answer from the engine at most once per MS "
                        "milliseconds after its first token: the tokens of an interval go "
                        "on together, for a fraction of the CPU per token, and the last one "
                        "may wait up to MS (default 0: each as it arrives)")
    p.add_argument("--temperature", type=float, help="override the harness's temperature")
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--max-tokens", type=int, help="override the harness's max tokens per call")
    p.add_argument("--unset-sampling", nargs="*", default=[],
                   help="sampling fields to drop from harness requests (e.g. top_p)")
    p.add_argument("--strict-model", action="store_true",
                   help="reject model names the engine does not serve (default: map them)")
    p.add_argument("--max-body-mb", type=float, default=32.0)
    p.add_argument("--admin-token", help="required on /rollouts endpoints (and for non-loopback"
                                         " binds)")
    p.add_argument("--max-model-calls", type=at_least_one, metavar="N",
                   help="every rollout's step cap (POST /rollouts may set its own): the call "
                        "after N is refused in the harness's dialect, and recorded")
    p.add_argument("--workers", type=at_least_one, default=len(os.sched_getaffinity(0)),
                   metavar="N",
                   help="proxy processes sharing the port, each rollout served by one "
                        "(default: the machine's cores); 1: a single process")
    p.set_defaults(func=serve)


def serve(args: argparse.Namespace) -> int:
    if not is_loopback(args.host) and not args.admin_token:
        print("harnessrl: binding to a non-loopback address needs --admin-token",
              file=sys.stderr)
        return 2
    # uvicorn re-raises SIGTERM after its shutdown; as SystemExit it unwinds through the
    # `with` below, so a managed vLLM is stopped instead of orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.workers > 1:
        return _serve_workers(args)
    from harnessrl.proxy.engines.build import built
    from harnessrl.proxy.serve import run

    with built(engine_spec(args), status=_announce) as engine:
        run(_run_proxy(args, engine.engine))
    return 0


def _serve_workers(args: argparse.Namespace) -> int:
    """`serve --workers N`: vLLM (if this command starts it) once, here; N proxy processes
    on the port, each with its own engine client (proxy/workers.py)."""
    import dataclasses

    from harnessrl.proxy.engines.build import server_for
    from harnessrl.proxy.store import TraceReader
    from harnessrl.proxy.workers import Plan, supervise

    spec = engine_spec(args)
    server = server_for(spec) if spec.managed else None
    try:
        if server is not None:
            print(f"starting vLLM for {spec.model} ...", file=sys.stderr)
            spec = dataclasses.replace(spec, url=server.start())
        args.run_dir.mkdir(parents=True, exist_ok=True)
        TraceReader(args.run_dir).close()  # the schema brought up to date once, not N times
        plan = Plan.make(args.host, args.port, args.workers)
        print(f"harnessrl proxy on http://{args.host}:{args.port}, {plan.n} workers (their "
              f"own ports {', '.join(map(str, plan.private))}; store: "
              f"{args.run_dir / 'trace.db'})", file=sys.stderr, flush=True)
        return supervise(plan, _proxy_worker, (args, spec))
    finally:
        if server is not None:
            server.stop()


def _proxy_worker(plan: Any, index: int, args: argparse.Namespace, spec: Any) -> None:
    """One worker's process (spawned by `supervise`)."""
    from harnessrl.proxy.engines.build import make
    from harnessrl.proxy.relay import serve_worker
    from harnessrl.proxy.serve import run

    run(serve_worker(build_proxy(args, make(spec)), plan, index))


def _announce(message: str) -> contextlib.AbstractContextManager[None]:
    print(f"{message} ...", file=sys.stderr)
    return contextlib.nullcontext()


def build_proxy(args: argparse.Namespace, engine: Any) -> Any:
    from harnessrl.proxy.app import ProxyConfig
    from harnessrl.proxy.serve import build
    from harnessrl.types import Sampling

    sampling = Sampling(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                        max_tokens=args.max_tokens)
    config = ProxyConfig(max_body_bytes=int(args.max_body_mb * 1024 * 1024),
                         strict_model=args.strict_model, admin_token=args.admin_token)
    return build(engine, args.run_dir, sampling=sampling if sampling != Sampling()
                 else None, unset_sampling=frozenset(args.unset_sampling), config=config,
                 max_model_calls=args.max_model_calls)


def engine_spec(args: argparse.Namespace) -> Any:
    """`serve`: the engine its flags describe."""
    from harnessrl.proxy.engines.build import EngineSpec

    timeouts = {"read_timeout": args.engine_timeout,
                "first_byte_timeout": args.engine_first_byte_timeout,
                "stream_interval": args.stream_interval_ms / 1000}
    if args.scripted:
        if args.script is None:
            raise SystemExit("--scripted needs --script FILE (a JSON list of replies)")
        return EngineSpec(kind="scripted", tokenizer=args.scripted,
                          script=json.loads(args.script.read_text()),
                          served_name=args.served_model_name, token_delay=args.token_delay)
    if args.engine_mode == "token" and not (args.tokenizer or args.model):
        raise SystemExit("--engine-mode token needs --tokenizer DIR (or --model)")
    if args.engine_url and not args.engine_url.startswith(("http://", "https://")):
        raise SystemExit(f"--engine-url {args.engine_url!r} is not an http(s) URL, e.g. "
                         "http://127.0.0.1:8000")
    return EngineSpec(
        kind=args.engine_mode, url=args.engine_url, model=args.model, tokenizer=args.tokenizer,
        **format_settings(args),
        chat_template=args.chat_template.read_text() if args.chat_template else None,
        served_name=args.served_model_name, max_model_len=args.max_model_len,
        dtype=args.dtype, vllm_args=tuple(args.vllm_arg), vllm_log=args.vllm_log, **timeouts)


async def _run_proxy(args: argparse.Namespace, engine: Any) -> None:
    from harnessrl.proxy.serve import serve

    proxy = build_proxy(args, engine)
    print(f"harnessrl proxy on http://{args.host}:{args.port} (store: "
          f"{proxy.store.path})", file=sys.stderr, flush=True)
    await serve(proxy, args.host, args.port)
