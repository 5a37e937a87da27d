"""The proxy's own settings (`harnessrl serve`'s flags), apart from the app that reads
them, so the route modules the app mounts can take them without importing the app."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from harnessrl.settings import flag

MIB = 1024 * 1024


@dataclass
class ProxySettings:
    max_body_bytes: Annotated[int, flag(None, "--max-body-mb", parse=float,
                                        scale=1 / MIB)] = 32 * MIB
    strict_model: Annotated[bool, flag(
        "reject model names the engine does not serve (default: map them)")] = False
    admin_token: Annotated[str | None, flag(
        "required on /rollouts endpoints (and for non-loopback binds)")] = None
