"""`harnessrl run`: harnesses on tasks through the proxy, scored by the tasks' verifiers
(its flags and its execution are shared with `eval`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harnessrl.cli.common import (
    DEFAULT_RUN_DIR,
    add_format_arguments,
    at_least_one,
    format_settings,
    harnesses,
)
from harnessrl.cli.tasks import add_build_network
from harnessrl.harnesses.base import DEFAULT_TOOLS_DIR


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="harnesses on tasks through the proxy, scored by the "
                                   "tasks' verifiers")
    add_run_arguments(p)
    p.set_defaults(func=run)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
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
    add_build_network(p)
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
    engine.add_argument("--model", help="start vLLM for this model: a hub id, a model "
                                        "directory, a training run's RUN_DIR/model or one "
                                        "of its checkpoints")
    engine.add_argument("--oracle", action="store_true",
                        help="a scripted engine that runs each task's reference solution "
                             "through the harness (checks the pipeline end to end)")
    engine.add_argument("--teacher", metavar="API_BASE",
                        help="any OpenAI-compatible endpoint (its /v1 root): text only, no "
                             "token ids; for `export --sft messages` (distillation)")
    p.add_argument("--teacher-model", help="--teacher: the model name every call is sent with")
    p.add_argument("--tokenizer", help="--engine-mode token with --engine-url: the model's "
                                       "local directory (default: --model)")
    add_format_arguments(p)
    p.add_argument("--teacher-key-env", metavar="VAR",
                   help="--teacher: the environment variable holding its API key")
    p.add_argument("--fewer-tool-calls", type=float, default=0.0,
                   help="shaping: bonus weight for passing with fewer tool calls")
    p.add_argument("--fewer-tokens", type=float, default=0.0,
                   help="shaping: bonus weight for passing with fewer sampled tokens")
    p.add_argument("--tool-call-bonus", type=float, default=0.0, metavar="W",
                   help="shaping: the reference's form, a passing reward times "
                        "(1 + W*B/(B + tool calls)), B = --tool-call-budget")
    p.add_argument("--tool-call-budget", type=at_least_one, default=20, metavar="B",
                   help="shaping: tool calls at which --fewer-tool-calls reaches 0 and "
                        "--tool-call-bonus halves (default 20)")
    p.add_argument("--max-model-calls", type=at_least_one, metavar="N",
                   help="each rollout's step cap: the call after N is refused and the "
                        "rollout is scored as it stands, marked capped")
    p.add_argument("--shaping", action="append", default=[], metavar="MODULE:FUNCTION",
                   help="a custom shaping term f(verdict, stats) -> float (repeat)")
    p.add_argument("--temperature", type=float, help="override the harnesses' temperature")
    p.add_argument("--max-tokens", type=int, help="override the harnesses' max tokens per call")


def run(args: argparse.Namespace) -> int:
    outcomes = execute_run(args)
    if args.oracle and report_broken(outcomes):
        return 1
    return 0 if all(o.status == "done" for o in outcomes) else 1


def execute_run(args: argparse.Namespace) -> list[Any]:
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
                               build_network=args.build_network,
                               hide_host=not args.no_hide, agent_timeout=args.agent_timeout,
                               max_model_calls=args.max_model_calls)
    config = RunConfig(harnesses=harnesses(args.harness.split(",")), tasks=tasks,
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
    model = args.model
    if model is not None and Path(model).is_dir():
        import sys

        from harnessrl.train.checkpoint import CheckpointError, model_dir_of

        try:
            model = str(model_dir_of(Path(model)))  # a checkpoint only when it is whole
        except CheckpointError as exc:
            print(f"harnessrl: --model: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    if model is not None:  # vLLM's log goes into the run directory, new or not
        args.run_dir.mkdir(parents=True, exist_ok=True)
    if args.engine_mode == "token" and not (args.tokenizer or model):
        raise SystemExit("--engine-mode token needs --tokenizer DIR (or --model)")
    return EngineSpec(kind=args.engine_mode, url=args.engine_url, model=model,
                      tokenizer=args.tokenizer, vllm_log=args.run_dir / "vllm.log",
                      **format_settings(args))


def report_broken(outcomes: list[Any]) -> bool:
    """--oracle: every rollout that did not pass is a broken pipeline, said so (exit 1)."""
    from rich.console import Console

    from harnessrl.rollout.run import broken_pipeline

    problems = broken_pipeline(outcomes)
    console = Console(stderr=True)
    for problem in problems:
        console.print(f"[bold red]broken pipeline[/]: {problem}", markup=True,
                      highlight=False)
    return bool(problems)
