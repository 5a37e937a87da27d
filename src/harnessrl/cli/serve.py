"""`harnessrl serve`: the capture proxy in front of an engine (one process, or --workers N)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from harnessrl.cli.common import (
    DEFAULT_RUN_DIR,
    FORMAT,
    SAMPLING_FLAGS,
    is_loopback,
    sampling_from_flags,
)
from harnessrl.settings import add_flags, at_least_one, from_flags

if TYPE_CHECKING:
    from harnessrl.proxy.app import Proxy
    from harnessrl.proxy.engines.base import Engine
    from harnessrl.proxy.engines.build import EngineSettings
    from harnessrl.proxy.workers import Plan

HELP = "run the capture proxy"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harnessrl.proxy.config import ProxySettings
    from harnessrl.proxy.engines.build import EngineSettings
    from harnessrl.types import Sampling

    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR,
                   help="where the trace store (trace.db) lives")
    engine = p.add_mutually_exclusive_group(required=True)
    add_flags(engine, EngineSettings, "url", "model")
    engine.add_argument("--scripted", metavar="TOKENIZER_DIR",
                        help="the scripted test engine, with this tokenizer")
    p.add_argument("--script", type=Path, help="scripted engine: JSON list of reply texts")
    add_flags(p, EngineSettings, "token_delay", "served_name", "kind", "tokenizer")
    add_flags(p, EngineSettings, *FORMAT, "max_model_len", "dtype", "vllm_args",
              "vllm_log", "read_timeout", "first_byte_timeout", "stream_interval")
    add_flags(p, Sampling, "temperature", "top_p", "top_k", "max_tokens", flags=SAMPLING_FLAGS)
    p.add_argument("--unset-sampling", nargs="*", default=[],
                   help="sampling fields to drop from harness requests (e.g. top_p)")
    add_flags(p, ProxySettings, "strict_model", "max_body_bytes", "admin_token")
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
    import msgspec

    from harnessrl.proxy.engines.build import server_for
    from harnessrl.proxy.workers import Plan, supervise
    from harnessrl.store.reader import TraceReader

    spec = engine_spec(args)
    server = server_for(spec) if spec.managed else None
    try:
        if server is not None:
            print(f"starting vLLM for {spec.model} ...", file=sys.stderr)
            spec = msgspec.structs.replace(spec, url=server.start())
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


def _proxy_worker(plan: Plan, index: int, args: argparse.Namespace, spec: EngineSettings) -> None:
    """One worker's process (spawned by `supervise`)."""
    from harnessrl.proxy.engines.build import make
    from harnessrl.proxy.relay import serve_worker
    from harnessrl.proxy.serve import run

    run(serve_worker(build_proxy(args, make(spec)), plan, index))


def _announce(message: str) -> contextlib.AbstractContextManager[None]:
    print(f"{message} ...", file=sys.stderr)
    return contextlib.nullcontext()


def build_proxy(args: argparse.Namespace, engine: Engine) -> Proxy:
    from harnessrl.proxy.config import ProxySettings
    from harnessrl.proxy.serve import build

    return build(engine, args.run_dir, sampling=sampling_from_flags(args),
                 unset_sampling=frozenset(args.unset_sampling),
                 config=from_flags(ProxySettings, args), max_model_calls=args.max_model_calls)


def engine_spec(args: argparse.Namespace) -> EngineSettings:
    """`serve`: the engine its flags describe."""
    from harnessrl.proxy.engines.build import EngineSettings

    if args.scripted:
        if args.script is None:
            raise SystemExit("--scripted needs --script FILE (a JSON list of replies)")
        return EngineSettings(kind="scripted", tokenizer=args.scripted,
                          script=json.loads(args.script.read_text()),
                          served_name=args.served_model_name, token_delay=args.token_delay)
    if args.engine_mode == "token" and not (args.tokenizer or args.model):
        raise SystemExit("--engine-mode token needs --tokenizer DIR (or --model)")
    from harnessrl.proxy.engines.build import split_urls

    for url in split_urls(args.engine_url or ""):  # several: routed, each rollout to one
        if not url.startswith(("http://", "https://")):
            raise SystemExit(f"--engine-url {url!r} is not an http(s) URL, e.g. "
                             "http://127.0.0.1:8000")
    if args.model is None:
        return from_flags(EngineSettings, args)
    from harnessrl.train.model_name import resolve_model

    # before vLLM starts: a name that cannot load ends here; vLLM's log is kept
    model = resolve_model(args.model, status=_announce)
    log = args.vllm_log
    if log is None:
        args.run_dir.mkdir(parents=True, exist_ok=True)
        log = args.run_dir / "vllm.log"
    return from_flags(EngineSettings, args, model=model, vllm_log=log)


async def _run_proxy(args: argparse.Namespace, engine: Engine) -> None:
    from harnessrl.proxy.serve import serve

    proxy = build_proxy(args, engine)
    print(f"harnessrl proxy on http://{args.host}:{args.port} (store: "
          f"{proxy.store.path})", file=sys.stderr, flush=True)
    await serve(proxy, args.host, args.port)
