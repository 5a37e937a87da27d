"""What several commands share: the default run directory, argument types, the loopback test
and the harness lookup by name."""

from __future__ import annotations

import argparse
import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harnessrl.harnesses.base import Harness

DEFAULT_RUN_DIR = Path("runs/default")


def interval_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"milliseconds from 0 to 1000, got {text!r}")
    return value


def at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer of at least 1, got {text!r}")
    return value


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def harnesses(names: list[str]) -> list[Harness]:
    """The named harnesses, or every known one when none is named."""
    from harnessrl.harnesses import all_harnesses, get

    return [get(n) for n in names] if names else all_harnesses()


def add_format_arguments(p: Any) -> None:
    """How the model is rendered and its replies parsed (`proxy/engines/token/formats.py`):
    vLLM's parser names (given to a vLLM started here in chat mode; used by the proxy in
    token mode), a `renderers` family, and chat-template kwargs."""
    p.add_argument("--engine-mode", choices=["chat", "token"], default="chat",
                   help="chat: vLLM renders the chat template and parses tool calls; token: "
                        "the proxy renders with the model's tokenizer, reuses a rollout's "
                        "earlier token ids, and parses replies itself")
    p.add_argument("--tool-call-parser", help="vLLM's tool-call parser name (e.g. hermes, "
                   "qwen3_coder, lfm2, llama3_json); default: from the model")
    p.add_argument("--reasoning-parser", help="vLLM's reasoning parser name (e.g. qwen3, "
                   "deepseek_r1)")
    p.add_argument("--renderer", help="token mode: a renderers family (qwen3, qwen3.5, "
                   "glm-4.5, kimi-k2, deepseek-v3, llama-3, gpt-oss, ...), or 'default' for "
                   "the model's chat template; default: found from the model")
    p.add_argument("--chat-template-kwargs", type=json_object, default=None, metavar="JSON",
                   help="token mode: template options, e.g. '{\"enable_thinking\": false}' "
                        "or '{\"thinking_retention\": \"all\"}' (keep earlier reasoning)")


def json_object(text: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("a JSON object is needed, e.g. '{\"a\": 1}'")
    return value


def format_settings(args: Any) -> dict[str, Any]:
    """EngineSpec fields from `add_format_arguments`' flags."""
    return {"tool_call_parser": args.tool_call_parser,
            "reasoning_parser": args.reasoning_parser, "renderer": args.renderer,
            "chat_template_kwargs": args.chat_template_kwargs}
