"""What several commands share: the default run directory, argument types, the loopback test
and the harness lookup by name."""

from __future__ import annotations

import argparse
import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING

from harnessrl.settings import flag, from_flags
from harnessrl.types import Sampling

if TYPE_CHECKING:
    from harnessrl.harnesses.base import Harness

DEFAULT_RUN_DIR = Path("runs/default")


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


# The sampling policy's flags (serve, run, eval): `Sampling` is the wire's vocabulary
# (types.py) and knows nothing of the command line.
SAMPLING_FLAGS = {
    "temperature": flag("override the harness's temperature"),
    "top_p": flag(),
    "top_k": flag(),
    "max_tokens": flag("override the harness's max tokens per call"),
}


def sampling_from_flags(args: argparse.Namespace) -> Sampling | None:
    """The sampling policy the command's flags set (None: none set)."""
    sampling = from_flags(Sampling, args, flags=SAMPLING_FLAGS)
    return None if sampling == Sampling() else sampling


# How the model is rendered and its replies parsed (`proxy/engines/token/formats.py`), the
# same EngineSettings flags in serve, run and eval: vLLM's parser names (given to a vLLM started
# here in chat mode; used by the proxy in token mode), a `renderers` family, and a chat
# template and its kwargs (sent to vLLM with each call in chat mode).
FORMAT = ("tool_call_parser", "reasoning_parser", "renderer", "chat_template",
          "chat_template_kwargs")
