"""Rollout keys and the little state each open rollout needs in memory.

A key is "hrl-" and 192 random bits (URL-safe base64). Everything else about a rollout
lives in the store; memory holds only its record (key, sampling policy, metadata, step
cap), the next turn index, the model calls counted against its cap and the argument text
of the tool calls the proxy issued (to restore it when a dialect's wire loses it), so an
idle rollout costs a few hundred bytes.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from harnessrl.errors import AuthenticationFailed, StepCapReached
from harnessrl.store.writer import TraceStore
from harnessrl.types import Rollout, Sampling, ToolCall

# How many of a rollout's latest request bodies are remembered (by length and CRC-32) for
# telling which earlier turn a client's retry repeats. A CRC, not a cryptographic digest:
# it runs 4x faster (29 against 131 µs for a 100 KB body) on every call, and two of 64
# bodies sharing one by chance (~1 in 2 million) matters only to a call sent as a retry.
RECENT_BODIES = 64


@dataclass(slots=True)
class OpenRollout:
    record: Rollout
    next_index: int
    # model calls counted against `record.max_model_calls`: every one the proxy took, answered
    # or refused for its input; only the calls refused for the cap itself are not counted
    calls: int = 0
    # call id -> the argument text the model sampled, to restore it when a dialect's wire
    # loses the exact text (see proxy/wire/history.py)
    issued_calls: dict[str, str] = field(default_factory=dict)
    # (length, CRC-32) of each of the latest request bodies -> the turn that sent it last
    bodies: dict[tuple[int, int], int] = field(default_factory=dict)

    def attempt(self, body: bytes, index: int, retry_count: int | None) -> int | None:
        """Notes `body` as turn `index`'s request; returns the earlier turn that sent the
        same body when the client says this call is a retry (`retry_count` of 1 or
        more), else None. Only a client's own count makes a repeat a retry: a harness
        may well send one request twice on purpose."""
        digest = len(body), zlib.crc32(body)
        earlier = self.bodies.pop(digest, None)
        self.bodies[digest] = index
        if len(self.bodies) > RECENT_BODIES:
            del self.bodies[next(iter(self.bodies))]
        return earlier if retry_count else None

    def take_index(self) -> int:
        index, self.next_index = self.next_index, self.next_index + 1
        return index

    def count_call(self) -> None:
        """Counts one more model call, or raises `StepCapReached` when the rollout has
        made all its cap allows. Checked and counted in one step (no await between), so
        calls arriving together cannot both take the last one."""
        cap = self.record.max_model_calls
        if cap is not None and self.calls >= cap:
            raise StepCapReached(
                f"this rollout has made {self.calls} model calls, its cap "
                f"(max_model_calls = {cap}); this call was not sent to the model")
        self.calls += 1

    def remember_calls(self, calls: list[ToolCall]) -> None:
        for call in calls:
            self.issued_calls[call.id] = call.arguments


def new_key() -> str:
    return "hrl-" + secrets.token_urlsafe(24)  # 192 bits


class Sessions:
    def __init__(self, store: TraceStore, *, sampling: Sampling | None = None,
                 unset_sampling: frozenset[str] = frozenset(),
                 max_model_calls: int | None = None) -> None:
        if max_model_calls is not None and max_model_calls <= 0:
            raise ValueError(f"max_model_calls must be at least 1, got {max_model_calls}")
        self.store = store
        self.default_sampling = sampling
        self.default_unset = unset_sampling
        self.default_max_model_calls = max_model_calls
        self._open: dict[str, OpenRollout] = {}
        # `serve --workers N` sets one that makes only keys its worker owns
        self.key_factory: Callable[[], str] = new_key

    async def create(self, *, sampling: Sampling | None = None,
                     unset_sampling: tuple[str, ...] | None = None,
                     metadata: dict | None = None,
                     max_model_calls: int | None = None) -> Rollout:
        """A new rollout; None for a setting means the server's default."""
        record = Rollout(
            key=self.key_factory(), created=time.time(),
            sampling=sampling if sampling is not None else self.default_sampling,
            unset_sampling=tuple(sorted(
                self.default_unset if unset_sampling is None else unset_sampling)),
            metadata=metadata or {},
            max_model_calls=(max_model_calls if max_model_calls is not None
                             else self.default_max_model_calls),
        )
        await self.store.put_rollout(record)
        self._open[record.key] = OpenRollout(record, 0)
        return record

    async def resolve(self, key: str | None) -> OpenRollout:
        """The open rollout for `key`, loaded from the store after a restart."""
        if not key:
            raise AuthenticationFailed(
                "no rollout key: call POST /rollouts and use /r/<key>/... or send the key "
                "as the API key")
        found = self._open.get(key)
        if found is not None:
            return found
        record, next_index, calls = await asyncio.to_thread(self._load, key)
        if record is None or record.closed is not None:
            raise AuthenticationFailed("unknown or closed rollout key; create one with "
                                       "POST /rollouts")
        return self._open.setdefault(key, OpenRollout(record, next_index, calls))

    def _load(self, key: str) -> tuple[Rollout | None, int, int]:
        return self.store.rollout(key), self.store.next_index(key), self.store.model_calls(key)

    async def close(self, key: str) -> Rollout:
        current = await self.resolve(key)
        closed = msgspec.structs.replace(current.record, closed=time.time())
        await self.store.put_rollout(closed)
        self._open.pop(key, None)
        return closed

    def policy(self, rollout: OpenRollout, requested: Sampling) -> Sampling:
        record = rollout.record
        return requested.override(record.sampling, frozenset(record.unset_sampling))

    def __len__(self) -> int:
        return len(self._open)

