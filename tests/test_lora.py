"""LoRA as a training option (train/lora.py), the fast parts: the `[lora]` settings and
what they refuse, and RUN_DIR/model's merged model (the tiny model with an adapter whose
B is not zero: the merged model's logits are the adapted model's, and the trainer's
adapter is left unmerged). The end to end run with real vLLM is tests/test_lora_vllm.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from harnessrl.train.config import TrainSettings
from harnessrl.train.lora import LoraSettings, peft_config


def _config(raw: dict) -> TrainSettings:
    return msgspec.convert(raw, type=TrainSettings)


def test_lora_section_defaults_and_peft_config():
    config = _config({"lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj"]}})
    assert config.lora is not None
    assert config.lora == LoraSettings(rank=4, alpha=8, target_modules=["q_proj"])
    peft = peft_config(config.lora)
    assert (peft.r, peft.lora_alpha, set(peft.target_modules), peft.bias) == (
        4, 8, {"q_proj"}, "none")
    assert _config({}).lora is None  # absent: full fine-tuning
    defaults = LoraSettings()
    assert (defaults.rank, defaults.alpha, defaults.dropout) == (16, 32, 0.0)
    assert "lm_head" not in defaults.target_modules


@pytest.mark.parametrize(("raw", "named"), [
    ({"lora": {"target_modules": ["lm_head"]}}, "lora.target_modules"),
    ({"lora": {"target_modules": []}}, "lora.target_modules"),
    ({"lora": {"rank": 0}}, "rank"),
    ({"lora": {"ranks": 8}}, "ranks"),
    ({"lora": {}, "grpo": {"trainer": "sync"}}, 'grpo.trainer = "async"'),
    ({"lora": {}, "grpo": {"weight_transfer": "trl"}}, "grpo.weight_transfer"),
])
def test_bad_lora_settings_are_refused_naming_the_field(raw, named):
    with pytest.raises((ValueError, msgspec.ValidationError), match=named.replace(".", r"\.")):
        _config(raw)


def test_fingerprint_names_the_lora_settings_only_for_a_lora_run():
    from harnessrl.train.runs.checkpoint import differences, fingerprint

    full = fingerprint(_config({}), ["t1"])
    assert "lora" not in full  # a full fine-tuning checkpoint of before resumes as it did
    lora = fingerprint(_config({"lora": {"rank": 8}}), ["t1"])
    other = fingerprint(_config({"lora": {"rank": 4}}), ["t1"])
    assert differences(lora, other) and differences(lora, full)


def test_merged_model_is_the_adapted_model_and_the_adapter_stays_unmerged(
        tiny_model: Path, tokenizer, tmp_path: Path):
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from harnessrl.train.lora import is_lora, save_merged

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model = get_peft_model(base, peft_config(LoraSettings(rank=4, alpha=8)))
    with torch.no_grad():  # a trained adapter: B is 0 at init, which would merge to nothing
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([[1, 5, 9, 14, 3, 27]])
    with torch.no_grad():
        want = model(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)(
            ids).logits
    assert not torch.allclose(want, plain, atol=1e-4)  # the adapter changes the output

    trainer = SimpleNamespace(accelerator=SimpleNamespace(unwrap_model=lambda m: m),
                              model=model, processing_class=tokenizer)
    assert is_lora(model) and not is_lora(base)
    save_merged(trainer, tmp_path / "model")

    names = {p.name for p in (tmp_path / "model").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= names
    assert not names & {"adapter_model.safetensors", "adapter_config.json"}
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32)
    assert not any("lora" in k or "base_layer" in k for k in merged.state_dict())
    with torch.no_grad():
        got = merged(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the trainer goes on training the adapter, not merged weights
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(getattr(m, "merged", False) for m in model.modules())


def test_a_lora_checkpoint_is_refused_as_a_model_naming_the_merged_one(tmp_path: Path):
    from harnessrl.train.runs.checkpoint import CheckpointError, model_dir_of

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"LoRA adapter, not a model.*RUN_DIR/model"):
        model_dir_of(adapter)
