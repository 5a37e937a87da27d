"""`harnessrl run`: harnesses on tasks through the proxy, scored by the tasks' verifiers
(its flags and its execution are shared with `eval`)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from harnessrl.cli.common import (
    DEFAULT_RUN_DIR,
    FORMAT,
    SAMPLING_FLAGS,
    harnesses,
    sampling_from_flags,
)
from harnessrl.settings import add_flags, from_flags

if TYPE_CHECKING:
    from harnessrl.proxy.engines.build import EngineSettings
    from harnessrl.rollout.runner import RunSettings
    from harnessrl.types import Outcome, Sampling

HELP = "harnesses on tasks through the proxy, scored by the tasks' verifiers"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p)
    p.set_defaults(func=run)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    from harnessrl.proxy.engines.build import EngineSettings
    from harnessrl.rollout.cluster.driver import ClusterSettings
    from harnessrl.rollout.rewards import Shaping
    from harnessrl.rollout.runner import RolloutSettings, RunSettings
    from harnessrl.types import Sampling

    p.add_argument("--harness", required=True, help="one or more, comma-separated")
    p.add_argument("--tasks", required=True, help="a task dir, a .jsonl file, or bundled[:...]")
    add_flags(p, RunSettings, "samples")
    add_flags(p, RolloutSettings, "concurrency", "retries")
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    add_flags(p, RolloutSettings, "tools_dir", "network", "sandbox", "hide_host", "image",
              "build_network", "agent_timeout")
    p.add_argument("--cluster", choices=["ray"],
                   help="run the rollouts across the nodes of a Ray cluster (extra "
                        "harnessrl[ray]): a capture-proxy shard per node")
    add_flags(p, ClusterSettings, "address", "slots_per_node")
    engine = p.add_mutually_exclusive_group(required=True)
    add_flags(engine, EngineSettings, "url", "model")
    engine.add_argument("--oracle", action="store_true",
                        help="a scripted engine that runs each task's reference solution "
                             "through the harness (checks the pipeline end to end)")
    engine.add_argument("--teacher", metavar="API_BASE",
                        help="any OpenAI-compatible endpoint (its /v1 root): text only, no "
                             "token ids; for `export --sft messages` (distillation)")
    add_flags(p, EngineSettings, "teacher_model", "tokenizer", "kind", *FORMAT)
    p.add_argument("--teacher-key-env", metavar="VAR",
                   help="--teacher: the environment variable holding its API key")
    add_flags(p, Shaping, "fewer_tool_calls", "fewer_tokens", "tool_call_bonus",
              "tool_call_budget")
    add_flags(p, RolloutSettings, "max_model_calls")
    add_flags(p, Shaping, "custom")
    add_flags(p, Sampling, "temperature", "max_tokens", flags=SAMPLING_FLAGS)


def run(args: argparse.Namespace) -> int:
    outcomes = execute_run(args)
    if args.oracle and report_broken(outcomes):
        return 1
    return 0 if all(o.status == "done" for o in outcomes) else 1


def execute_run(args: argparse.Namespace) -> list[Outcome]:
    from harnessrl.rollout.rewards import Shaping
    from harnessrl.rollout.run import execute, oracle_engine
    from harnessrl.rollout.runner import RolloutSettings, RunSettings
    from harnessrl.rollout.tasks.task import load_tasks

    tasks = load_tasks(args.tasks)
    config = from_flags(RunSettings, args, harnesses=harnesses(args.harness.split(",")),
                        tasks=tasks, settings=from_flags(RolloutSettings, args),
                        shaping=from_flags(Shaping, args))
    sampling = sampling_from_flags(args)
    if args.cluster:
        return _execute_on_cluster(args, config, sampling)
    if args.oracle:
        return execute(config, oracle_engine(tasks, config.harnesses), args.run_dir,
                       sampling=sampling)
    from harnessrl.proxy.engines.build import built

    with built(_run_engine_spec(args)) as engine:  # several --engine-url: routed
        return execute(config, engine.engine, args.run_dir, sampling=sampling)


def _execute_on_cluster(args: argparse.Namespace, config: RunSettings, sampling: Sampling | None
                        ) -> list[Outcome]:
    """`--cluster ray`: each node builds its shard's engine(s) from specs (a vLLM started
    for --model runs here, on the driver's machine, and the nodes call it by URL)."""
    import functools

    from harnessrl.proxy.engines.build import built
    from harnessrl.rollout.cluster.driver import ClusterSettings
    from harnessrl.rollout.cluster.run import engines_from, execute_on_cluster
    from harnessrl.rollout.run import oracle_engine

    cluster = from_flags(ClusterSettings, args)
    if args.oracle:
        factory = functools.partial(oracle_engine, config.tasks, config.harnesses)
        return execute_on_cluster(config, factory, args.run_dir, cluster, sampling=sampling)
    spec = _run_engine_spec(args)
    with built(spec) as engine:
        specs = node_specs(spec, engine.url or spec.url or "")
        factory = functools.partial(engines_from, specs, spec.template_text())
        return execute_on_cluster(config, factory, args.run_dir, cluster, sampling=sampling)


def node_specs(spec: EngineSettings, url: str) -> list[EngineSettings]:
    """What each node builds its engines from: one spec per URL in `url` (a vLLM started
    here, or `--engine-url`'s comma-separated list), or with no URL the spec as given."""
    import msgspec

    from harnessrl.proxy.engines.build import split_urls

    return [msgspec.structs.replace(spec, url=u, model=None if u else spec.model)
            for u in split_urls(url) or [""]]


def _run_engine_spec(args: argparse.Namespace) -> EngineSettings:
    """`run`/`eval`: a teacher, a running vLLM, or one started for --model."""
    import os

    from harnessrl.proxy.engines.build import EngineSettings

    if args.teacher:
        key = os.environ.get(args.teacher_key_env) if args.teacher_key_env else None
        return from_flags(EngineSettings, args, kind="teacher", url=args.teacher, api_key=key)
    model = None
    if args.model is not None:  # before vLLM starts: a name that cannot load ends here
        from harnessrl.train.model_name import resolve_model

        model = resolve_model(args.model, status=_announce)
    if model is not None:  # vLLM's log goes into the run directory, new or not
        args.run_dir.mkdir(parents=True, exist_ok=True)
    if args.engine_mode == "token" and not (args.tokenizer or model):
        raise SystemExit("--engine-mode token needs --tokenizer DIR (or --model)")
    return from_flags(EngineSettings, args, model=model, vllm_log=args.run_dir / "vllm.log")


def _announce(message: str) -> contextlib.AbstractContextManager[None]:
    print(f"{message} ...", file=sys.stderr)
    return contextlib.nullcontext()


def report_broken(outcomes: list[Outcome]) -> bool:
    """--oracle: every rollout that did not pass is a broken pipeline, said so (exit 1)."""
    from rich.console import Console

    from harnessrl.rollout.run import broken_pipeline

    problems = broken_pipeline(outcomes)
    console = Console(stderr=True)
    for problem in problems:
        console.print(f"[bold red]broken pipeline[/]: {problem}", markup=True,
                      highlight=False)
    return bool(problems)
