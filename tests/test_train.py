"""Training: the TRL rollout function, weight sync, SFT export and `harnessrl train`.

Fast tests drive a small agent script (a real process talking to the proxy through the
`openai` SDK, executing its own tool calls) with the scripted engine; the slow test runs a
real harness against real vLLM serving the tiny model, takes a GRPO step and syncs."""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from harnessrl.errors import EngineUnavailable
from harnessrl.harnesses.base import Harness
from harnessrl.proxy.engines.policy import OraclePolicy
from harnessrl.proxy.engines.scripted import Reply, ScriptedEngine, default_logprob
from harnessrl.rollout.run import oracle_policy
from harnessrl.rollout.runner import RolloutSettings
from harnessrl.rollout.tasks.task import load_tasks
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
                           settings=RolloutSettings(retries=0, hide_host=False), **options)


def test_plan_mixes_harnesses_per_group_or_per_generation(setting, tmp_path, tokenizer):
    tasks, engine, h = setting
    both = [h["solve"], h["idle"]]
    by_group = rollouts_for(tmp_path, tasks, engine, both, tokenizer)
    planned = by_group.plan(["hello", "hello", "count", "count"], generations=2)
    assert [p.harness.name for p in planned] == ["agent-solve", "agent-solve",
                                                 "agent-idle", "agent-idle"]
    again = by_group.plan(["hello", "hello", "count", "count"], generations=2)
    assert [p.harness.name for p in again] == ["agent-idle", "agent-idle",
                                               "agent-solve", "agent-solve"]  # rotated
    third = by_group.plan(["hello", "hello"], generations=2)
    assert [(p.harness.name, p.sample) for p in planned + third if p.task.id == "hello"] == [
        ("agent-solve", 0), ("agent-solve", 1), ("agent-solve", 2), ("agent-solve", 3)]
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


# ------------------------------------------------------------------ real vLLM
def _vllm_logprobs(url: str, prompt: list[int], n: int = 8) -> tuple[list[int], list[float]]:
    """Greedy tokens after `prompt` and vLLM's logprob of each."""
    import httpx

    body = {"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0,
            "logprobs": 0, "return_token_ids": True, "ignore_eos": True}
    choice = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    return list(choice["token_ids"]), list(choice["logprobs"]["token_logprobs"])


def _trainer_logprobs(model, prompt: list[int], completion: list[int]) -> list[float]:
    """The same positions through transformers: log-softmax of the logits, no sampling."""
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(
        1, torch.tensor(completion)[:, None])[:, 0].tolist()


ORDER = itertools.count()


def order_term(_verdict: object, _stats: object) -> float:
    """A test-only shaping term: rewards that differ where every rollout fails alike."""
    return float(next(ORDER))


@pytest.mark.vllm
@pytest.mark.harness
@pytest.mark.slow
def test_grpo_step_on_cpu_from_real_rollouts_syncs_vllm(vllm_tiny, tiny_model, tokenizer,
                                                        tmp_path):
    import dataclasses

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    from harnessrl.harnesses import get
    from harnessrl.proxy.engines.vllm import VLLMEngine
    from harnessrl.rollout.rewards import Shaping
    from harnessrl.train.trl import on_policy_sampling
    from harnessrl.train.weights import VLLMWeightSync

    tools = Path("~/.cache/harnessrl/tools").expanduser()
    stock = get("mini-swe-agent")
    stock.install(tools, log=lambda _line: None)
    # The random model never makes a valid call; two steps bound the run.
    mini = dataclasses.replace(stock, argv=lambda ctx, instruction: [
        *stock.argv(ctx, instruction), "-c", "agent.step_limit=2"])
    # Noise fails every task alike; a test-only term makes the rewards differ, so the
    # step has a gradient (the runner records it as a shaping term like any other).
    shaping = Shaping(custom=("tests.test_train:order_term",))
    tasks = load_tasks("bundled:create-hello-file")
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    # The module's server: the first rollout call pushes this trainer's weights into it.
    url = vllm_tiny.url
    engine = VLLMEngine(url)
    sync = VLLMWeightSync(url, tmp_path / "weights")
    with HarnessRollouts(tasks=tasks, harnesses=[mini], engine=engine,
                         run_dir=tmp_path / "run", pad_token_id=tokenizer.pad_token_id,
                         sync=sync, sampling=on_policy_sampling(max_tokens=48), shaping=shaping,
                         settings=RolloutSettings(tools_dir=str(tools))) as rollouts:
        trainer = GRPOTrainer(
            model=model, reward_funcs=[harness_reward],
            args=grpo_args(tmp_path / "out", per_device_train_batch_size=2,
                           num_generations=2, learning_rate=5e-2),
            train_dataset=Dataset.from_dict({"prompt": ["create-hello-file"]}),
            processing_class=tokenizer, rollout_func=rollouts,
            callbacks=[rollouts.callback()])
        trainer.train()
        [batch] = rollouts.batches
        after = rollouts.rollouts(rollouts.plan(["create-hello-file"], generations=1))
        store = rollouts.store
        before_turns = [t for r in batch.records for t in store.turns(r.outcome.rollout)]
        after_turns = store.turns(after[0].outcome.rollout)

        prompt = list(batch.records[0].sample.prompt_ids[:64])
        ids, served = _vllm_logprobs(url, prompt)
        trained = _trainer_logprobs(model, prompt, ids)
        old = _trainer_logprobs(initial, prompt, ids)
        served_version = sync.served_version()

    assert all(r.outcome.status == "done" and r.sample is not None for r in batch.records)
    rewards = sorted(r.outcome.reward for r in batch.records)
    assert rewards[0] != rewards[1]
    # The rollouts were sampled by the initial weights, exactly: vLLM's logprobs of the
    # sampled tokens are the initial model's, through transformers.
    for record in batch.records:
        s = record.sample
        sampled = [i for i, m in zip(s.completion_ids, s.mask, strict=True) if m]
        recomputed = _trainer_logprobs(initial, list(s.prompt_ids), list(s.completion_ids))
        mine = [lp for lp, m in zip(recomputed, s.mask, strict=True) if m]
        assert len(mine) == len(sampled) == len(s.logprobs)
        assert max(abs(a - b) for a, b in zip(mine, s.logprobs, strict=True)) < 1e-4
    # The step changed the weights, vLLM serves the new ones exactly, and it says so.
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), initial.parameters(),
                                                     strict=True))
    assert max(abs(a - b) for a, b in zip(trained, served, strict=True)) < 1e-4
    assert max(abs(a - b) for a, b in zip(old, served, strict=True)) > 1e-3
    assert served_version == "step-1" and len(sync.seconds) == 2
    assert {t.weight_version for t in before_turns} == {"step-0"}
    assert after_turns and {t.weight_version for t in after_turns} == {"step-1"}


# ------------------------------------------------------------------ SFT export
class TextOnly:
    """An OpenAI-compatible teacher that returns text and tool calls but no token ids and
    no logprobs, as most hosted endpoints do."""

    name = "teacher"
    weight_version = None

    def __init__(self, inner) -> None:
        self.inner = inner

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def models(self) -> list[str]:
        return await self.inner.models()

    async def count_tokens(self, request) -> int:
        return await self.inner.count_tokens(request)

    def bind_store(self, store) -> None:
        self.inner.bind_store(store)

    def forget_rollout(self, key) -> None:
        self.inner.forget_rollout(key)

    async def complete(self, request, rollout=None):
        from harnessrl.types import Chunk, Started

        events = await self.inner.complete(request, rollout)
        return [Started(e.model, None) if isinstance(e, Started)
                else Chunk(e.deltas, None, None) if isinstance(e, Chunk) else e
                for e in events]

    def stream(self, request, rollout=None):
        raise NotImplementedError  # the agent script does not stream


def _collect(setting, tmp_path: Path, engine=None) -> Path:
    from harnessrl.rollout.runner import RunSettings

    tasks, scripted, h = setting
    config = RunSettings(harnesses=[h["solve"], h["idle"]], tasks=tasks[:1],
                       settings=RolloutSettings(retries=0, hide_host=False))
    from harnessrl.rollout.run import execute

    outcomes = execute(config, engine or scripted, tmp_path / "run", console=QUIET)
    assert sorted(o.verifier_reward for o in outcomes) == [0.0, 1.0]
    return tmp_path / "run"


@pytest.mark.slow
def test_sft_token_export_is_exact_and_sfttrainer_takes_it(setting, tmp_path, tokenizer,
                                                           tiny_model):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from harnessrl.store.reader import TraceReader
    from harnessrl.train.export.sft import export_sft

    run = _collect(setting, tmp_path)
    result = export_sft(run, tmp_path / "sft.parquet")
    assert result.rows == result.rollouts == 1 and not result.retokenized
    data = Dataset.from_parquet(str(result.path))
    [row] = list(data)
    assert row["harness"] == "agent-solve" and row["retokenized"] is False
    with TraceReader(run) as store:
        turns = store.turns(row["rollout"])
    last = turns[-1].completion.tokens
    assert row["input_ids"] == [*last.prompt_ids, *last.completion_ids]
    sampled = [t for turn in turns for t in turn.completion.tokens.completion_ids]
    assert [i for i, m in zip(row["input_ids"], row["assistant_masks"], strict=True)
            if m] == sampled
    assert sum(row["assistant_masks"]) == len(sampled) < len(row["input_ids"])

    trainer = SFTTrainer(model=str(tiny_model), train_dataset=data,
                         processing_class=tokenizer, args=SFTConfig(
                             output_dir=str(tmp_path / "sft"), max_steps=1, use_cpu=True,
                             bf16=False, per_device_train_batch_size=1, report_to="none",
                             save_strategy="no", max_length=None))
    labels = trainer.train_dataset[0]["labels"]
    assert [i for i in labels if i != -100] == sampled  # loss on exactly the sampled tokens
    assert trainer.train().training_loss > 0


@pytest.mark.slow
def test_sft_messages_export_from_a_teacher_without_token_ids(setting, tmp_path, tokenizer,
                                                              tiny_model, capsys):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from harnessrl.cli import main
    from harnessrl.train.export.sft import RETOKENIZED_NOTE, export_sft

    _tasks, scripted, _h = setting
    run = _collect(setting, tmp_path, TextOnly(scripted))
    tokens = export_sft(run, tmp_path / "tokens.parquet")
    assert tokens.rows == 0 and tokens.skipped == {"no trainable turn": 1}
    assert main(["export", str(run), "--sft", "messages", "-o", str(tmp_path / "chat.parquet")
                 ]) == 0
    assert RETOKENIZED_NOTE in capsys.readouterr().out  # the export says it re-tokenizes
    result = export_sft(run, tmp_path / "chat.parquet", kind="messages")
    assert result.rows == 1 and result.retokenized
    [row] = list(Dataset.from_parquet(str(result.path)))
    assert row["retokenized"] is True and row["turns_with_ids"] == 0
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    call = row["messages"][2]["tool_calls"][0]["function"]
    assert call["name"] == "bash" and "base64" in json.loads(call["arguments"])["command"]
    assert json.loads(row["tools"])[0]["function"]["name"] == "bash"

    data = Dataset.from_parquet(str(result.path)).select_columns(["messages", "tools"])
    trainer = SFTTrainer(model=str(tiny_model), train_dataset=data, processing_class=tokenizer,
                         args=SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=1,
                                        use_cpu=True, bf16=False, report_to="none",
                                        per_device_train_batch_size=1, save_strategy="no",
                                        max_length=None))
    text = tokenizer.decode(trainer.train_dataset[0]["input_ids"])
    assert "<tool_call>" in text and "<tool_response>" in text
    assert trainer.train().training_loss > 0


@pytest.mark.vllm
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.parametrize(("trainer", "mode"), [("sync", "chat"), ("async", "token")])
def test_harnessrl_train_runs_steps_and_writes_metrics(vllm_tiny, tiny_model, tmp_path,
                                                       trainer, mode, capsys, monkeypatch):
    from harnessrl.cli import main
    from harnessrl.cli import train as train_cli

    # A rollout of the random model can end in seconds: a short interval makes the
    # progress line certain to show between the steps whatever the machine's speed.
    monkeypatch.setattr(train_cli, "PROGRESS_EVERY", 2.0)

    tasks = tmp_path / "tasks.jsonl"
    # The random model never finishes; a deadline ends each rollout (timed out), long
    # enough for mini-swe-agent to start and see replies on a busy machine. Its replies
    # are cut by max_tokens and its rewards are all alike, so the config trains truncated
    # and rejected turns and keeps uniform groups: otherwise no group could train.
    tasks.write_text(json.dumps({"id": "hello", "instruction": "Create hello.txt",
                                 "verify": ["test -f hello.txt"], "timeout": 45}))
    config = tmp_path / "train.yaml"
    config.write_text(f"""
run_dir: {tmp_path / "run"}
model: {{path: "{tiny_model}"}}
engine: {{url: "{vllm_tiny.url}/v1", max_tokens: 32, mode: {mode}}}
rollout: {{harnesses: [mini-swe-agent], tasks: "{tasks}"}}
grpo: {{trainer: {trainer}, steps: 2, num_generations: 2, tasks_per_step: 1,
        learning_rate: 1.0e-3, report_to: [tensorboard],
        truncated_turns: train, rejected_turns: train, drop_uniform_groups: false}}
""")
    assert main(["train", "--config", str(config)]) == 0
    # Progress lines between the step lines
    assert "training · rollouts" in capsys.readouterr().out
    lines = [json.loads(line) for line in
             (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    # the trained model, servable as it is: weights, config, tokenizer, chat template
    served = {p.name for p in (tmp_path / "run" / "model").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= served
    logged = _tensorboard_scalars(tmp_path / "run" / "trainer")
    assert "train/loss" in logged, sorted(logged)
    if trainer == "async":
        _check_async_lines(lines, logged)
    else:
        _check_sync_lines(lines)
    from harnessrl.store.reader import TraceReader

    with TraceReader(tmp_path / "run") as store:
        used = {t.used_sampling for t in store.iter_turns()}
        engines = {t.engine for t in store.iter_turns()}
    assert engines == {"vllm" if mode == "chat" else "vllm-token"}
    # on-policy: every call at the trainer's temperature, no truncation of the distribution
    assert {(u.temperature, u.top_p, u.top_k, u.max_tokens) for u in used} == {(1.0, 1.0, 0, 32)}


def _tensorboard_scalars(root) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for events in root.rglob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    return tags


def _check_async_lines(lines, logged) -> None:
    """The async trainer's steps: versions advance (v1 is the cold sync), every sampled
    token of a finished call is in a row, and our metrics reach TRL's report_to."""
    assert [line["trainer"] for line in lines] == ["async", "async"]
    assert [line["weight_version"] for line in lines] == ["v2", "v3"]
    assert all("loss" in line["trl"] for line in lines)
    # a step's figures are those of the groups that finished during it (none: absent)
    scored = [line for line in lines if line["rows_per_rollout"] is not None]
    assert scored
    for line in scored:
        assert line["rows_per_rollout"] >= 1 and not line["infra_errors"]
        assert line["tokens_trained_share"] == pytest.approx(1.0)
        assert line["tokens_main_chain_share"] <= line["tokens_trained_share"]
        assert line["harnesses"]["mini-swe-agent"]["rows_per_rollout"] >= 1
    # TRL times a step from the end of the one before: the first has no idle share
    assert lines[0]["trainer_idle_share"] is None
    assert 0 <= lines[1]["trainer_idle_share"] <= 1
    assert {"train/harnessrl/rows_per_rollout", "train/harnessrl/tokens_trained_share",
            "train/harnessrl/mini-swe-agent/tokens_main_chain_share"} <= logged


def _check_sync_lines(lines) -> None:
    assert [line["trained_sequences"] for line in lines] == [2, 2]
    assert [line["sampled_with"] for line in lines] == [["step-0"], ["step-1"]]
    assert [line["weight_version"] for line in lines] == ["step-1", "step-2"]
    for line in lines:
        assert line["rollouts"] == 2 and line["infra_errors"] == 0
        assert line["harnesses"]["mini-swe-agent"]["pass_rate"] == 0.0
        assert line["trained_tokens"] > 0 and "loss" in line["trl"]
        assert line["chain_extension_rate"] is None or 0 <= line["chain_extension_rate"] <= 1


def test_train_config_rejects_unknown_keys(tmp_path):
    from harnessrl.train.config import ConfigError, load_config

    bad = tmp_path / "bad.toml"
    bad.write_text("[grpo]\nstepz = 3\n")
    with pytest.raises(ConfigError, match="stepz"):
        load_config(bad)
    example = load_config(Path(__file__).parents[1] / "examples" / "train.toml")
    assert example.grpo.trl == {"epsilon_high": 0.28} and example.grpo.trainer == "async"


# ------------------------------------------------------------------ a teacher without ids
STANDARD = {"model", "messages", "tools", "tool_choice", "parallel_tool_calls", "stream",
            "stream_options", "temperature", "top_p", "max_tokens", "seed", "stop",
            "presence_penalty", "frequency_penalty", "reasoning_effort"}


def strict_openai_app(seen: list[dict]):
    """An endpoint that, like strict hosted APIs, rejects fields it does not know and
    returns no token ids."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        seen.append(body)
        unknown = sorted(set(body) - STANDARD)
        if unknown:
            return JSONResponse({"error": {"message": f"Unrecognized request arguments: "
                                           f"{unknown}"}}, 400)
        call = {"id": "call_1", "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
        return JSONResponse({"id": "x", "model": body["model"], "choices": [
            {"index": 0, "finish_reason": "tool_calls",
             "message": {"role": "assistant", "content": None, "tool_calls": [call]}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 9}})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def test_teacher_engine_sends_standard_fields_and_its_turns_are_not_trainable(tmp_path):
    import openai

    from harnessrl.proxy.engines.openai_compat import OpenAICompatEngine
    from harnessrl.proxy.serve import in_thread
    from harnessrl.rollout.analysis.chains import link
    from tests.helpers import ServedProxy, make_proxy

    seen: list[dict] = []
    with in_thread(strict_openai_app(seen)) as (teacher, _server):
        engine = OpenAICompatEngine(f"{teacher}/v1", model="big-teacher", api_key="k")
        with ServedProxy(make_proxy(engine, tmp_path)).running() as served:
            rollout = served.new_rollout()
            client = openai.OpenAI(base_url=rollout["base_urls"]["openai"],
                                   api_key=rollout["key"], max_retries=0)
            reply = client.chat.completions.create(
                model="whatever", messages=[{"role": "user", "content": "list files"}],
                tools=[{"type": "function", "function": {"name": "bash", "parameters": {
                    "type": "object", "properties": {"command": {"type": "string"}}}}}])
            turns = served.store.turns(rollout["key"])
            counted = httpx.post(f"{rollout['base_url']}/v1/messages/count_tokens",
                                 headers={"x-api-key": rollout["key"]},
                                 json={"model": "m", "messages": [{"role": "user",
                                                                   "content": "hi"}]})
    # no tokenizer behind a teacher: a clear 404 in the caller's shape, not a crash
    assert counted.status_code == 404 and counted.json()["type"] == "error"
    assert "tokenizer" in counted.json()["error"]["message"]
    assert reply.choices[0].message.tool_calls[0].function.name == "bash"
    assert seen[0]["model"] == "big-teacher" and "return_token_ids" not in seen[0]
    [turn] = turns
    assert turn.status == "ok" and turn.engine == "openai" and turn.weight_version is None
    assert {"prompt_ids_missing", "completion_ids_missing"} <= set(turn.flags)
    assert link(turns).excluded[0].reason == "flagged"  # never trained on as tokens


def test_step_metrics_per_harness_leave_infra_errors_out_of_rates():
    from collections import Counter

    from harnessrl.rollout.analysis.chains import ChainStats
    from harnessrl.train.loop import batch_metrics
    from harnessrl.train.trl import Batch, RolloutRecord
    from harnessrl.types import Outcome, Sample

    def record(harness: str, status: str, verifier: float | None, tools: int = 0):
        outcome = Outcome(harness=harness, harness_version="1", task="t", sample=0,
                          rollout="k", status=status, verifier_reward=verifier,
                          reward=verifier, tool_calls=tools)
        stats = ChainStats(rollouts=1, turns=3, trainable=3, chains=2,
                           breaks=Counter({"first": 1, "history_rewritten": 1}))
        s = Sample("k", (0, 1), (1, 2), (3, 4, 5), (1, 0, 1), (-0.5, -0.25), ("step-3",) * 2)
        return RolloutRecord(outcome, s if status == "done" else None, stats)

    m = batch_metrics(Batch(3, [record("a", "done", 1.0, 2), record("a", "done", 0.0, 4),
                                record("b", "infra_error", None), record("b", "done", 1.0)],
                            9.0))
    assert m["rollouts"] == 4 and m["infra_errors"] == 1 and m["trained_sequences"] == 3
    assert m["reward"] == pytest.approx(2 / 3) and m["pass_rate"] == pytest.approx(2 / 3)
    assert m["harnesses"]["a"]["pass_rate"] == 0.5 and m["harnesses"]["b"]["pass_rate"] == 1.0
    assert m["harnesses"]["a"]["tool_calls"] == 3.0
    assert m["trained_tokens"] == 6 and m["sampled_with"] == ["step-3"]
    # per rollout: 3 trainable turns in 2 chains -> 1 extended, 1 rewritten -> 50%
    assert m["chain_extension_rate"] == 0.5 and m["harnesses"]["b"]["chains"] == 4
    # the same per-harness figures reach the trainer's metrics (so report_to) by name
    from collections import defaultdict
    from types import SimpleNamespace

    from harnessrl.train.loop import report_batch

    trainer = SimpleNamespace(_metrics={"train": defaultdict(list)})
    report_batch(Batch(3, [record("a", "done", 1.0, 2), record("a", "done", 0.0, 4),
                           record("b", "infra_error", None)], 9.0), trainer)
    sink = trainer._metrics["train"]
    assert sink["harnessrl/a/pass_rate"] == [0.5] and sink["harnessrl/a/tool_calls"] == [3.0]
    assert sink["harnessrl/b/infra_errors"] == [1.0] and "harnessrl/b/pass_rate" not in sink


def test_weight_sync_order_and_tied_heads_refused(tmp_path):
    from types import SimpleNamespace

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from harnessrl.proxy.serve import in_thread
    from harnessrl.train.weights import VLLMWeightSync, WeightSyncError

    calls: list[tuple[str, object]] = []
    version = {"v": "default"}

    async def post(request: Request) -> JSONResponse:
        body = await request.body()
        payload = json.loads(body) if body and body != b"null" else None
        calls.append((request.url.path, payload))
        if request.url.path == "/update_weight_version":
            version["v"] = payload["new_version"]
        return JSONResponse({})

    async def info(_request: Request) -> JSONResponse:
        return JSONResponse({"weight_version": version["v"]})

    app = Starlette(routes=[Route(p, post, methods=["POST"]) for p in (
        "/collective_rpc", "/reset_prefix_cache", "/update_weight_version")]
        + [Route("/weight_info", info)])

    class Model:
        def __init__(self, tied: bool) -> None:
            self.config = SimpleNamespace(tie_word_embeddings=tied)

        def save_pretrained(self, path: Path, safe_serialization: bool) -> None:
            calls.append(("save", str(path)))

    engine = SimpleNamespace(weight_version="default")
    with in_thread(app) as (url, _server):
        sync = VLLMWeightSync(url, tmp_path / "w", engines=[engine])
        with pytest.raises(WeightSyncError, match="ties"):
            sync.push(Model(tied=True), "step-1")
        assert calls == [] and engine.weight_version == "default"
        sync.push(Model(tied=False), "step-1")
    assert [c[0] for c in calls] == ["save", "/collective_rpc", "/reset_prefix_cache",
                                     "/update_weight_version"]
    assert calls[1][1] == {"method": "reload_weights",
                           "kwargs": {"weights_path": str(tmp_path / "w")}}
    assert engine.weight_version == "step-1" and len(sync.seconds) == 1
