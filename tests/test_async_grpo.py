"""Asynchronous GRPO end to end on a CPU: TRL's `AsyncGRPOTrainer` with harnessrl's rollout
worker and file weight transfer, real vLLM serving the tiny model, two agents that are
real processes talking to the capture proxy through the `openai` SDK (scripted agents:
their loop is a short script, the model is real). One keeps its history; the other
rewrites it (a compaction) and makes a side call, so its rollouts have several chains.

Also the pure parts (group advantage, rows of every chain) on stored-turn shapes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from harnessrl.harnesses.base import Harness
from harnessrl.rollout.analysis.chains import link
from harnessrl.train.async_grpo.groups import rows_of, score_group
from harnessrl.train.rows.grpo import RowSettings, group_advantages
from harnessrl.types import Outcome
from tests.helpers import CACHE, make_turn

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

# 8-token replies are cut by max_tokens and the rewards are coin flips: every reply is
# trained and every group queued, as these tests check every chain's row (the defaults
# that mask truncated replies and drop uniform groups: tests/test_grpo.py)
EVERY_ROW = {"settings": RowSettings(rejected_turns="train", truncated_turns="train"),
             "drop_uniform": False}

AGENT = r'''
import os, sys
from openai import OpenAI
client = OpenAI(base_url=os.environ["AGENT_BASE"], api_key=os.environ["AGENT_KEY"],
                max_retries=0, timeout=300)
mode = os.environ["AGENT_MODE"]
system = {"role": "system", "content": "You are a careful coding agent. " * 6}
messages = [system, {"role": "user", "content": sys.argv[1]}]
def ask(msgs):
    reply = client.chat.completions.create(model="policy", messages=msgs)
    return reply.choices[0].message.content or ""
text = ""
for step in range(3):
    if mode == "compact" and step == 2:
        # rewrite the history: the conversation so far becomes a one-line summary
        messages = [system, {"role": "user", "content": sys.argv[1] + " Summary: " + text[:30]}]
    text = ask(messages)
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Go on."}]
if mode == "compact":
    ask([{"role": "system", "content": "Write a title."}, {"role": "user", "content": "t"}])
if len(text) % 2 == 0:
    open("done.txt", "w").write("yes")
'''


class ScriptAgent(Harness):
    def executable(self, tools_dir: Path) -> Path:
        return Path(sys.executable)


def agent(mode: str, script: Path) -> Harness:
    return ScriptAgent(
        name=f"agent-{mode}", version="1", dialect="openai_chat", registry="pypi",
        package="-", binary="python", argv=lambda ctx, instruction: [str(script), instruction],
        env=lambda ctx: {"AGENT_BASE": ctx.openai_base, "AGENT_KEY": ctx.key,
                         "AGENT_MODE": mode})


# ------------------------------------------------------------------ pure parts

def test_a_full_group_queue_holds_the_worker_and_keeps_its_heartbeat_fresh():
    """`queue_maxsize` (TRL's own setting) bounds how far the sampler runs ahead: with the
    queue full, the worker waits for the trainer instead of starting rollouts, and TRL's
    health check (a heartbeat older than `heartbeat_stale_after_s`) does not take that wait
    for a stuck worker."""
    import threading
    import time

    from harnessrl.train.async_grpo.batches import GroupItem
    from harnessrl.train.async_grpo.worker import POLL_SECONDS, HarnessRolloutWorker

    worker = HarnessRolloutWorker(None, num_generations=1, max_inflight=1,  # type: ignore[arg-type]
                                  max_staleness=0, queue_maxsize=1)
    first, second = GroupItem(1, 0, [], []), GroupItem(2, 0, [], [])  # whole groups
    worker._put(first)
    before = worker._heartbeat
    held = threading.Thread(target=worker._put, args=(second,), daemon=True)
    held.start()
    try:
        time.sleep(4 * POLL_SECONDS)
        assert held.is_alive()  # the queue is full: the second group waits
        assert worker._heartbeat > before
        assert worker.rollout_buffer.get() is first
        held.join(5)
        assert not held.is_alive() and worker.rollout_buffer.get_nowait() is second
    finally:
        worker._stop.set()  # a held put gives up


def test_group_advantage_leaves_infra_failures_out_and_every_chain_is_a_row():
    assert group_advantages([1.0, 0.0, None], "group") == pytest.approx([1.0, -1.0, 0.0], abs=1e-6)
    assert group_advantages([None, None], "group") == [0.0, 0.0]
    # two turns that do not extend each other: two chains, two rows
    a, b = make_turn("r1", 0), make_turn("r1", 1)
    assert len(link([a, b]).chains) == 2 and len(rows_of([a, b])) == 2
    done = Outcome(harness="h", harness_version="1", task="t", sample=0, rollout="r1",
                   status="done", reward=1.0)
    other = Outcome(harness="h", harness_version="1", task="t", sample=1, rollout="r2",
                    status="done", reward=0.0)
    failed = Outcome(harness="h", harness_version="1", task="t", sample=2, rollout="r3",
                     status="infra_error")
    # turn 1's prompt repeats turn 0's and goes on without its reply: a dropped reply,
    # masked by default (tests/test_grpo.py); trained here, so each chain is a row
    keep = RowSettings(rejected_turns="train")
    report, rows = score_group(7, "t", [(done, [a, b]), (other, [make_turn("r2", 0)]),
                                        (failed, [make_turn("r3", 0)])], keep)
    assert [s.rollout for s, _, _ in rows] == ["r1", "r1", "r2"]  # none for the failure
    assert [adv for _, adv, _ in rows] == pytest.approx([1.0, 1.0, -1.0], abs=1e-6)
    assert report.captured_tokens == {"r1": 6, "r2": 3}
    assert report.main_chain_tokens == {"r1": 3, "r2": 3}
    assert [r.fate for r in report.rows] == ["untagged"] * 3  # make_turn records no version


# ------------------------------------------------------------------ real vLLM
@pytest.fixture(scope="module")
def vllm_dev(tiny_model: Path):
    from harnessrl.proxy.engines.vllm_server import VLLMServer

    server = VLLMServer(model=str(tiny_model), served_name="tiny", dtype="float32",
                        max_model_len=4096, extra_args=["--seed", "0"],
                        log_path=CACHE / "vllm-async-grpo-test.log")
    with server:
        yield server


def _call_during_second_swap(transfer, rollouts) -> dict:
    """Wraps the transfer's `send_weights`: during the second swap (the first after an
    optimizer step) a model call goes to the proxy from another thread; it must still be
    waiting when the weights are sent, and answer once the gate opens."""
    import threading
    import time

    import httpx

    seen: dict = {}
    send = transfer.send_weights

    def call() -> None:
        proxy = rollouts.url
        key = httpx.post(f"{proxy}/rollouts", json={}).json()["key"]
        seen["key"] = key
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4}
        seen["status"] = httpx.post(f"{proxy}/r/{key}/v1/chat/completions", json=body,
                                    timeout=120).status_code

    def wrapped(iterator) -> None:
        if transfer.version == 1:  # v1 is served: this swap brings v2
            thread = threading.Thread(target=call)
            thread.start()
            time.sleep(1.0)
            seen["waited_for_swap"] = thread.is_alive() and rollouts.proxy.gate.held
            send(iterator)
            transfer.resume()  # what TRL calls next; idempotent for the gate
            thread.join(120)
            return
        send(iterator)

    transfer.send_weights = wrapped
    return seen


def _sample_across_the_first_swap(transfer, rollouts, first_step: int) -> None:
    """Wraps the transfer's `pause`: the first swap after an optimizer step waits until a
    rollout the first step did not consume (more than `first_step` rollouts) has sampled a
    turn with v1, so some group is always stale by the second step, however fast the
    trainer steps or slow the harnesses start (a run where every later rollout began after
    the swap had nothing stale to drop)."""
    import time

    pause = transfer.pause

    def sampled_with_v1() -> int:
        return len({t.rollout for t in rollouts.store.iter_turns(bodies=False)
                    if t.weight_version == "v1"})

    def wrapped() -> None:
        if transfer.version == 1:  # v1 is served: this swap brings v2
            deadline = time.monotonic() + 120
            while sampled_with_v1() <= first_step and time.monotonic() < deadline:
                time.sleep(0.1)
        pause()

    transfer.pause = wrapped


def _vllm_logprobs(url: str, prompt: list[int], n: int = 8) -> tuple[list[int], list[float]]:
    import httpx

    body = {"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0,
            "logprobs": 0, "return_token_ids": True, "ignore_eos": True}
    choice = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    return list(choice["token_ids"]), list(choice["logprobs"]["token_logprobs"])


def _hf_logprobs(model, prompt: list[int], completion: list[int]) -> list[float]:
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(
        1, torch.tensor(completion)[:, None])[:, 0].tolist()


@pytest.mark.vllm
@pytest.mark.slow
def test_async_grpo_trains_every_chain_with_weight_swaps_and_drops_stale_rows(
        vllm_dev, tiny_model, tmp_path):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from harnessrl.proxy.engines.vllm import VLLMEngine
    from harnessrl.rollout.runner import RolloutSettings
    from harnessrl.rollout.tasks.task import load_tasks
    from harnessrl.train.async_grpo.batches import group_trainer
    from harnessrl.train.async_grpo.transfer import FileWeightTransfer, install_cpu_support
    from harnessrl.train.async_grpo.worker import HarnessRolloutWorker
    from harnessrl.train.trl import HarnessRollouts, on_policy_sampling
    from harnessrl.train.trl_compat import async_trl
    from harnessrl.train.weights import VLLMWeightSync

    AsyncGRPOConfig, AsyncGRPOTrainer = async_trl().config, async_trl().trainer

    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("\n".join(json.dumps(t) for t in [
        {"id": "finish", "instruction": "Finish the job", "verify": ["test -f done.txt"],
         "solution": ["touch done.txt"]},
        {"id": "report", "instruction": "Report back", "verify": ["test -f done.txt"],
         "solution": ["touch done.txt"]}]))
    tasks = load_tasks(tasks_file)
    url = vllm_dev.url
    sync = VLLMWeightSync(url, tmp_path / "weights")
    transfer = FileWeightTransfer(sync, tiny_model)
    rollouts = HarnessRollouts(
        tasks=tasks, harnesses=[agent("chat", script), agent("compact", script)],
        engine=VLLMEngine(url), run_dir=tmp_path / "run", pad_token_id=0,
        sampling=on_policy_sampling(max_tokens=8),
        settings=RolloutSettings(retries=0, hide_host=False))
    worker = HarnessRolloutWorker(rollouts, num_generations=2, max_inflight=4,
                                  max_staleness=0, transfer=transfer,
                                  **EVERY_ROW)
    install_cpu_support()
    args = AsyncGRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=4,
        num_generations=2, learning_rate=5e-2, use_cpu=True, bf16=False, dtype="float32",
        report_to="none", logging_steps=1, save_strategy="no", token_budget=0,
        max_staleness=0, vllm_server_base_url=url, seed=0, disable_tqdm=True)
    trainer = group_trainer(AsyncGRPOTrainer, groups_per_step=2, scale="group")(
        model=str(tiny_model), args=args, rollout_worker=worker, weight_transfer=transfer,
        train_dataset=Dataset.from_dict({"prompt": [t.id for t in tasks]}))
    during_swap = _call_during_second_swap(transfer, rollouts)
    _sample_across_the_first_swap(transfer, rollouts, first_step=2 * 2)  # groups x samples
    consumed = []
    get = worker.rollout_buffer.get
    def take(*a, **k):  # a whole group; its rows are what is consumed
        item = get(*a, **k)
        consumed.extend(item.samples)
        return item

    worker.rollout_buffer.get = take
    trainer.train()
    store = rollouts.store  # a reader, still usable after the worker closed it
    reports = list(worker.reports)
    served = sync.served_version()
    ids, vllm_lp = _vllm_logprobs(url, [1, 2, 3, 4, 5, 6, 7, 8])
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "weights", dtype=torch.float32)
    hf_lp = _hf_logprobs(saved, [1, 2, 3, 4, 5, 6, 7, 8], ids)
    trained = dict(trainer.accelerator.unwrap_model(trainer.model).named_parameters())

    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    print("\nasync grpo:", {"steps": trainer.state.global_step, "stats": dict(worker.stats),
                            "gate_waits": [round(w, 2) for w in rollouts.proxy.gate.waits],
                            "swap_seconds": [round(s, 2) for s in transfer.seconds],
                            "trl_dropped": [e.get("sample/dropped_stale_total") for e in logs],
                            "rows_per_rollout": [e.get("harnessrl/rows_per_rollout")
                                                 for e in logs]})
    assert trainer.state.global_step == 3 and len(logs) == 3
    # versions advance: the cold sync and one per step, vLLM reports the last, and vLLM's
    # logprobs are the trainer's weights' (saved as the trainer holds them) to 1e-4
    assert transfer.version == 4 and served == "v4" and len(transfer.seconds) == 4
    for name, tensor in saved.named_parameters():
        assert torch.equal(tensor, trained[name].detach()), name
    assert max(abs(a - b) for a, b in zip(hf_lp, vllm_lp, strict=True)) < 1e-4

    # every chain with a sampled token of every scored rollout became a row, id for id
    rows = [row for report in reports for row in report.rows]
    for report in reports:
        for outcome in report.outcomes:
            turns = store.turns(outcome.rollout)
            expected = sorted((s.turns, (*s.prompt_ids, *s.completion_ids))
                              for s in rows_of(turns)) if outcome.status == "done" else []
            got = sorted((r.turns, r.input_ids) for r in report.rows
                         if r.rollout == outcome.rollout)
            assert got == expected
    compacted = [r for r in rows if r.rollout in {
        o.rollout for rep in reports for o in rep.outcomes if o.harness == "agent-compact"}]
    by_rollout = {r.rollout for r in compacted}
    assert len(compacted) >= 2 * len(by_rollout) > 0, "the compacting agent gave one row each"
    # what the trainer consumed is exactly rows we queued: same ids, trained where sampled
    queued = {r.input_ids for r in rows if r.fate == "queued"}
    assert consumed and all(tuple(s.input_ids.tolist()) in queued for s in consumed)
    # stale rows: dropped and counted, here or in TRL's queue, never trained
    trl_dropped = sum(e.get("sample/dropped_stale_total") or 0 for e in logs)
    assert worker.stats["rows_stale"] + trl_dropped > 0
    assert {r.fate for r in rows} <= {"queued", "stale"}
    # calls made during a swap waited and then succeeded; turns name the version that
    # sampled them, and later versions sampled later turns
    versions = {t.weight_version for r in reports for o in r.outcomes
                for t in store.turns(o.rollout)}
    assert {"v1", "v2"} <= versions and versions <= {"v1", "v2", "v3", "v4"}
    assert all(t.status == "ok" for r in reports for o in r.outcomes
               for t in store.turns(o.rollout))
    # the call made while the weights were being swapped waited for the swap, then
    # succeeded, sampled by the new weights
    assert during_swap["status"] == 200 and during_swap["waited_for_swap"]
    [turn] = store.turns(during_swap["key"])
    assert turn.status == "ok" and turn.weight_version == "v2"


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(("grpo", "named"), [
    ('trainer = "async"\nmax_staleness = -1', "max_staleness"),
    ('trainer = "async"\nmax_inflight = 0', "max_inflight"),
    ('trainer = "async"\nmax_inflite = 4', "max_inflite"),
    ('trainer = "later"', "trainer"),
])
def test_invalid_async_config_is_refused_naming_the_field(tmp_path, grpo, named):
    from harnessrl.train.config import ConfigError, load_config

    path = tmp_path / "train.toml"
    path.write_text(f"[grpo]\n{grpo}\n")
    with pytest.raises(ConfigError, match=named):
        load_config(path)


@pytest.mark.slow  # imports TRL's async trainer, which imports vLLM (~20-50 s)
def test_trl_keys_async_grpo_does_not_have_are_refused_before_anything_starts(tmp_path):
    from rich.console import Console

    from harnessrl.train.config import load_config
    from harnessrl.train.loop import train

    path = tmp_path / "train.toml"
    path.write_text(f'run_dir = "{tmp_path / "run"}"\n[model]\npath = "/nonexistent"\n'
                    '[rollout]\ntasks = "bundled:create-hello-file"\n'
                    '[grpo]\ntrainer = "async"\ntasks_per_step = 1\n'
                    '[grpo.trl]\nloss_type = "dapo"\n')
    # refused before the model is looked up or vLLM started (the model path is bogus)
    with pytest.raises(ValueError, match="loss_type"):
        train(load_config(path), console=Console(file=open(os.devnull, "w")))  # noqa: SIM115
