"""What several commands share: the default run directory, argument types, the loopback test
and the harness lookup by name."""

from __future__ import annotations

import argparse
import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING

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
