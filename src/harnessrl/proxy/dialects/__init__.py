"""The dialects the proxy speaks. Adding one is a module exporting a `DIALECT` and a line
in `DIALECTS`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from harnessrl.proxy.dialects import anthropic, gemini, openai_chat, openai_responses
from harnessrl.proxy.dialects.base import Dialect, Route

# In this order a request on a shared path goes to the first dialect whose header it
# carries (`anthropic-version` before `x-goog-api-key`).
DIALECTS: tuple[Dialect, ...] = (
    openai_chat.DIALECT,
    openai_responses.DIALECT,
    anthropic.DIALECT,
    gemini.DIALECT,
)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One method and path, and the dialect routes served there."""

    method: str
    path: str
    routes: tuple[tuple[Dialect, Route], ...]

    def pick(self, headers: Mapping[str, str]) -> tuple[Dialect, Route]:
        """The route of the first dialect whose header the request carries, else the
        path's owner (its route without a header)."""
        return next((c for c in self.routes if c[1].header is not None and c[1].header in headers),
                    next(c for c in self.routes if c[1].header is None))


def endpoints(dialects: tuple[Dialect, ...] = DIALECTS) -> list[Endpoint]:
    """Every method and path the dialects serve, in the order they declare them."""
    shared: dict[tuple[str, str], list[tuple[Dialect, Route]]] = {}
    for dialect in dialects:
        for route in dialect.routes:
            shared.setdefault((route.method, route.path), []).append((dialect, route))
    for (method, path), routes in shared.items():
        if sum(route.header is None for _, route in routes) != 1:
            raise ValueError(f"{method} {path} needs exactly one route without a header")
    return [Endpoint(method, path, tuple(routes)) for (method, path), routes in shared.items()]
