"""A tiny, randomly initialised Qwen2 model for tests and offline demos.

Everything is built locally (tokenizer trained on the Python standard library,
weights drawn from a seeded RNG), so no hub access is ever needed and two
builds on the same machine are byte-identical.
"""

from __future__ import annotations

import json
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harnessrl.models.template import HERMES_TEMPLATE

PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)
# Non-special on purpose: they must survive decoding (skip_special_tokens=True)
# because vLLM's hermes parser and reasoning parsers work on the decoded text.
MARKUP_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
VOCAB_SIZE = 4096  # tokenizer size including special and markup tokens
MARKER_NAME = ".harnessrl-build.json"
# Long enough for real harness prompts (Claude Code's alone is tens of thousands of tokens
# in this small vocabulary); RoPE has no position table, so the size does not grow.
MAX_POSITIONS = 65536
_TINY_FORMAT = 2  # bump when the recipe changes so stale builds are rebuilt
_CORPUS_FILES = 200
_CORPUS_BYTES = 3_000_000  # enough for a 4k vocab, keeps training ~1-2 s


def build_tiny_model(out_dir: Path, *, seed: int = 0) -> Path:
    """Build (or reuse) the tiny Qwen2 model in ``out_dir`` and return ``out_dir``.

    The directory holds safetensors weights, a fast tokenizer carrying
    :data:`HERMES_TEMPLATE`, and a generation config whose eos is ``<|im_end|>``:
    loadable by both transformers and vLLM.
    """
    out_dir = Path(out_dir)
    info = {"model": "tiny-qwen2", "format": _TINY_FORMAT, "seed": seed}
    if read_marker(out_dir) == info:
        return out_dir
    with staged_build(out_dir, info) as tmp:
        tokenizer = _build_tokenizer()
        tokenizer.save_pretrained(tmp)
        model = _build_model(tokenizer, seed)
        model.save_pretrained(tmp)
    return out_dir


def _corpus_files() -> list[Path]:
    """The first stdlib modules by name: present everywhere, stable per Python build."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.is_file())[:_CORPUS_FILES]
    if not files:
        raise RuntimeError(f"no Python sources found under {stdlib} to train a tokenizer on")
    return files


def _corpus() -> Iterator[str]:
    budget = _CORPUS_BYTES
    for path in _corpus_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        yield text[:budget]
        budget -= len(text)
        if budget <= 0:
            return


def _build_tokenizer() -> Any:
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # transformers (and so vLLM) load any model_type=qwen2 tokenizer through
    # Qwen2Tokenizer, which re-imposes Qwen's normaliser and pre-tokeniser; we
    # train with exactly those so every loader tokenises identically.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _qwen2_pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(MARKUP_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=HERMES_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS,
    )


def _qwen2_pre_tokenizer() -> Any:
    from tokenizers import Regex, pre_tokenizers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            # add_prefix_space=False keeps encode/decode an exact round trip.
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def padded_vocab_size(n_tokens: int, multiple: int = 64) -> int:
    return -(-n_tokens // multiple) * multiple


def _build_model(tokenizer: Any, seed: int) -> Any:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    config = Qwen2Config(
        vocab_size=padded_vocab_size(len(tokenizer)),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # pyright: ignore[reportCallIssue]  (Qwen2Config takes **kwargs)
        intermediate_size=256,
        max_position_embeddings=MAX_POSITIONS,
        # Untied so a trainer's lm_head update can be pushed into vLLM exactly.
        tie_word_embeddings=False,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32).eval()  # pyright: ignore[reportArgumentType]
    # Only token ids: vLLM turns any sampling field found here into request defaults.
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id
    )
    return model


def read_marker(out_dir: Path) -> dict[str, Any] | None:
    """The build info of a finished build in ``out_dir``, or None."""
    try:
        return json.loads((Path(out_dir) / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None


@contextmanager
def staged_build(out_dir: Path, info: dict[str, Any]) -> Iterator[Path]:
    """Yield an empty staging dir; on success publish it as ``out_dir`` atomically.

    The marker is written last, into the staging dir, and the dir is renamed
    into place, so ``out_dir`` is either absent, a previous build, or complete.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        yield tmp
        (tmp / MARKER_NAME).write_text(json.dumps(info, sort_keys=True) + "\n")
        _publish(tmp, out_dir, info)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, out_dir: Path, info: dict[str, Any]) -> None:
    if out_dir.exists():
        if read_marker(out_dir) == info:
            return  # a concurrent builder won the race; its result is as good as ours
        if read_marker(out_dir) is None and any(out_dir.iterdir()):
            raise FileExistsError(f"{out_dir} exists and is not a harnessrl model build")
        # A stale build (other seed/recipe) or an empty dir: move it aside first.
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".old", dir=out_dir.parent))
        os.replace(out_dir, old / "build")
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.rename(tmp, out_dir)
    except OSError:
        if read_marker(out_dir) != info:
            raise
