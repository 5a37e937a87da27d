"""The shared vocabulary every part of harnessrl speaks.

Dialects translate native wire payloads to and from these types; engines consume a
`ChatRequest` and produce `EngineEvent`s; the store keeps `Turn`s. Structs are msgspec
structs so that they encode to JSON (for the store and exports) without hand-written code.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "error"]
TurnStatus = Literal["ok", "failed", "cancelled"]


# ------------------------------------------------------------------ message parts
class Text(msgspec.Struct, tag="text", frozen=True):
    text: str


class Image(msgspec.Struct, tag="image", frozen=True):
    """An image by URL; `data:` URLs carry inline bytes."""

    url: str
    detail: str | None = None


class Reasoning(msgspec.Struct, tag="reasoning", frozen=True):
    """Model reasoning; `signature`/`encrypted` let a dialect hand it back unchanged."""

    text: str
    signature: str | None = None
    encrypted: str | None = None
    redacted: bool = False


class ToolCall(msgspec.Struct, tag="tool_call", frozen=True):
    """A call the model made; `arguments` is the raw JSON text, exactly as produced."""

    id: str
    name: str
    arguments: str


class ToolResult(msgspec.Struct, tag="tool_result", frozen=True):
    call_id: str
    content: tuple[Text | Image, ...]
    is_error: bool = False


Part = Text | Image | Reasoning | ToolCall | ToolResult


class Message(msgspec.Struct, frozen=True):
    role: Role
    parts: tuple[Part, ...]
    name: str | None = None


# ------------------------------------------------------------------ requests
class Tool(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # the client asked for schema-exact arguments


class ToolChoice(msgspec.Struct, frozen=True):
    """`mode` is auto | none | required; `name` forces one function."""

    mode: Literal["auto", "none", "required"] = "auto"
    name: str | None = None


class Sampling(msgspec.Struct, frozen=True, omit_defaults=True):
    """Sampling values; None means "not given" (the engine's default applies)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None

    def override(self, policy: Sampling | None, unset: frozenset[str] = frozenset()) -> Sampling:
        """Values in `policy` win; names in `unset` are removed (e.g. no top_p on-policy)."""
        if policy is None and not unset:
            return self
        merged = msgspec.structs.asdict(self)
        if policy is not None:
            chosen = msgspec.structs.asdict(policy)
            merged.update({k: v for k, v in chosen.items() if v is not None})
        for name in unset:
            merged[name] = None
        return Sampling(**merged)


class ChatRequest(msgspec.Struct, frozen=True):
    """A model call in canonical form, whatever dialect it arrived in.

    `extra` holds every native field the dialect does not map, so nothing a harness
    sent is lost (it is recorded, not forwarded).
    """

    model: str
    messages: tuple[Message, ...]
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    sampling: Sampling = Sampling()
    stream: bool = False
    reasoning_effort: str | None = None
    extra: dict[str, Any] = {}


# ------------------------------------------------------------------ engine output
class TextDelta(msgspec.Struct, tag="text", frozen=True):
    text: str


class ReasoningDelta(msgspec.Struct, tag="reasoning", frozen=True):
    text: str


class ToolCallDelta(msgspec.Struct, tag="tool_call", frozen=True):
    """A piece of the `index`-th tool call: `id` and `name` come once, arguments in pieces."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


Delta = TextDelta | ReasoningDelta | ToolCallDelta


class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int
    completion_tokens: int


class Started(msgspec.Struct, tag="started", frozen=True):
    """The engine accepted the call; `prompt_ids` as it tokenized the prompt (if told).
    `flags` name anything the engine wants on the turn's record (see `Turn.flags`)."""

    model: str
    prompt_ids: tuple[int, ...] | None = None
    flags: tuple[str, ...] = ()


class Chunk(msgspec.Struct, tag="chunk", frozen=True):
    """Deltas plus the token ids sampled for them and one logprob per id (if told)."""

    deltas: tuple[Delta, ...] = ()
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None


class Finished(msgspec.Struct, tag="finished", frozen=True):
    finish_reason: FinishReason
    usage: Usage | None = None


EngineEvent = Started | Chunk | Finished


# The store packs token ids as 32-bit integers (store/rows.py). Engines decode the ids a
# reply reports as `TokenId`, so an id outside that range fails its call as the engine's
# error, with the reason, instead of failing the write and losing the call.
MAX_TOKEN_ID = 2**31 - 1
TokenId = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKEN_ID)]


class Tokens(msgspec.Struct, frozen=True):
    """Exact ids the engine reported. Missing pieces stay None, never guessed."""

    prompt_ids: tuple[int, ...] | None
    completion_ids: tuple[int, ...] | None
    logprobs: tuple[float, ...] | None


class Completion(msgspec.Struct, frozen=True):
    """One assistant reply in canonical form."""

    model: str
    parts: tuple[Part, ...]
    finish_reason: FinishReason
    usage: Usage | None
    tokens: Tokens

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [p for p in self.parts if isinstance(p, ToolCall)]


# ------------------------------------------------------------------ the record
class Timings(msgspec.Struct, frozen=True, omit_defaults=True):
    """Wall-clock seconds since the epoch."""

    received: float
    first_token: float | None = None
    done: float | None = None


class Turn(msgspec.Struct, frozen=True, omit_defaults=True):
    """One model call of a rollout, as recorded.

    `raw_request` is the body as received; `raw_response` the JSON sent back or the SSE
    bytes streamed. `request` is the canonical request as sent to the engine (with any
    history the dialect chains by id, such as `previous_response_id`, filled in).
    `flags` names anything suspicious about the capture (for example
    `logprob_count_mismatch`) so training can leave the turn out. A failed turn's
    `error_kind` is the error's kind (`engine_unavailable`, `timeout`, ...) and `error`
    reads "kind: message".
    """

    rollout: str
    index: int
    dialect: str
    status: TurnStatus
    timings: Timings
    raw_request: bytes
    raw_response: bytes = b""
    request: ChatRequest | None = None
    completion: Completion | None = None
    requested_sampling: Sampling | None = None
    used_sampling: Sampling | None = None
    engine: str | None = None
    model: str | None = None
    weight_version: str | None = None
    error: str | None = None
    flags: tuple[str, ...] = ()
    reply_id: str | None = None  # the id the client saw (chatcmpl-…, msg_…, resp_…)
    error_kind: str | None = None
    # `raw_request`'s Content-Encoding as received (e.g. "zstd"): the stored bytes are the
    # coded ones, `proxy.wire.codings.undo` gives the JSON. None: sent uncoded.
    content_encoding: str | None = None
    # The client's own count of earlier attempts at this call (`x-stainless-retry-count`);
    # None when it sent none. `retry_of`: the turn of the same rollout this call repeated
    # (its body byte for byte, sent with a lower count), which the client did not keep.
    retry_count: int | None = None
    retry_of: int | None = None


class Rollout(msgspec.Struct, frozen=True, omit_defaults=True):
    """One harness run on one task: the unit a key grants access to. `max_model_calls`
    caps its model calls (None: no cap); the calls over it are refused and recorded as
    failed turns of kind `step_cap`."""

    key: str
    created: float
    closed: float | None = None
    sampling: Sampling | None = None
    unset_sampling: tuple[str, ...] = ()
    metadata: dict[str, Any] = {}
    max_model_calls: int | None = None


# ------------------------------------------------------------------ training samples
# Why a chain of turns started (see `harnessrl.rollout.analysis.chains.BREAK_REASONS` for the
# exact rules) and why a turn was left out of every chain (`EXCLUDE_REASONS`).
BreakReason = Literal["first", "side_call", "history_rewritten", "rewound"]
ExcludeReason = Literal["failed", "cancelled", "flagged", "no_tokens", "retried"]
# Why a chain broke, finer than `BreakReason`: what lies where the new prompt first differs
# from the closest chain (`harnessrl.rollout.analysis.drift` says what each means).
DriftCause = Literal[
    # inside an earlier completion
    "whitespace", "tool_json_reserialized", "reasoning_removed", "completion_changed",
    "retokenized",
    # inside inserted tokens
    "tool_result_changed", "tool_result_truncated", "system_prompt_changed", "tools_changed",
    "message_changed", "messages_dropped", "messages_reordered", "summary_replaced_turns",
    "template",
    # after the shared part
    "rewound", "side_call",
    "unclassified",
]
# What the harness used a model call for (`harnessrl.rollout.analysis.kinds`).
CallKind = Literal["main", "side", "subagent", "compaction"]


class ChainBreak(msgspec.Struct, frozen=True, omit_defaults=True):
    """Why turn `turn` started a new chain instead of extending one.

    For anything but `first`, `against` is the last turn of the chain the prompt came
    closest to extending, and `diverged_at` the first position (in the prompt's ids)
    where it differs from that chain's tokens; `within` says whether that position lies
    in the prompt part (inserted tokens) or in the sampled completion of turn
    `within_turn`. A prompt that simply ends early (`rewound`) has no differing token:
    `diverged_at` is then its length.
    """

    reason: BreakReason
    turn: int
    against: int | None = None
    diverged_at: int | None = None
    within: Literal["prompt", "completion"] | None = None
    within_turn: int | None = None


class ExcludedTurn(msgspec.Struct, frozen=True, omit_defaults=True):
    """A turn that is in no chain; `detail` carries its flags or error."""

    turn: int
    reason: ExcludeReason
    detail: str | None = None


class Sample(msgspec.Struct, frozen=True):
    """One training sequence: a chain of turns that extend each other, token for token.

    `completion_ids` is everything after the first prompt: each turn's sampled ids, then
    the ids inserted before the next turn's reply (tool results, new user text, template
    tokens). `mask` has one entry per completion id: 1 = sampled by the model, 0 = inserted.
    `logprobs` holds the engine's logprobs of the sampled ids only, in order
    (len == sum(mask)): an inserted id has no logprob and none is invented.
    `dense_logprobs()` expands them to one per completion id for trainers that want that.
    `weight_versions` has one entry per turn of `turns`.
    """

    rollout: str
    turns: tuple[int, ...]
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    weight_versions: tuple[str | None, ...] = ()
    break_reason: BreakReason | None = None  # None: the rollout's first chain
    kind: CallKind = "main"  # what the chain's first turn was for (rollout.analysis.kinds)

    def dense_logprobs(self, fill: float = float("nan")) -> list[float]:
        """One logprob per completion id; inserted positions get `fill` (NaN by default,
        which TRL tolerates at positions its `env_mask` masks out)."""
        sampled = iter(self.logprobs)
        return [next(sampled) if m else fill for m in self.mask]


class Outcome(msgspec.Struct, frozen=True, omit_defaults=True):
    """How one rollout ended: the harness's own end state, the verifier's verdict, and the
    reward with its shaping terms kept apart, so the raw outcome is never lost.

    `status` is `done` when the agent ran and the verifier scored it (whatever the score),
    `infra_error` when the sandbox, engine, install or verifier failed: such a rollout has
    no reward (None, never 0) and stays out of training baselines.

    `tool_calls` counts what the harness executed, from `tool_call_source`: `native`, the
    tool calls of the rollout's completions (the dialect carries them), or `harness`, the
    harness's own action record (a harness that parses its actions from text, whose calls
    offer no tools). `capped`: the proxy refused a call over the rollout's
    `max_model_calls`; the rollout is still scored by the verifier.
    """

    harness: str
    harness_version: str
    task: str
    sample: int
    rollout: str
    status: Literal["done", "infra_error"]
    reward: float | None = None
    verifier_reward: float | None = None
    shaping: dict[str, float] = {}
    agent_finished: bool | None = None
    agent_timed_out: bool = False  # killed with its whole process tree at the deadline
    agent_exit_code: int | None = None
    agent_detail: str = ""
    agent_stderr: str = ""  # the tail of the harness's stderr
    verifier_status: str | None = None
    verifier_output: str = ""
    sandbox: str = "local"
    timings: dict[str, float] = {}
    turns: int = 0
    tool_calls: int = 0
    tool_call_source: Literal["native", "harness"] = "native"
    completion_tokens: int = 0
    capped: bool = False
    attempts: int = 1
    error: str | None = None
