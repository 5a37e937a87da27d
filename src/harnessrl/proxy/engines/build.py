"""One engine from one description: chat or token mode against vLLM (a running one at a
URL, or one started here for a model), the scripted test engine, or an OpenAI-compatible
teacher. `harnessrl serve`, `run`/`eval` and `train` all build theirs here."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypedDict

import msgspec

from harnessrl.proxy.engines.base import Engine
from harnessrl.proxy.engines.upstream import FIRST_BYTE_TIMEOUT
from harnessrl.proxy.engines.vllm_server import VLLMServer
from harnessrl.settings import flag, interval_ms, json_object, readable_file

EngineKind = Literal["chat", "token", "scripted", "teacher"]
Status = Callable[[str], contextlib.AbstractContextManager[Any]]


class EngineSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What to sample with: the flags of `serve`, `run` and `eval`, and train's `[engine]`.

    chat/token: vLLM at `url`, or started for `model` (a local path or hub id) when there
    is no URL; token mode renders with `tokenizer` (default: `model`), by the `renderer`
    family or, if given, the `chat_template` file, and parses replies with vLLM's
    `tool_call_parser`/`reasoning_parser` names (see `token.formats`; chat mode passes
    the parser names to a vLLM started here); `chat_template_kwargs` go to the template
    (or the family's renderer config: `enable_thinking`, `thinking_retention`, ...).
    scripted: `tokenizer` and the reply texts in `script`. teacher:
    the OpenAI root at `url`, every call sent as `teacher_model` with `api_key`.
    A train config's `[engine]` table sets the fields in `file_fields` (`mode` is `kind`,
    `extra_args` is `vllm_args`); `train/engines.py` fills in the model and the log.
    """

    # The fields a train config's [engine] table may set, in the config reference's order;
    # the others are the command line's (the model comes from [model], the log is the run's).
    file_fields: ClassVar[tuple[str, ...]] = (
        "url", "urls", "servers", "kind", "tool_call_parser", "reasoning_parser", "renderer",
        "chat_template", "chat_template_kwargs", "dtype", "max_model_len", "vllm_args",
        "max_tokens", "temperature", "on_policy")

    # a running vLLM in dev mode; None: start one for the model
    url: Annotated[str | None, flag(
        "a running vLLM server (its OpenAI API root), or several comma-separated (each "
        "rollout sticks to one)", "--engine-url")] = None
    # Several running vLLM servers in dev mode, all serving the model (instead of `url`):
    # each rollout goes to one by a stable hash of its key; every weight sync reaches all
    # of them before the version is announced. They read the saved weights from the run
    # directory, so it must be the same path on every server's machine.
    urls: list[str] = []
    # vLLM servers to start here for the model when neither `url` nor `urls` is given
    servers: Annotated[int, msgspec.Meta(ge=1)] = 1
    # chat: vLLM renders the template; token: the proxy renders it with the model's own
    # tokenizer and reuses each rollout's earlier ids (chains extend where history is kept);
    # scripted and teacher are the command line's, never trained
    kind: Annotated[EngineKind, flag(
        "chat: vLLM renders the chat template and parses tool calls; token: the proxy renders "
        "with the model's tokenizer, reuses a rollout's earlier token ids, and parses replies "
        "itself", "--engine-mode", choices=("chat", "token"))] = msgspec.field(
            default="chat", name="mode")
    # How the model is rendered and parsed (docs/concepts/token-mode.md): vLLM's parser names
    # (chat mode: given to vLLM; token mode: the proxy's parsers), a `renderers` family
    # ("default": the chat template), a chat template file, and template options (e.g.
    # {"thinking_retention": "all"} keeps earlier reasoning so chains extend).
    tool_call_parser: Annotated[str | None, flag(
        "vLLM's tool-call parser name (e.g. hermes, qwen3_coder, lfm2, llama3_json); default: "
        "from the model")] = None
    # a vLLM reasoning parser name, e.g. qwen3
    reasoning_parser: Annotated[str | None, flag(
        "vLLM's reasoning parser name (e.g. qwen3, deepseek_r1)")] = None
    # token mode; None: found from the model (see above)
    renderer: Annotated[str | None, flag(
        "token mode: a renderers family (qwen3, qwen3.5, glm-4.5, kimi-k2, deepseek-v3, "
        "llama-3, gpt-oss, ...), or 'default' for the model's chat template; default: found "
        "from the model")] = None
    # a Jinja file, token mode
    chat_template: Annotated[str | None, flag(
        "a Jinja chat template file to render with instead of the model's own (chat mode: "
        "sent to vLLM with every call; token mode: the proxy renders with it)",
        metavar="FILE", parse=readable_file)] = None
    # given to every rendering of the template
    chat_template_kwargs: Annotated[dict[str, Any], flag(
        "template options, e.g. '{\"enable_thinking\": false}' (chat mode: sent to vLLM "
        "with every call), or in token mode '{\"thinking_retention\": \"all\"}' (keep "
        "earlier reasoning)", metavar="JSON",
        parse=json_object)] = {}
    # vLLM's and the trainer's dtype; "auto": bfloat16 on GPUs, float32 on a CPU (where
    # float32 keeps vLLM's logprobs equal to the trainer's)
    dtype: Annotated[str, flag()] = "auto"
    # None: the model's own (SmolLM2: 8192)
    max_model_len: Annotated[int | None, flag()] = None
    # more `vllm serve` flags for the servers started here
    vllm_args: Annotated[list[str], flag("extra vLLM flag (repeat)", "--vllm-arg")] = (
        msgspec.field(default_factory=list, name="extra_args"))
    # The trainer's sampling policy (the command line's is `Sampling`'s flags).

    max_tokens: int | None = 512  # per model call, overriding the harness's own
    # Sampling temperature for every call, whatever the harness asks; TRL computes the
    # policy's logprobs at the same temperature (GRPOConfig.temperature).
    temperature: float = 1.0
    # Neutral top_p/top_k/min_p/penalties on every call, so the tokens come from the very
    # distribution the trainer differentiates (harnesses often ask for top_p < 1).
    on_policy: bool = True
    model: Annotated[str | None, flag(
        "start vLLM for this model: tiny or smollm2 (built here), a model directory, a "
        "training run's directory or one of its checkpoints, or a hub id")] = None
    tokenizer: Annotated[str | None, flag(
        "token mode: the model's local directory (default: --model)")] = None
    read_timeout: Annotated[float, flag(
        "seconds the engine may stay silent once it has begun to answer (the generation "
        "limit)", "--engine-timeout")] = 600.0
    first_byte_timeout: Annotated[float, flag(
        "seconds the engine may stay silent before it begins to answer; then it must answer "
        "GET /health (within 10 s) or the call fails",
        "--engine-first-byte-timeout")] = FIRST_BYTE_TIMEOUT
    # seconds between reads of a streamed answer (Upstream)
    stream_interval: Annotated[float, flag(
        "read a streamed answer from the engine at most once per MS milliseconds after its "
        "first token: the tokens of an interval go on together, for a fraction of the CPU per "
        "token, and the last one may wait up to MS (default 0: each as it arrives)",
        "--stream-interval-ms", metavar="MS", parse=interval_ms, scale=1000)] = 0.0
    # a vLLM started here
    served_name: Annotated[str | None, flag(None, "--served-model-name")] = None
    vllm_log: Annotated[Path | None, flag()] = None
    # scripted
    script: tuple[str, ...] = ()
    token_delay: Annotated[float, flag("scripted engine: s/token")] = 0.0
    # teacher
    teacher_model: Annotated[str | None, flag(
        "--teacher: the model name every call is sent with")] = None
    api_key: str | None = None

    @property
    def managed(self) -> bool:
        """Whether vLLM is started here."""
        return self.kind in ("chat", "token") and self.url is None

    @property
    def roots(self) -> list[str]:
        """The running servers' roots (no trailing /v1) `url` or `urls` name; empty:
        started here."""
        named = [self.url] if self.url is not None else self.urls
        return [engine_root(u, "engine.url" if self.url is not None else "engine.urls")
                for u in named]

    def template_text(self) -> str | None:
        """The `chat_template` file's text (the one place it is read; None: no file)."""
        if self.chat_template is None:
            return None
        try:
            return Path(self.chat_template).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"chat_template: cannot read {self.chat_template}: {exc}"
                             ) from None


def engine_root(url: str, field: str) -> str:
    """vLLM's root URL from `http://host:port[/v1][/]`; an error naming `field` if it is
    not one."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises on a port that is not a number
    except ValueError as error:
        raise ValueError(f"{field}: {url!r} is not a URL ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{field}: {url!r} is not an http(s)://host:port URL of a vLLM "
                         "server")
    if parts.query or parts.fragment:
        raise ValueError(f"{field}: {url!r}: a server's root takes no query or fragment")
    return url.rstrip("/").removesuffix("/v1").rstrip("/")


@dataclass(frozen=True)
class Built:
    """An engine (not started: the proxy starts it) and the vLLM URL it calls, if any."""

    engine: Engine
    url: str | None


def server_for(spec: EngineSettings) -> VLLMServer:
    if spec.model is None:
        raise ValueError("starting vLLM needs a model")
    return VLLMServer(model=spec.model, served_name=spec.served_name,
                      tool_call_parser=spec.tool_call_parser,
                      reasoning_parser=spec.reasoning_parser,
                      max_model_len=spec.max_model_len,
                      dtype=None if spec.dtype == "auto" else spec.dtype,
                      extra_args=list(spec.vllm_args), log_path=spec.vllm_log,
                      engine_mode=spec.kind,
                      trust_request_chat_template=spec.chat_template is not None)


@contextlib.contextmanager
def built(spec: EngineSettings, *, status: Status | None = None) -> Iterator[Built]:
    """The engine `spec` describes, for the block; a vLLM it needs is started first
    (`status` shows the wait) and stopped after the block."""
    if not spec.managed:
        yield Built(make(spec), spec.url)
        return
    server = server_for(spec)
    try:
        with status(f"starting vLLM for {spec.model}") if status else contextlib.nullcontext():
            url = server.start()
        yield Built(make(spec, url), url)
    finally:
        server.stop()


def make(spec: EngineSettings, url: str | None = None, *, template: str | None = None
         ) -> Engine:
    """The engine for `spec`, calling `url` (default: `spec.url`); several comma-separated
    URLs: one engine for each behind a `RoutedEngine` (each rollout sticks to one).
    `template`: the chat template's text where it was read elsewhere (a Ray node builds
    with the driver's); default: `spec.template_text()`."""
    url = url or spec.url
    template = template if template is not None else spec.template_text()
    if spec.kind == "scripted":
        return _scripted(spec)
    if url is None:
        raise ValueError(f"a {spec.kind} engine needs a URL (or a model to start vLLM for)")
    if len(urls := split_urls(url)) > 1:
        from harnessrl.proxy.engines.routed import RoutedEngine

        return RoutedEngine([make(spec, one, template=template) for one in urls])
    if spec.kind == "teacher":
        from harnessrl.proxy.engines.openai_compat import OpenAICompatEngine

        return OpenAICompatEngine(url, model=spec.teacher_model, api_key=spec.api_key,
                                  **_upstream(spec))
    if spec.kind == "token":
        return _token(spec, url, template)
    from harnessrl.proxy.engines.vllm import VLLMEngine

    return VLLMEngine(url, chat_template=template,
                      chat_template_kwargs=dict(spec.chat_template_kwargs or {}),
                      **_upstream(spec))


def split_urls(url: str) -> list[str]:
    """`http://a:8000,http://b:8000` -> each URL (one for a single one)."""
    return [u.strip() for u in url.split(",") if u.strip()]


class _UpstreamArgs(TypedDict):
    read_timeout: float
    first_byte_timeout: float
    stream_interval: float


def _upstream(spec: EngineSettings) -> _UpstreamArgs:
    """How a remote engine's calls wait and read (upstream.Upstream)."""
    return {"read_timeout": spec.read_timeout, "first_byte_timeout": spec.first_byte_timeout,
            "stream_interval": spec.stream_interval}


def _token(spec: EngineSettings, url: str, template: str | None) -> Engine:
    from harnessrl.proxy.engines.token.engine import TokenEngine

    tokenizer = spec.tokenizer or spec.model
    if not tokenizer:
        raise ValueError("token mode needs the model's tokenizer (a local directory)")
    # No default parser: TokenEngine decides from the model or refuses, naming the flag.
    return TokenEngine(url, tokenizer, tool_parser=spec.tool_call_parser,
                       reasoning_parser=spec.reasoning_parser, renderer=spec.renderer,
                       chat_template=template,
                       chat_template_kwargs=dict(spec.chat_template_kwargs or {}),
                       **_upstream(spec))


def _scripted(spec: EngineSettings) -> Engine:
    from transformers import AutoTokenizer

    from harnessrl.proxy.engines.scripted import ScriptedEngine, replay

    if spec.tokenizer is None:
        raise ValueError("the scripted engine needs a tokenizer")
    return ScriptedEngine(AutoTokenizer.from_pretrained(spec.tokenizer),
                          replay(list(spec.script)), model=spec.served_name or "scripted",
                          token_delay=spec.token_delay)
