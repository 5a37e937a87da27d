"""The one command line: `harnessrl serve | run | eval | train | export | report | ui |
demo | harness list|install|doctor | conformance`.

Every component's configuration is read here and passed down as plain values.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from harnessrl.harnesses.base import DEFAULT_TOOLS_DIR

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
    export.add_argument("--sft", choices=["tokens", "messages"],
                        help="instead: solved rollouts as an SFT dataset (Parquet): exact ids "
                             "with assistant_masks, or conversations for a student's template")
    export.add_argument("--min-reward", type=float, default=1.0,
                        help="--sft: verifier reward a rollout needs to count as solved")
    export.add_argument("--chains", choices=["main", "all"], default="main",
                        help="--sft tokens: each solved rollout's main chain, or every chain")
    export.set_defaults(func=_export)
    train = sub.add_parser("train", help="GRPO on real harness rollouts, from one config file")
    train.add_argument("--config", type=Path, required=True, help="TOML or YAML (see "
                                                                  "examples/train.toml)")
    train.add_argument("--run-dir", type=Path, help="overrides the config's run_dir")
    train.add_argument("--steps", type=int, help="overrides the config's grpo.steps")
    train.set_defaults(func=_train)
    _harness_parsers(sub)
    _run_parser(sub.add_parser("run", help="harnesses on tasks through the proxy, scored by "
                                          "the tasks' verifiers"))
    evaluation = sub.add_parser("eval", help="the same model across harnesses: pass rate, "
                                             "pass@k, cost per solved task (md, csv, png)")
    _run_parser(evaluation)
    evaluation.add_argument("--out", type=Path, help="where eval.md/.csv/.png go "
                                                     "(default: RUN_DIR/eval)")
    evaluation.set_defaults(func=_eval)
    report = sub.add_parser("report", help="chains per rollout and harness: extension rate "
                                           "and why chains broke")
    report.add_argument("run_dir", type=Path)
    report.set_defaults(func=_report)
    ui = sub.add_parser("ui", help="the trace viewer: a web page over runs, rollouts and tokens")
    ui.add_argument("run_dir", type=Path, nargs="?", default=DEFAULT_RUN_DIR.parent,
                    help="a run directory, or a directory of them (default: runs)")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=8200)
    ui.add_argument("--tokenizer", help="tokenizer (model dir or hub id) to show ids as text "
                                        "(default: the run's model, if a local directory)")
    ui.set_defaults(func=_ui)
    demo = sub.add_parser("demo", help="the embedded default: SmolLM2 on vLLM, mini-swe-agent "
                                         "on bundled tasks through the proxy, two GRPO steps")
    demo.add_argument("--run-dir", type=Path, default=Path("runs/demo"))
    demo.add_argument("--model", help="a local model directory (default: SmolLM2-135M)")
    demo.set_defaults(func=_demo)
    return parser


def _harness_parsers(sub: Any) -> None:
    harness = sub.add_parser("harness", help="the real harnesses: list, install, doctor")
    actions = harness.add_subparsers()
    listing = actions.add_parser("list", help="known harnesses and whether installed")
    listing.set_defaults(func=_harness_list)
    install = actions.add_parser("install", help="install pinned harnesses (all if none)")
    install.add_argument("names", nargs="*")
    install.set_defaults(func=_harness_install)
    doctor = actions.add_parser("doctor", help="run one harness against the proxy and say "
                                               "what works")
    doctor.add_argument("names", nargs="+")
    doctor.set_defaults(func=_conformance, markdown=None, mode="chat,token")
    for p in (listing, install, doctor):
        p.add_argument("--tools-dir", type=Path, default=DEFAULT_TOOLS_DIR)
    conformance = sub.add_parser("conformance", help="every harness writes a file through "
                                                     "the proxy; print the matrix")
    conformance.add_argument("names", nargs="*")
    conformance.add_argument("--tools-dir", type=Path, default=DEFAULT_TOOLS_DIR)
    conformance.add_argument("--markdown", type=Path, help="also write the matrix here")
    conformance.add_argument("--mode", default="chat,token",
                             help="chat (the scripted chat engine), token (the proxy's token "
                                  "mode against a scripted completions server), or both, "
                                  "comma-separated")
    conformance.set_defaults(func=_conformance)


def _run_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--harness", required=True, help="one or more, comma-separated")
    p.add_argument("--tasks", required=True, help="a task dir, a .jsonl file, or bundled[:...]")
    p.add_argument("-k", "--samples", type=int, default=1, help="rollouts per task and harness")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--retries", type=int, default=2, help="retries of infrastructure failures")
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    p.add_argument("--tools-dir", type=Path, default=DEFAULT_TOOLS_DIR)
    p.add_argument("--network", choices=["host", "none", "loopback-proxy"], default="host",
                   help="local sandbox: loopback-proxy lets the agent reach only the proxy")
    p.add_argument("--sandbox", choices=["local", "docker"], default="local")
    p.add_argument("--no-hide", action="store_true",
                   help="local sandbox: do not hide the tasks' tests and other rollouts' "
                        "files from the agent, nor keep its writes inside its sandbox "
                        "(both need root for a mount namespace)")
    p.add_argument("--image", help="docker sandbox: this image for every task (default: each "
                                   "task's own, built from its environment/Dockerfile)")
    p.add_argument("--agent-timeout", type=float, metavar="SECONDS",
                   help="cap every task's own agent deadline")
    p.add_argument("--cluster", choices=["ray"],
                   help="run the rollouts across the nodes of a Ray cluster (extra "
                        "harnessrl[ray]): a capture-proxy shard per node")
    p.add_argument("--ray-address", help="--cluster ray: the cluster to join (e.g. "
                                         "host:6379, auto); default: a local Ray")
    p.add_argument("--slots-per-node", type=int,
                   help="--cluster ray: rollouts at once per node (default: the node's "
                        "harness_slots resource, else --concurrency)")
    engine = p.add_mutually_exclusive_group(required=True)
    engine.add_argument("--engine-url", help="a running vLLM server, or several "
                                             "comma-separated (each rollout sticks to one)")
    engine.add_argument("--model", help="start vLLM for this model")
    engine.add_argument("--oracle", action="store_true",
                        help="a scripted engine that runs each task's reference solution "
                             "through the harness (checks the pipeline end to end)")
    engine.add_argument("--teacher", metavar="API_BASE",
                        help="any OpenAI-compatible endpoint (its /v1 root): text only, no "
                             "token ids; for `export --sft messages` (distillation)")
    p.add_argument("--teacher-model", help="--teacher: the model name every call is sent with")
    p.add_argument("--teacher-key-env", metavar="VAR",
                   help="--teacher: the environment variable holding its API key")
    p.add_argument("--fewer-tool-calls", type=float, default=0.0,
                   help="shaping: bonus weight for passing with fewer tool calls")
    p.add_argument("--fewer-tokens", type=float, default=0.0,
                   help="shaping: bonus weight for passing with fewer sampled tokens")
    p.add_argument("--tool-call-bonus", type=float, default=0.0, metavar="W",
                   help="shaping: the reference's form, a passing reward times "
                        "(1 + W*B/(B + tool calls)), B = --tool-call-budget")
    p.add_argument("--tool-call-budget", type=_at_least_one, default=20, metavar="B",
                   help="shaping: tool calls at which --fewer-tool-calls reaches 0 and "
                        "--tool-call-bonus halves (default 20)")
    p.add_argument("--max-model-calls", type=_at_least_one, metavar="N",
                   help="each rollout's step cap: the call after N is refused and the "
                        "rollout is scored as it stands, marked capped")
    p.add_argument("--shaping", action="append", default=[], metavar="MODULE:FUNCTION",
                   help="a custom shaping term f(verdict, stats) -> float (repeat)")
    p.add_argument("--temperature", type=float, help="override the harnesses' temperature")
    p.add_argument("--max-tokens", type=int, help="override the harnesses' max tokens per call")
    p.set_defaults(func=_run)


def _execute_run(args: argparse.Namespace) -> list[Any]:
    from harnessrl.rollout.rewards import Shaping, load_term
    from harnessrl.rollout.run import execute, oracle_engine
    from harnessrl.rollout.runner import RolloutSettings, RunConfig
    from harnessrl.rollout.tasks import load_tasks
    from harnessrl.types import Sampling

    tasks = load_tasks(args.tasks)
    shaping = Shaping(fewer_tool_calls=args.fewer_tool_calls, fewer_tokens=args.fewer_tokens,
                      tool_call_bonus=args.tool_call_bonus,
                      tool_call_budget=args.tool_call_budget,
                      custom=dict(load_term(spec) for spec in args.shaping))
    settings = RolloutSettings(concurrency=args.concurrency, retries=args.retries,
                               tools_dir=str(args.tools_dir), network=args.network,
                               sandbox=args.sandbox, image=args.image,
                               hide_host=not args.no_hide, agent_timeout=args.agent_timeout,
                               max_model_calls=args.max_model_calls)
    config = RunConfig(harnesses=_harnesses(args.harness.split(",")), tasks=tasks,
                       samples=args.samples, settings=settings, shaping=shaping)
    sampling = Sampling(temperature=args.temperature, max_tokens=args.max_tokens)
    sampling = None if sampling == Sampling() else sampling
    if args.cluster:
        return _execute_on_cluster(args, config, sampling)
    if args.oracle:
        return execute(config, oracle_engine(tasks, config.harnesses), args.run_dir,
                       sampling=sampling)
    from harnessrl.proxy.engines.build import built, make
    from harnessrl.rollout.cluster_engines import routed

    urls = (args.engine_url or "").split(",")
    if len(urls) > 1:
        from dataclasses import replace

        spec = _run_engine_spec(args)
        engine = routed([make(replace(spec, url=url)) for url in urls])
        return execute(config, engine, args.run_dir, sampling=sampling)
    with built(_run_engine_spec(args)) as engine:
        return execute(config, engine.engine, args.run_dir, sampling=sampling)


def _execute_on_cluster(args: argparse.Namespace, config: Any, sampling: Any) -> list[Any]:
    """`--cluster ray`: each node builds its shard's engine(s) from specs (a vLLM started
    for --model runs here, on the driver's machine, and the nodes call it by URL)."""
    import functools
    from dataclasses import replace

    from harnessrl.proxy.engines.build import built
    from harnessrl.rollout.cluster import ClusterSettings
    from harnessrl.rollout.cluster_run import engines_from, execute_on_cluster
    from harnessrl.rollout.run import oracle_engine

    cluster = ClusterSettings(address=args.ray_address, slots_per_node=args.slots_per_node)
    if args.oracle:
        factory = functools.partial(oracle_engine, config.tasks, config.harnesses)
        return execute_on_cluster(config, factory, args.run_dir, cluster, sampling=sampling)
    spec = _run_engine_spec(args)
    with built(spec) as engine:
        urls = (engine.url or spec.url or "").split(",")
        specs = [replace(spec, url=url, model=None if url else spec.model) for url in urls]
        factory = functools.partial(engines_from, specs)
        return execute_on_cluster(config, factory, args.run_dir, cluster, sampling=sampling)


def _run_engine_spec(args: argparse.Namespace) -> Any:
    """`run`/`eval`: a teacher, a running vLLM, or one started for --model."""
    import os

    from harnessrl.proxy.engines.build import EngineSpec

    if args.teacher:
        key = os.environ.get(args.teacher_key_env) if args.teacher_key_env else None
        return EngineSpec(kind="teacher", url=args.teacher, teacher_model=args.teacher_model,
                          api_key=key)
    return EngineSpec(url=args.engine_url, model=args.model,
                      vllm_log=args.run_dir / "vllm.log")


def _run(args: argparse.Namespace) -> int:
    outcomes = _execute_run(args)
    if args.oracle and _report_broken(outcomes):
        return 1
    return 0 if all(o.status == "done" for o in outcomes) else 1


def _report_broken(outcomes: list[Any]) -> bool:
    """--oracle: every rollout that did not pass is a broken pipeline, said so (exit 1)."""
    from rich.console import Console

    from harnessrl.rollout.run import broken_pipeline

    problems = broken_pipeline(outcomes)
    console = Console(stderr=True)
    for problem in problems:
        console.print(f"[bold red]broken pipeline[/]: {problem}", markup=True,
                      highlight=False)
    return bool(problems)


def _eval(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markdown import Markdown

    from harnessrl.rollout.evaluate import evaluate, markdown, write_all

    outcomes = _execute_run(args)
    rows = evaluate(outcomes, args.samples)
    paths = write_all(rows, args.out or args.run_dir / "eval")
    Console().print(Markdown(markdown(rows)))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 1 if args.oracle and _report_broken(outcomes) else 0


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
    p.add_argument("--engine-mode", choices=["chat", "token"], default="chat",
                   help="chat: vLLM renders the chat template and parses tool calls; token: "
                        "the proxy renders with the model's tokenizer, reuses a rollout's "
                        "earlier token ids, and parses replies itself")
    p.add_argument("--tokenizer", help="token mode: the model's local directory (default: "
                                       "--model)")
    p.add_argument("--chat-template", type=Path, help="token mode: a Jinja chat template file "
                                                      "instead of the tokenizer's")
    p.add_argument("--tool-call-parser")
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
    p.add_argument("--stream-interval-ms", type=_interval_ms, default=0.0, metavar="MS",
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
    p.add_argument("--max-model-calls", type=_at_least_one, metavar="N",
                   help="every rollout's step cap (POST /rollouts may set its own): the call "
                        "after N is refused in the harness's dialect, and recorded")
    p.add_argument("--workers", type=_at_least_one, default=len(os.sched_getaffinity(0)),
                   metavar="N",
                   help="proxy processes sharing the port, each rollout served by one "
                        "(default: the machine's cores); 1: a single process")
    p.set_defaults(func=_serve)


def _interval_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"milliseconds from 0 to 1000, got {text!r}")
    return value


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer of at least 1, got {text!r}")
    return value


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
        tool_call_parser=args.tool_call_parser,
        chat_template=args.chat_template.read_text() if args.chat_template else None,
        served_name=args.served_model_name, max_model_len=args.max_model_len,
        dtype=args.dtype, vllm_args=tuple(args.vllm_arg), vllm_log=args.vllm_log, **timeouts)


async def _run_proxy(args: argparse.Namespace, engine: Any) -> None:
    from harnessrl.proxy.serve import serve

    proxy = build_proxy(args, engine)
    print(f"harnessrl proxy on http://{args.host}:{args.port} (store: "
          f"{proxy.store.path})", file=sys.stderr, flush=True)
    await serve(proxy, args.host, args.port)


def _export(args: argparse.Namespace) -> int:
    from harnessrl.train.export import export

    if args.sft:
        return _export_sft(args)
    count = export(args.run_dir, args.out, what=args.what, fmt=args.format)
    print(f"wrote {count} {args.what} to {args.out}")
    return 0


def _export_sft(args: argparse.Namespace) -> int:
    from harnessrl.train.sft import RETOKENIZED_NOTE, export_sft

    result = export_sft(args.run_dir, args.out, kind=args.sft, min_reward=args.min_reward,
                        chains=args.chains)
    skipped = ", ".join(f"{why}: {n}" for why, n in result.skipped.items())
    print(f"wrote {result.rows} SFT rows ({args.sft}) from {result.rollouts} solved rollouts "
          f"to {result.path}" + (f"; solved rollouts left out ({skipped})" if skipped else ""))
    if result.retokenized:
        print(RETOKENIZED_NOTE)
    return 0


def _train(args: argparse.Namespace) -> int:
    import msgspec

    from harnessrl.train.config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except (ConfigError, OSError) as exc:
        print(f"harnessrl: {exc}", file=sys.stderr)
        return 2
    if args.run_dir is not None:
        config = msgspec.structs.replace(config, run_dir=str(args.run_dir))
    if args.steps is not None:
        config = msgspec.structs.replace(
            config, grpo=msgspec.structs.replace(config.grpo, steps=args.steps))
    from harnessrl.train.loop import train

    train(config)
    return 0


def _harnesses(names: list[str]) -> list[Any]:
    from harnessrl.harnesses import all_harnesses, get

    return [get(n) for n in names] if names else all_harnesses()


def _harness_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from harnessrl.harnesses import variants_of

    table = Table("harness", "version", "dialects", "from", "runtime", "streams",
                  "installed")
    for h in _harnesses([]):
        # the harness's own dialect first, then each variant's (`name@variant`)
        dialects = ", ".join(v.dialect for v in variants_of(h.name))
        runtime = h.runtime or ("node (PATH)" if h.registry == "npm" and not h.entry
                                else "none" if h.entry else f"python {h.python}")
        table.add_row(h.name, h.version, dialects, h.registry, runtime,
                      "yes" if h.streams else "no",
                      "yes" if h.installed(args.tools_dir) else "no")
    Console().print(table)
    return 0


def _harness_install(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    for h in _harnesses(args.names):
        with console.status(f"installing {h.name} {h.version}"):
            h.install(args.tools_dir, log=lambda line: console.log(line))
        console.print(f"[green]ok[/] {h.name} {h.version} -> {h.executable(args.tools_dir)}")
    return 0


def _conformance(args: argparse.Namespace) -> int:
    import tempfile

    from rich.console import Console
    from rich.markdown import Markdown

    from harnessrl.harnesses import all_variants
    from harnessrl.rollout.conformance import (
        MODES,
        check,
        install_timed,
        matrix_markdown,
        policy_tokenizer,
    )

    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        print(f"harnessrl: --mode takes {', '.join(MODES)} (comma-separated), not "
              f"{args.mode!r}", file=sys.stderr)
        return 2
    console = Console()
    tokenizer = policy_tokenizer()
    results = []
    # every harness and each of its dialect variants, unless names are given
    for h in _harnesses(args.names) if args.names else all_variants():
        with console.status(f"{h.name}: installing (if not yet installed)"):
            install_seconds = install_timed(h, args.tools_dir)
        for mode in modes:
            with console.status(f"{h.name}: running headless ({mode} mode)"), \
                    tempfile.TemporaryDirectory(prefix=f"hrl-{h.slug}-") as root:
                result = asyncio.run(check(h, tokenizer=tokenizer, tools_dir=args.tools_dir,
                                           root=Path(root), mode=mode))
            result.install_seconds, install_seconds = install_seconds, None
            results.append(result)
            mark = ("[green]PASS[/]" if result.passed
                    else f"[red]FAIL[/] {'; '.join(result.problems)}")
            console.print(f"{h.name} {h.version} ({mode} mode): {mark}")
            if not result.passed:
                console.print(result.output[-2000:], markup=False, highlight=False)
    matrix = matrix_markdown(results)
    console.print(Markdown(matrix))
    if args.markdown:
        args.markdown.write_text(matrix)
    return 0 if all(r.passed for r in results) else 1


def _report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from harnessrl.proxy.store import TraceReader
    from harnessrl.reports import render_report
    from harnessrl.rollout.chains import report

    if not (args.run_dir / "trace.db").is_file():
        print(f"harnessrl: no trace store in {args.run_dir}", file=sys.stderr)
        return 2
    with TraceReader(args.run_dir) as store:
        Console().print(render_report(report(store)))
    return 0


def _ui(args: argparse.Namespace) -> int:
    from harnessrl.ui.app import serve

    if not _is_loopback(args.host):
        print(f"harnessrl: the viewer shows every trace to anyone who can reach "
              f"{args.host}:{args.port}", file=sys.stderr)
    serve(args.run_dir, host=args.host, port=args.port, tokenizer=args.tokenizer)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from harnessrl.demo import run_demo

    return run_demo(args.run_dir, model=args.model)


if __name__ == "__main__":
    sys.exit(main())
