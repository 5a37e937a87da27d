"""The one command line: `harnessrl serve | export | demo`.

Every component's configuration is read here and passed down as plain values.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import signal
import sys
from pathlib import Path
from typing import Any

DEFAULT_RUN_DIR = Path("runs/default")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harnessrl", description=__doc__)
    sub = parser.add_subparsers()
    _serve_parser(sub.add_parser("serve", help="run the capture proxy"))
    export = sub.add_parser("export", help="write a run's turns or rollouts as JSONL/Parquet")
    export.add_argument("run_dir", type=Path)
    export.add_argument("--what", choices=["turns", "rollouts"], default="turns")
    export.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    export.add_argument("-o", "--out", type=Path, required=True)
    export.set_defaults(func=_export)
    report = sub.add_parser("report", help="chains per rollout and harness: extension rate "
                                           "and why chains broke")
    report.add_argument("run_dir", type=Path)
    report.set_defaults(func=_report)
    demo = sub.add_parser("demo", help="the embedded default: vLLM + proxy + one captured call")
    demo.add_argument("--run-dir", type=Path, default=Path("runs/demo"))
    demo.add_argument("--model", help="a local model directory (default: SmolLM2-135M)")
    demo.set_defaults(func=_demo)
    return parser


def _serve_parser(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--tool-call-parser")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--dtype")
    p.add_argument("--vllm-arg", action="append", default=[], help="extra vLLM flag (repeat)")
    p.add_argument("--vllm-log", type=Path)
    p.add_argument("--engine-timeout", type=float, default=600.0,
                   help="seconds the engine may stay silent before the call fails")
    p.add_argument("--temperature", type=float, help="override the harness's temperature")
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--unset-sampling", nargs="*", default=[],
                   help="sampling fields to drop from harness requests (e.g. top_p)")
    p.add_argument("--strict-model", action="store_true",
                   help="reject model names the engine does not serve (default: map them)")
    p.add_argument("--max-body-mb", type=float, default=32.0)
    p.add_argument("--admin-token", help="required on /rollouts endpoints (and for non-loopback"
                                         " binds)")
    p.set_defaults(func=_serve)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _serve(args: argparse.Namespace) -> int:
    if not _is_loopback(args.host) and not args.admin_token:
        print("harnessrl: binding to a non-loopback address needs --admin-token",
              file=sys.stderr)
        return 2
    # uvicorn re-raises SIGTERM after its shutdown; as SystemExit it unwinds through the
    # `finally` below, so a managed vLLM is stopped instead of orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    server = None
    if args.model:
        from harnessrl.proxy.engines.managed import VLLMServer

        server = VLLMServer(model=args.model, served_name=args.served_model_name,
                            tool_call_parser=args.tool_call_parser,
                            max_model_len=args.max_model_len, dtype=args.dtype,
                            extra_args=args.vllm_arg, log_path=args.vllm_log)
        print(f"starting vLLM for {args.model} ...", file=sys.stderr)
        args.engine_url = server.start()
    try:
        from harnessrl.proxy.serve import run

        run(_run_proxy(args))
    finally:
        if server is not None:
            server.stop()
    return 0


def build_proxy(args: argparse.Namespace) -> Any:
    from harnessrl.proxy.app import Proxy, ProxyConfig
    from harnessrl.proxy.sessions import Sessions
    from harnessrl.proxy.store import TraceStore
    from harnessrl.types import Sampling

    sampling = Sampling(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    sessions = Sessions(TraceStore(args.run_dir),
                        sampling=sampling if sampling != Sampling() else None,
                        unset_sampling=frozenset(args.unset_sampling))
    config = ProxyConfig(max_body_bytes=int(args.max_body_mb * 1024 * 1024),
                         strict_model=args.strict_model, admin_token=args.admin_token)
    return Proxy(_engine(args), sessions, config)


def _engine(args: argparse.Namespace) -> Any:
    if args.scripted:
        from transformers import AutoTokenizer

        from harnessrl.proxy.engines.scripted import ScriptedEngine, replay

        if args.script is None:
            raise SystemExit("--scripted needs --script FILE (a JSON list of replies)")
        replies = json.loads(args.script.read_text())
        return ScriptedEngine(AutoTokenizer.from_pretrained(args.scripted), replay(replies),
                              model=args.served_model_name or "scripted",
                              token_delay=args.token_delay)
    from harnessrl.proxy.engines.vllm import VLLMEngine

    return VLLMEngine(args.engine_url, read_timeout=args.engine_timeout)


async def _run_proxy(args: argparse.Namespace) -> None:
    import uvicorn

    from harnessrl.proxy.serve import config

    proxy = build_proxy(args)
    print(f"harnessrl proxy on http://{args.host}:{args.port} (store: "
          f"{proxy.store.path})", file=sys.stderr, flush=True)
    try:
        await uvicorn.Server(config(proxy.app(), args.host, args.port)).serve()
    finally:
        proxy.store.close()


def _export(args: argparse.Namespace) -> int:
    from harnessrl.train.export import export

    count = export(args.run_dir, args.out, what=args.what, fmt=args.format)
    print(f"wrote {count} {args.what} to {args.out}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from harnessrl.proxy.store import TraceStore
    from harnessrl.train.samples import render_report, report

    if not (args.run_dir / "trace.db").is_file():
        print(f"harnessrl: no trace store in {args.run_dir}", file=sys.stderr)
        return 2
    store = TraceStore(args.run_dir)
    try:
        Console().print(render_report(report(store)))
    finally:
        store.close()
    return 0


def _demo(args: argparse.Namespace) -> int:
    from harnessrl.demo import run_demo

    return run_demo(args.run_dir, model=args.model)


if __name__ == "__main__":
    sys.exit(main())
