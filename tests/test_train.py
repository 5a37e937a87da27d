"""Training: the TRL rollout function, weight sync, SFT export and `harnessrl train`.

Fast tests drive a small agent script (a real process talking to the proxy through the
`openai` SDK, executing its own tool calls) with the scripted engine; the slow test runs a
real harness against real vLLM serving the tiny model, takes a GRPO step and syncs."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
from rich.console import Console

from harnessrl.errors import EngineUnavailable
from harnessrl.harnesses.base import Harness
from harnessrl.harnesses.policy import OraclePolicy
from harnessrl.proxy.engines.scripted import Reply, ScriptedEngine, default_logprob
from harnessrl.rollout.run import oracle_policy
from harnessrl.rollout.tasks import load_tasks
from harnessrl.train.trl import HarnessRollouts, columns, harness_reward
from harnessrl.types import ChatRequest, Text

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115

# A minimal coding agent: chat completions with one bash tool, runs each call, sends the
# output back with its whole history, until the model answers without a call.
AGENT = r'''
import json, os, subprocess, sys
from openai import OpenAI
client = OpenAI(base_url=os.environ["AGENT_BASE"], api_key=os.environ["AGENT_KEY"],
                max_retries=0)
tools = [{"type": "function", "function": {"name": "bash", "description": "Run a command",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                         "required": ["command"]}}}]
messages = [{"role": "system", "content": "You are agent " + os.environ["AGENT_MODE"] + "."},
            {"role": "user", "content": sys.argv[1]}]
for _ in range(4):
    reply = client.chat.completions.create(model="policy", messages=messages, tools=tools)
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    if not message.tool_calls:
        break
    for call in message.tool_calls:
        command = json.loads(call.function.arguments)["command"]
        done = subprocess.run(command, shell=True, capture_output=True, text=True)
        messages.append({"role": "tool", "tool_call_id": call.id,
                         "content": done.stdout + done.stderr})
'''


class ScriptAgent(Harness):
    def executable(self, tools_dir: Path) -> Path:
        return Path(sys.executable)


def agent(name: str, mode: str, script: Path) -> Harness:
    """An agent whose system prompt names its mode: solve, idle (never acts) or broken
    (the engine fails under it: an infrastructure error)."""
    return ScriptAgent(
        name=name, version="1", dialect="openai_chat", registry="pypi", package="-",
        binary="python", argv=lambda ctx, instruction: [str(script), instruction],
        env=lambda ctx: {"AGENT_BASE": ctx.openai_base, "AGENT_KEY": ctx.key,
                         "AGENT_MODE": mode})


class ModePolicy:
    """Solves with the task's reference solution, unless the agent's mode says otherwise."""

    def __init__(self, oracle: OraclePolicy) -> None:
        self.oracle = oracle

    def __call__(self, request: ChatRequest) -> Reply:
        system = request.messages[0].parts[0]
        mode = system.text if isinstance(system, Text) else ""
        if "broken" in mode:
            raise EngineUnavailable("scripted outage (test)")
        if "idle" in mode:
            return Reply("I would rather not.")
        return self.oracle(request)


@pytest.fixture
def setting(tmp_path: Path, tokenizer):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    tasks_file = tmp_path / "tasks" / "tasks.jsonl"
    tasks_file.parent.mkdir()
    tasks_file.write_text("\n".join(json.dumps(t) for t in [
        {"id": "hello", "instruction": "Create hello.txt containing hi",
         "verify": ["grep -qx hi hello.txt"], "solution": ["echo hi > hello.txt"]},
        {"id": "count", "instruction": "Write the number 3 to n.txt",
         "verify": ["grep -qx 3 n.txt"], "solution": ["echo 3 > n.txt"]},
    ]))
    tasks = load_tasks(tasks_file)
    engine = ScriptedEngine(tokenizer, ModePolicy(oracle_policy(tasks)), model="policy")
    harnesses = {mode: agent(f"agent-{mode}", mode, script)
                 for mode in ("solve", "idle", "broken")}
    return tasks, engine, harnesses


def rollouts_for(tmp_path: Path, tasks, engine, harnesses, tokenizer, **options):
    return HarnessRollouts(tasks=tasks, harnesses=harnesses, engine=engine,
                           run_dir=tmp_path / "run", pad_token_id=tokenizer.pad_token_id,
                           retries=0, hide_host=False, **options)


def test_plan_mixes_harnesses_per_group_or_per_generation(setting, tmp_path, tokenizer):
    tasks, engine, h = setting
    both = [h["solve"], h["idle"]]
    by_group = rollouts_for(tmp_path, tasks, engine, both, tokenizer)
    planned = by_group.plan(["hello", "hello", "count", "count"], generations=2)
    assert [p.harness.name for p in planned] == ["agent-solve", "agent-solve",
                                                 "agent-idle", "agent-idle"]
    again = by_group.plan(["hello", "hello", "count", "count"], generations=2)
    assert [p.harness.name for p in again][:2] == ["agent-solve"] * 2  # rotated by 2 groups
    assert [p.sample for p in planned + again if p.task.id == "hello"
            and p.harness.name == "agent-solve"] == [0, 1, 2, 3]  # unique per harness/task
    by_generation = rollouts_for(tmp_path, tasks, engine, both, tokenizer, mix="generation")
    planned = by_generation.plan(["hello", "hello", "count", "count"], generations=2)
    assert [p.harness.name for p in planned] == ["agent-solve", "agent-idle"] * 2
    with pytest.raises(ValueError, match="task ids"):
        by_group.plan(["What is 2+2?"], generations=1)


@pytest.mark.slow
def test_rollout_columns_are_the_stored_tokens_with_masks(setting, tmp_path, tokenizer):
    tasks, engine, h = setting
    with rollouts_for(tmp_path, tasks, engine, [h["solve"], h["idle"], h["broken"]],
                      tokenizer, mix="generation") as rollouts:
        records = rollouts.rollouts(rollouts.plan(["hello"] * 3, generations=3))
        out = columns(records, tokenizer.pad_token_id)
        store = rollouts.store
        turns = {r.outcome.rollout: store.turns(r.outcome.rollout) for r in records}

    assert set(out) >= {"prompt_ids", "completion_ids", "logprobs", "env_mask", "reward"}
    assert all(len(v) == 3 for v in out.values())
    assert out["harness"] == ["agent-solve", "agent-idle", "agent-broken"]
    assert out["status"] == ["done", "done", "infra_error"]
    assert out["reward"][:2] == [1.0, 0.0] and out["reward"][2] is None
    assert harness_reward([], [], out["reward"]) == [1.0, 0.0, None]

    solved = turns[out["rollout"][0]]
    assert len(solved) == 2  # the tool call, then the answer after the tool result
    first, last = (t.completion.tokens for t in (solved[0], solved[-1]))
    assert out["prompt_ids"][0] == list(first.prompt_ids)
    # prompt + completion is the last turn's prompt and completion, id for id
    assert out["prompt_ids"][0] + out["completion_ids"][0] == [
        *last.prompt_ids, *last.completion_ids]
    mask, logprobs = out["env_mask"][0], out["logprobs"][0]
    assert len(mask) == len(logprobs) == len(out["completion_ids"][0])
    sampled = [*first.completion_ids, *last.completion_ids]
    assert [i for i, m in zip(out["completion_ids"][0], mask, strict=True) if m] == sampled
    assert sum(mask) < len(mask)  # the tool result and template tokens are masked
    assert [lp for lp, m in zip(logprobs, mask, strict=True) if m] == [
        *first.logprobs, *last.logprobs]
    assert next(lp for lp, m in zip(logprobs, mask, strict=True) if m) == default_logprob(0)
    assert all(math.isnan(lp) for lp, m in zip(logprobs, mask, strict=True) if not m)

    # the agent that never acts still made a trainable call, scored 0
    assert sum(out["env_mask"][1]) == len(out["completion_ids"][1]) > 0
    # the infrastructure failure: nothing to train, no reward, one masked placeholder
    assert out["env_mask"][2] == [0] and math.isnan(out["logprobs"][2][0])
    assert out["completion_ids"][2] == [tokenizer.pad_token_id]


def grpo_args(out: Path, **overrides):
    from trl import GRPOConfig

    values = dict(output_dir=str(out), per_device_train_batch_size=6, num_generations=3,
                  max_steps=1, learning_rate=1e-2, beta=0.0, use_cpu=True, bf16=False,
                  report_to="none", logging_steps=1, save_strategy="no", seed=0,
                  dataloader_num_workers=0)
    return GRPOConfig(**{**values, **overrides})


@pytest.mark.slow
def test_grpo_step_keeps_infra_failures_out_of_the_baseline(setting, tmp_path, tokenizer,
                                                            tiny_model):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    tasks, engine, h = setting
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with rollouts_for(tmp_path, tasks, engine, [h["solve"], h["idle"], h["broken"]],
                      tokenizer, mix="generation") as rollouts:
        trainer = GRPOTrainer(model=model, reward_funcs=[harness_reward],
                              args=grpo_args(tmp_path / "out"),
                              train_dataset=Dataset.from_dict({"prompt": ["hello", "count"]}),
                              processing_class=tokenizer, rollout_func=rollouts,
                              callbacks=[rollouts.callback()])
        scored = []
        score = trainer._generate_and_score_completions
        trainer._generate_and_score_completions = lambda inputs: scored.append(
            score(inputs)) or scored[-1]
        trainer.train()

    [batch] = rollouts.batches
    assert [r.outcome.harness for r in batch.records] == ["agent-solve", "agent-idle",
                                                          "agent-broken"] * 2
    advantages = scored[0]["advantages"].tolist()
    # Each group is {1, 0, failed}: the failure is not a 0 in the baseline (which would
    # make the mean 1/3); the mean is 0.5 over the two scored rollouts, and the failed
    # one gets no advantage at all.
    std = math.sqrt(0.5)  # sample std of {1, 0}
    expected = [0.5 / (std + 1e-4), -0.5 / (std + 1e-4), 0.0] * 2
    assert advantages == pytest.approx(expected, abs=1e-5)
    # TRL's loss mask (completion mask x env mask, padding filled with 1 in the latter)
    loss_mask = scored[0]["completion_mask"] * scored[0]["tool_mask"]
    assert loss_mask[2].sum() == 0 and loss_mask[5].sum() == 0
    assert loss_mask[0].sum() == sum(batch.records[0].sample.mask)
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert changed, "the GRPO step changed no weight"
