"""LoRA end to end on a CPU: `harnessrl train` with `[lora]` (async trainer, real vLLM
serving the tiny model, scripted agents that are real processes calling the proxy), killed
with SIGKILL once its step-2 checkpoint is whole, then `--resume latest` for step 3.

- the checkpoint holds the adapter and its optimizer state (no full weights), and the
  resumed trainer starts from exactly those tensors;
- after the last step vLLM's logprobs for a fixed prompt are the trainer's (the merged
  weights arrived), and they are not the base model's (the adapter trained: B moved off 0);
- RUN_DIR/model is a plain merged model: a second vLLM serves it with the same logprobs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from rich.console import Console

from tests import long_run_agent
from tests.helpers import EVERY_REPLY_TRAINED, train_toml
from tests.test_async_grpo import _hf_logprobs, _vllm_logprobs
from tests.test_long_runs_vllm import Probe, _run_until_checkpoint

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
TASKS = [{"id": f"t{i}", "instruction": f"Finish job {i}", "verify": ["test -f done.txt"],
          "timeout": 120} for i in range(4)]


def _config(tmp_path: Path, model: Path, url: str) -> Path:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps(t) for t in TASKS))
    # 4 rollouts a group: the agent passes on a coin flip, and a group that scores alike
    # has no gradient (1 in 8 per group; the test needs one step with one)
    return train_toml(
        tmp_path / "train.toml", run_dir=tmp_path / "run", model=model, url=f"{url}/v1",
        max_tokens=8, harnesses=["agent-chat"], tasks=tasks, rollout={"concurrency": 4},
        grpo={**EVERY_REPLY_TRAINED, "trainer": "async", "steps": 3, "num_generations": 4,
              "tasks_per_step": 1, "max_inflight": 4, "max_staleness": 8,
              "learning_rate": 5e-3},
        checkpoint={"every_steps": 2, "keep": 2},
        lora={"rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj", "down_proj"]})


def _with_plain_attention(trained, base_dir: Path):
    """The trainer's PEFT model (base and adapter tensors as it holds them) on a fresh copy
    of the base: the trainer's own runs TRL's packed tree attention, which needs TRL's
    batch layout."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    fresh = get_peft_model(base, trained.peft_config["default"])
    fresh.load_state_dict(trained.state_dict(), strict=True)
    return fresh.eval()


class LastModel:
    """The trainer's model when training ends (after the last weight sync)."""

    def __init__(self) -> None:
        self.model = None

    def callback(self):
        from transformers import TrainerCallback

        last = self

        class OnEnd(TrainerCallback):
            def on_train_end(self, args, state, control, model=None, **_):
                last.model = model

        return OnEnd()


def _assert_adapter_loaded_exactly(seen: dict, checkpoint: Path) -> None:
    """The checkpoint's adapter tensors and optimizer state are the resumed trainer's."""
    import torch
    from safetensors.torch import load_file

    saved = load_file(str(checkpoint / "adapter_model.safetensors"))
    assert saved and all(".lora_" in k for k in saved)
    params = seen["params"]
    for name, tensor in saved.items():  # PEFT saves without the adapter's name
        live = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(
            ".lora_B.weight", ".lora_B.default.weight")
        assert torch.equal(tensor, params[live]), name
    assert any(t.abs().sum() > 0 for k, t in saved.items() if "lora_B" in k), (
        "B is still 0 at step 2: no step had a gradient")
    want = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    got = seen["optimizer"]
    assert want["param_groups"] == got["param_groups"]
    # one Adam slot per adapter tensor, none for the frozen base
    assert len(want["state"]) == len(saved) and want["state"].keys() == got["state"].keys()
    for index, slots in want["state"].items():
        for key, value in slots.items():
            assert torch.equal(value, got["state"][index][key]), (index, key)


@pytest.mark.vllm
@pytest.mark.slow
def test_lora_run_syncs_merged_weights_resumes_the_adapter_exactly_and_serves(
        vllm_tiny, tiny_model, tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    from harnessrl.proxy.engines.vllm_server import VLLMServer
    from harnessrl.train.config import load_config
    from harnessrl.train.loop import train
    from tests.helpers import CACHE

    config_path = _config(tmp_path, tiny_model, vllm_tiny.url)
    run = tmp_path / "run"
    root = run / "checkpoints"
    _run_until_checkpoint(config_path, root, 2)
    checkpoint = root / "checkpoint-2"
    names = {p.name for p in checkpoint.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt"} <= names
    assert "model.safetensors" not in names  # the adapter, not the weights
    adapter_bytes = (checkpoint / "adapter_model.safetensors").stat().st_size
    assert adapter_bytes < (tiny_model / "model.safetensors").stat().st_size / 5

    import harnessrl.harnesses as registry

    known = registry.get
    monkeypatch.setattr(registry, "get", lambda name: long_run_agent.harness(name)
                        if name.startswith("agent-") else known(name))
    probe, last = Probe(), LastModel()
    steps = train(load_config(config_path), console=QUIET, resume="latest",
                  callbacks=[probe.callback(), last.callback()])

    assert [s["step"] for s in steps] == [3] and probe.seen["step"] == 2
    _assert_adapter_loaded_exactly(probe.seen, checkpoint)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    for line in lines:  # every step says what the sync sent and how long it took
        assert line["trl"]["lora/merged_sync"] == 1.0 and line["trl"]["lora/rank"] == 8.0
        assert line["trl"]["perf/weight_sync_s"] > 0

    # vLLM serves the trainer's policy (adapter merged): its logprobs are the trainer's
    ids, vllm_lp = _vllm_logprobs(vllm_tiny.url, PROMPT)
    assert last.model is not None and hasattr(last.model, "peft_config")
    policy = _with_plain_attention(last.model, tiny_model)
    trainer_lp = _hf_logprobs(policy, PROMPT, ids)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    base_lp = _hf_logprobs(base, PROMPT, ids)
    drift = max(abs(a - b) for a, b in zip(trainer_lp, vllm_lp, strict=True))
    moved = max(abs(a - b) for a, b in zip(base_lp, vllm_lp, strict=True))
    print("\nlora:", {"adapter_bytes": adapter_bytes, "vllm_vs_trainer": drift,
                      "vllm_vs_base": moved,
                      "sync_s": [round(x["trl"]["perf/weight_sync_s"], 3) for x in lines]})
    assert drift < 1e-4
    assert moved > 1e-3, "vLLM still serves the base model's logprobs"

    # RUN_DIR/model: a plain model (no adapter files), served by vLLM as it is
    model = run / "model"
    names = {p.name for p in model.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= names
    assert not names & {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt"}
    server = VLLMServer(model=str(model), served_name="tiny", dtype="float32",
                        max_model_len=4096, extra_args=["--seed", "0"],
                        log_path=CACHE / "vllm-lora-model-test.log")
    started = time.monotonic()
    with server:
        served_ids, served_lp = _vllm_logprobs(server.url, PROMPT)
    print("lora: RUN_DIR/model served in", round(time.monotonic() - started, 1), "s")
    assert served_ids == ids
    assert max(abs(a - b) for a, b in zip(served_lp, trainer_lp, strict=True)) < 1e-4
