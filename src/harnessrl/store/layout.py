"""How a turn is laid out in the store (schema v5): what is new against an earlier turn
of its rollout, never the whole context again.

- Prompt ids: a turn's prompt is stored against whichever of the rollout's latest turns
  shares the longest prefix with it (that turn's prompt, then its completion): that
  turn's index (`prompt_parent`), how many of its ids it keeps (`prompt_keep`) and the
  ids after them; the full length (`prompt_len`) is checked on read. A prompt that
  shares fewer than `MIN_KEPT` ids with every one of them is stored whole. So a
  rewritten history (a dropped turn, an edited reminder, reasoning removed, tools
  rendered after the messages) costs what changed, not the whole context again.
- Raw request: a delta (`store.delta`) against a base turn's raw request (`body_base`).
- Canonical request: the base turn's messages it starts with are kept by count, the
  rest (new messages, tools, sampling) stored as JSON.
- Raw response: whole, compressed. Completion, completion ids and logprobs: as in v4
  (JSON, packed int32, packed float64), already proportional to what is new.

The writer finds the parent among the rollout's last few committed turns, held in memory
(`Recent`) while the rollout is open; after a restart it reads them from the store once.
A turn's row is encoded before its commit, outside the store's write lock (`Prepared`):
finding the parent and the bodies' shared parts are the compares whose work follows the
context. The commit takes that row if the rollout's latest turns are still the very
objects it was encoded against, and otherwise encodes the turn itself. A row of an older
file (`layout` NULL, schema v4) holds everything whole and reads as it did; a v5 row
written when only an exact extension had a parent reads the same way as one written now
(the reader always took any `prompt_keep`).
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from harnessrl.store import delta
from harnessrl.store.delta import CorruptTurn
from harnessrl.store.rows import pack, row_turn, turn_row, unpack
from harnessrl.types import ChatRequest, Tokens, Turn

LAYOUT = 1
# How many of a rollout's latest turns are tried as the parent (a side call between two
# turns of the main conversation must not cut its chain).
CANDIDATES = 3
# The fewest ids a prompt keeps of its parent: two ids (8 bytes) outweigh the three small
# integers that name the parent, so fewer shared (a first token alone) is stored whole.
MIN_KEPT = 2
# What the kept turns may weigh (`_weight`): this much per rollout in flight (opened and
# not yet closed here: 3 turns at 64k tokens weigh ~9 MB), at least `KEPT_FLOOR` (what the
# rollouts this process did not see opened, after a restart, share). Over it the rollouts
# least recently written are dropped first; a closed rollout is dropped at once.
KEPT_PER_ROLLOUT = 16 * 1024 * 1024
KEPT_FLOOR = 32 * 1024 * 1024
# How many closed rollouts are remembered as closed (a turn still in flight when its
# rollout closed must not bring it back into memory).
CLOSED_KEPT = 4096

_encode = msgspec.json.Encoder().encode
_REQUEST = msgspec.json.Decoder(ChatRequest)


# ------------------------------------------------------------------ writing
def _tokens(turn: Turn) -> Tokens | None:
    return turn.completion.tokens if turn.completion is not None else None


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """The length of the longest common prefix of `a` and `b`: one compare when one
    extends the other (the usual case), else by halving, each probe one compare of the
    part not yet known to match (about two passes over the shorter in all)."""
    hi = min(len(a), len(b))
    if hi == 0 or a[0] != b[0]:
        return 0
    if a[:hi] == b[:hi]:
        return hi
    lo, hi = 1, hi - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _size(turn: Turn) -> int:
    tokens = _tokens(turn)
    if tokens is None or tokens.prompt_ids is None:
        return 0
    return len(tokens.prompt_ids) + len(tokens.completion_ids or ())


def _kept(prompt: tuple[int, ...], turn: Turn) -> int:
    """How many of `turn`'s ids (its prompt, then its completion) `prompt` starts with."""
    tokens = _tokens(turn)
    if tokens is None or not tokens.prompt_ids:
        return 0
    before, sampled = tokens.prompt_ids, tokens.completion_ids or ()
    keep = _common(prompt, before)
    if keep == len(before) and sampled:
        keep += _common(prompt[keep:keep + len(sampled)], sampled)
    return keep


def _parent(prompt: tuple[int, ...], turn: Turn, recent: Sequence[Turn]) -> tuple[Turn, int] | None:
    """The earlier turn `prompt` shares the most leading ids with, and how many; the
    latest wins a tie (the likeliest parent, and the shortest chain to read back)."""
    best, keep = None, MIN_KEPT - 1
    for earlier in reversed(recent):
        # One that holds no more ids than the best so far cannot share more (an exact
        # extension of the latest turn leaves the older ones unread).
        if (earlier.index < turn.index and _size(earlier) > keep
                and (shared := _kept(prompt, earlier)) > keep):
            best, keep = earlier, shared
    return (best, keep) if best is not None else None


def _common_messages(request: ChatRequest, base: ChatRequest) -> int:
    new, old = request.messages, base.messages
    if len(new) >= len(old) and new[:len(old)] == old:
        return len(old)
    shared = 0
    for a, b in zip(new, old, strict=False):
        if a != b:
            break
        shared += 1
    return shared


def _request_blob(request: ChatRequest | None, base: ChatRequest | None) -> bytes | None:
    if request is None:
        return None
    kept = _common_messages(request, base) if base is not None else 0
    if kept == 0:
        return delta.seal(delta.WHOLE, (), _encode(request), compress=True)
    rest = msgspec.structs.replace(request, messages=request.messages[kept:])
    return delta.seal(delta.DELTA, (kept,), _encode(rest))


def encode(turn: Turn, recent: Sequence[Turn]) -> tuple[Any, ...]:
    """The row of `turn` (`rows.READ_COLUMNS`) against `recent`, the
    rollout's latest committed turns, oldest first."""
    row = list(turn_row(turn, whole=False))
    tokens = _tokens(turn)
    prompt = tokens.prompt_ids if tokens is not None else None
    found = _parent(prompt, turn, recent) if prompt else None
    parent, keep = found if found is not None else (None, 0)
    if prompt is not None:
        row[16] = delta.seal(delta.WHOLE, (), pack(prompt[keep:], "i") or b"")
    base = parent or next((t for t in reversed(recent) if t.index < turn.index), None)
    raw_blob, is_delta = delta.encode_body(turn.raw_request,
                                           base.raw_request if base is not None else None)
    request = _request_blob(turn.request, base.request if base is not None else None)
    response = delta.seal(delta.WHOLE, (), turn.raw_response, compress=True)
    row[14], row[19], row[20] = request, raw_blob, response
    against = is_delta or (request is not None and request[0] == delta.DELTA)
    return (*row, LAYOUT, parent.index if parent is not None else None,
            keep if parent is not None else None, len(prompt) if prompt is not None else None,
            base.index if against and base is not None else None)


@dataclass(frozen=True, slots=True)
class Prepared:
    """`turn`'s row (None: not made) encoded before its commit against `against`, its
    rollout's latest committed turns then. `encode` depends on nothing but the turn and
    those turns, and a kept turn is frozen (a cancelled one is replaced by a new object),
    so the row is what the commit would make against the same objects (`is`, not ==);
    against any others (a turn committed since, a rollout read back) the commit encodes
    the turn itself."""

    turn: Turn
    against: tuple[Turn, ...] = ()
    row: tuple[Any, ...] | None = None

    def row_against(self, recent: Sequence[Turn]) -> tuple[Any, ...] | None:
        same = len(recent) == len(self.against) and all(
            a is b for a, b in zip(recent, self.against, strict=True))
        return self.row if same else None


def prepare(turn: Turn, recent: Sequence[Turn] | None) -> Prepared:
    """`turn`'s row against `recent` (its rollout's latest turns, oldest first; None:
    not in memory, nothing prepared: the commit reads them from the store)."""
    if recent is None:
        return Prepared(turn)
    against = tuple(recent[-CANDIDATES:])
    try:
        return Prepared(turn, against, encode(turn, against))
    except Exception:  # the commit encodes it again, and says why it cannot be stored
        return Prepared(turn)


class Recent:
    """Each open rollout's latest committed turns (at most CANDIDATES), for `encode`.
    A rollout is dropped when it is closed (`closed`); over the cap (`budget`, which
    follows the rollouts in flight) the rollouts least recently written are dropped
    (read back from the store if they write again). Written under the store's write
    lock; `find` may run on any thread."""

    def __init__(self, load: Callable[[sqlite3.Connection, str], list[Turn]], *,
                 per_rollout: int = KEPT_PER_ROLLOUT, floor: int = KEPT_FLOOR) -> None:
        self._load = load
        self._turns: OrderedDict[str, list[Turn]] = OrderedDict()
        self._lock = threading.Lock()
        self._per_rollout, self._floor, self._bytes = per_rollout, floor, 0
        self._open: set[str] = set()
        self._closed: OrderedDict[str, None] = OrderedDict()

    @property
    def budget(self) -> int:
        """What the kept turns may weigh: a share per rollout in flight, at least the floor."""
        return max(self._floor, self._per_rollout * len(self._open))

    def size(self) -> tuple[int, int]:
        """(rollouts kept, what their turns weigh in bytes)."""
        with self._lock:
            return len(self._turns), self._bytes

    def opened(self, key: str) -> None:
        """`key` is in flight: it widens the cap by its share until it is closed."""
        with self._lock:
            self._open.add(key)
            self._closed.pop(key, None)

    def closed(self, key: str) -> None:
        """`key` is closed (or its outcome written): its turns are dropped now, and a turn
        of it committed later (one in flight at the close) is not kept."""
        with self._lock:
            self._open.discard(key)
            self._drop(key)
            self._closed[key] = None
            self._closed.move_to_end(key)
            while len(self._closed) > CLOSED_KEPT:
                self._closed.popitem(last=False)

    def _drop(self, key: str) -> None:
        self._bytes -= sum(map(_weight, self._turns.pop(key, ())))

    def get(self, db: sqlite3.Connection, key: str) -> list[Turn]:
        with self._lock:
            turns, closed = self._turns.get(key), key in self._closed
        if turns is None:  # read outside the lock: `find` must not wait on the disk
            turns = self._load(db, key)[-CANDIDATES:]
            if closed:  # encoded against, never kept
                return turns
            with self._lock:
                if key not in self._turns and key not in self._closed:
                    self._turns[key] = turns
                    self._bytes += sum(map(_weight, turns))
        with self._lock:
            turns = self._turns.get(key, turns)
            if key in self._turns:
                self._turns.move_to_end(key)
                self._trim(keep=key)
            return list(turns)

    def _trim(self, keep: str) -> None:
        budget = self.budget
        while self._bytes > budget and len(self._turns) > 1:
            oldest = next(iter(self._turns))
            if oldest == keep:
                break
            self._drop(oldest)

    def prepare(self, turn: Turn) -> Prepared:
        """`turn`'s row, encoded on the caller's thread before the commit."""
        with self._lock:
            kept = self._turns.get(turn.rollout)
            kept = list(kept) if kept is not None else None
        return prepare(turn, kept)

    def find(self, key: str, predicate: Callable[[Turn], bool]) -> Turn | None:
        with self._lock:
            turns = list(self._turns.get(key, ()))
        return next((t for t in reversed(turns) if predicate(t)), None)

    def cancel(self, key: str, index: int) -> None:
        """The kept turn `index` of `key`, if ok, now cancelled (as `TraceStore.cancel_turn`
        made it in the store)."""
        with self._lock:
            kept = self._turns.get(key, [])
            for n, turn in enumerate(kept):
                if turn.index == index and turn.status == "ok":
                    kept[n] = msgspec.structs.replace(turn, status="cancelled")

    def stage(self) -> Staged:
        return Staged(self)

    def keep(self, turns: Iterable[Turn]) -> None:
        with self._lock:
            for turn in turns:
                if turn.rollout in self._closed:
                    continue
                kept = self._turns.setdefault(turn.rollout, [])
                kept.append(turn)
                self._bytes += _weight(turn)
                for dropped in kept[:-CANDIDATES]:
                    self._bytes -= _weight(dropped)
                del kept[:-CANDIDATES]


def _weight(turn: Turn) -> int:
    """About what a kept turn holds in memory: its ids (a pointer and an int object
    each), its raw request, and its messages (about the raw request again)."""
    tokens = _tokens(turn)
    ids = len(tokens.prompt_ids or ()) + len(tokens.completion_ids or ()) if tokens else 0
    return 40 * ids + 2 * len(turn.raw_request) + len(turn.raw_response)


class Staged:
    """Turns encoded in one transaction: later turns of the batch may extend earlier
    ones, and `Recent` learns of them only once the transaction commits (a rolled-back
    turn must never become a parent)."""

    def __init__(self, recent: Recent) -> None:
        self._recent = recent
        self._turns: list[Turn] = []

    def encode(self, db: sqlite3.Connection, write: Turn | Prepared) -> tuple[Any, ...]:
        turn = write.turn if isinstance(write, Prepared) else write
        recent = self._recent.get(db, turn.rollout)
        recent += [t for t in self._turns if t.rollout == turn.rollout]
        recent = recent[-CANDIDATES:]
        row = write.row_against(recent) if isinstance(write, Prepared) else None
        if row is None:
            try:
                row = encode(turn, recent)
            except Exception:  # whatever went wrong against the others, the turn alone
                row = encode(turn, [])
        self._turns.append(turn)
        return row

    def keep(self) -> None:
        self._recent.keep(self._turns)
        self._turns = []


# ------------------------------------------------------------------ reading
class Decoder:
    """Rebuilds the turns of one rollout from rows in index order (a turn's parent and
    base come before it). Bodies are rebuilt only when asked for (`bodies`) or needed by
    a turn asked for."""

    def __init__(self, *, bodies: bool = True) -> None:
        self.bodies = bodies
        self._turns: dict[int, Turn] = {}
        self._failed: dict[int, CorruptTurn] = {}

    def add(self, row: Sequence[Any]) -> Turn:
        """The row's turn; raises `CorruptTurn` if it cannot be rebuilt exactly (then
        so does every later turn stored against it, and only those)."""
        *v4, layout, parent, keep, length, base = row
        try:  # a v4 row (layout NULL) holds everything whole
            turn = self._layout(v4, parent, keep, length, base) if layout else row_turn(v4)
        except Exception as exc:  # a damaged blob, a bad header, a missing base
            error = exc if isinstance(exc, CorruptTurn) else CorruptTurn(
                v4[0], v4[1], f"cannot be rebuilt: {exc}")
            self._failed[v4[1]] = error
            raise error from exc
        self._turns[turn.index] = turn
        return turn

    def _earlier(self, v4: Sequence[Any], index: int, what: str) -> Turn:
        turn = self._turns.get(index)
        if turn is None:
            failed = self._failed.get(index)
            why = f"cannot be rebuilt ({failed})" if failed is not None else "is missing"
            raise CorruptTurn(v4[0], v4[1], f"its {what} turn {index} {why}")
        return turn

    def _layout(self, v4: list[Any], parent: int | None, keep: int | None,
                length: int | None, base: int | None) -> Turn:
        ids = self._prompt(v4, parent, keep, length)
        earlier = self._earlier(v4, base, "base") if base is not None and self.bodies else None
        if self.bodies:
            v4[14] = _read_request(v4[14], earlier)
            v4[19] = delta.decode_body(v4[19], lambda: _base_raw(v4, earlier))
            v4[20] = delta.decode_body(v4[20], bytes)
        else:  # only the tokens are wanted: the bodies stay unread
            v4[14], v4[19], v4[20] = None, b"", b""
        v4[16] = None
        turn = row_turn(v4, request_decoded=True)
        if ids is not None and turn.completion is not None:
            tokens = msgspec.structs.replace(turn.completion.tokens, prompt_ids=ids)
            turn = msgspec.structs.replace(
                turn, completion=msgspec.structs.replace(turn.completion, tokens=tokens))
        return turn

    def _prompt(self, v4: Sequence[Any], parent: int | None, keep: int | None,
                length: int | None) -> tuple[int, ...] | None:
        if v4[16] is None:
            return None
        new = unpack(delta.unseal(v4[16], 0)[2], "i") or ()
        if parent is None:
            ids = new
        else:
            tokens = _tokens(self._earlier(v4, parent, "prompt's parent"))
            if tokens is None or tokens.prompt_ids is None or keep is None:
                raise CorruptTurn(v4[0], v4[1], f"its prompt's parent turn {parent} has no ids")
            before, sampled = tokens.prompt_ids, tokens.completion_ids or ()
            if keep > len(before) + len(sampled):
                raise CorruptTurn(v4[0], v4[1], f"keeps {keep} ids of parent turn {parent}, "
                                  f"which has {len(before) + len(sampled)}")
            if keep <= len(before):
                ids = before[:keep] + new
            else:
                ids = before + sampled[:keep - len(before)] + new
        if length is not None and len(ids) != length:
            raise CorruptTurn(v4[0], v4[1], f"its prompt rebuilds to {len(ids)} ids, "
                              f"{length} were written")
        return ids


def _base_raw(v4: Sequence[Any], base: Turn | None) -> bytes:
    if base is None:
        raise CorruptTurn(v4[0], v4[1], "its raw request is a delta without a base turn")
    return base.raw_request


def _read_request(blob: bytes | None, base: Turn | None) -> ChatRequest | None:
    if blob is None:
        return None
    form, header, payload = delta.unseal(blob, 1)
    request = _REQUEST.decode(payload)
    if form == delta.WHOLE:
        return request
    if base is None or base.request is None or header[0] > len(base.request.messages):
        raise ValueError(f"its request keeps {header[0]} messages of a base that lacks them")
    messages = base.request.messages[:header[0]] + request.messages
    return msgspec.structs.replace(request, messages=messages)


def decode_rollout(rows: Iterable[Sequence[Any]], *, bodies: bool = True) -> list[Turn]:
    decoder = Decoder(bodies=bodies)
    return [decoder.add(row) for row in rows]


def decode_each(rows: Iterable[Sequence[Any]], *, bodies: bool = True
                ) -> Iterator[Turn | CorruptTurn]:
    """Each row's turn, or why it cannot be rebuilt: a reader raises only for the turns
    it wants, so a damaged turn leaves the turns not stored against it readable."""
    decoder = Decoder(bodies=bodies)
    for row in rows:
        try:
            yield decoder.add(row)
        except CorruptTurn as exc:
            yield exc
