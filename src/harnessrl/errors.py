"""One error tree for the whole proxy.

Code raises these with a message that says what to fix; each dialect renders them in its
own error shape (see `render_error` in every dialect module), so the mapping from kind to
native status and type lives in one table per dialect.
"""

from __future__ import annotations

from typing import Literal

ErrorKind = Literal[
    "invalid_request",
    "authentication",
    "permission",
    "not_found",
    "too_large",
    "rate_limit",
    "step_cap",
    "engine_error",
    "engine_unavailable",
    "timeout",
    "internal",
]


class HarnessRLError(Exception):
    """Base of every error the proxy reports to a client."""

    kind: ErrorKind = "internal"
    status: int = 500

    def __init__(self, message: str, *, param: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if status is not None:
            self.status = status


class InvalidRequest(HarnessRLError):
    kind = "invalid_request"
    status = 400


class AuthenticationFailed(HarnessRLError):
    kind = "authentication"
    status = 401


class UnsupportedCoding(InvalidRequest):
    """A request body in a content coding the proxy cannot undo (`proxy/wire/codings.py`):
    HTTP's 415, in each dialect's shape for a request error."""

    status = 415


class CorruptCoding(InvalidRequest):
    """A request body in a content coding that does not decode: damaged, cut short, or
    with data after its end (`proxy/wire/codings.py`)."""


class NotFound(HarnessRLError):
    kind = "not_found"
    status = 404


class TooLarge(HarnessRLError):
    kind = "too_large"
    status = 413


class StepCapReached(HarnessRLError):
    """The rollout made as many model calls as its `max_model_calls` allows. A 400, not a
    429: a harness must not retry it (every SDK and CLI retries a 429 with backoff)."""

    kind = "step_cap"
    status = 400


class EngineError(HarnessRLError):
    """The engine answered with an error of its own; `status` is the engine's (4xx passes)."""

    kind = "engine_error"
    status = 502


class EngineUnavailable(HarnessRLError):
    kind = "engine_unavailable"
    status = 503


class WorkerUnavailable(EngineUnavailable):
    """`serve --workers N`: the proxy worker that holds the rollout does not answer (it
    died and is being restarted). Its kind is the engine's: to the client, the service
    is unavailable for now."""


class EngineTimeout(HarnessRLError):
    kind = "timeout"
    status = 504


class StoreFailed(HarnessRLError):
    """The trace store could not commit a turn (a full disk, say): the call is not done."""

    kind = "internal"
    status = 500


class StoreCorrupt(HarnessRLError):
    """A stored turn cannot be rebuilt exactly (a damaged blob, a missing parent turn):
    the read fails naming the turn, never returning a different one."""

    kind = "internal"
    status = 500


class CommandError(Exception):
    """A command cannot go on for a reason its user can act on (not a client's error):
    `harnessrl` prints the message as one line and exits with code 2, no traceback."""


class ModelUnavailable(CommandError):
    """A model named to a command cannot be loaded: what was asked and why not."""


class EngineStartFailed(CommandError):
    """A vLLM started for a command died or never became healthy while starting."""


class UnknownBackend(CommandError, ValueError):
    """A sandbox backend named in a config, a flag or a call that the registry
    (`rollout/sandbox/registry.py`) does not have; the message lists the known ones. A
    ValueError too, so a config's validation reports it at the field that named it."""
