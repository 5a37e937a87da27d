"""Which renderer and which reply parsers token mode uses for a model, decided at start-up.

Two paths:

* **A family `renderers` hand-codes** (Qwen3, Qwen3.5, GLM, Kimi K2, DeepSeek, Llama 3,
  MiniMax M2, Nemotron 3, ...): that renderer renders prompts, parses replies by
  special-token ids and bridges a turn to the next (`family.FamilyRenderer`). The family
  is the `renderer` setting, else the model's hub name (`renderers`' own table), else the
  family whose renderer writes exactly what the model's chat template writes on a probe
  conversation (so a local copy or a fine-tune with an unchanged template is found).
* **Any other model** (LFM2 among them): the model's own chat template renders
  (`render.Renderer`), and replies are parsed by vLLM's parser names, as `vllm serve`
  takes them (`--tool-call-parser lfm2`, `--reasoning-parser ...`): given, or read off the
  template's tool-call markup. `hermes` and `qwen3_coder` are parsed here as they stream
  (`parsers`, `toolformats`); every other name by vLLM's own parser class.

Nothing is guessed silently: a template whose tool-call markup is not recognised, or a
parser name that neither this module nor vLLM knows, is refused with the setting to give.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

GENERIC = "default"  # the `renderer` setting that forces the template path
# Tool-call markup in a chat template -> vLLM's parser name; the first whose markers are
# all present wins (GLM and Qwen3-Coder templates also hold `<tool_call>`).
TEMPLATE_MARKUP: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<tool_call>", "<function="), "qwen3_coder"),
    (("<arg_key>",), "glm45"),
    (("<tool_call>",), "hermes"),
    (("<|tool_call_start|>",), "lfm2"),
    (("<|tool_calls_section_begin|>",), "kimi_k2"),
    (("<｜tool▁calls▁begin｜>",), "deepseek_v3"),  # noqa: RUF001 (DeepSeek's own bars)
    (("<minimax:tool_call>",), "minimax_m2"),
    (("<|python_tag|>",), "llama3_json"),
)
# A `renderers` family -> the vLLM tool-call parser names that read its calls. A family is
# parsed by its renderer; naming a parser outside its set is refused, not half-obeyed.
FAMILY_TOOL_PARSERS: dict[str, frozenset[str]] = {
    "qwen3": frozenset({"hermes"}),
    "prime-qwen3": frozenset({"qwen3_coder", "qwen3_xml"}),
    "qwen3.5": frozenset({"qwen3_coder", "qwen3_xml"}),
    "qwen3.6": frozenset({"qwen3_coder", "qwen3_xml"}),
    "qwen3.8": frozenset({"qwen3_coder", "qwen3_xml"}),
    "glm-4.5": frozenset({"glm45"}),
    "glm-5": frozenset({"glm45", "glm47"}),
    "glm-5.1": frozenset({"glm45", "glm47"}),
    "glm-5.3": frozenset({"glm45", "glm47"}),
    "deepseek-v3": frozenset({"deepseek_v3"}),
    "deepseek-r1": frozenset({"deepseek_v3"}),
    "deepseek-v4": frozenset({"deepseek_v4"}),
    "kimi-k2": frozenset({"kimi_k2"}),
    "kimi-k2.5": frozenset({"kimi_k2"}),
    "llama-3": frozenset({"llama3_json"}),
    "gpt-oss": frozenset({"openai"}),
    "minimax-m2": frozenset({"minimax_m2"}),
    "nemotron-3": frozenset({"qwen3_coder"}),
    "nemotron-3-ultra": frozenset({"qwen3_coder"}),
    "nemotron-3.5": frozenset({"qwen3_coder"}),
}
# Parsed here, incrementally (see `toolformats`): kept because they stream deltas as the
# text arrives and drop the template's layout newlines, so the generic path's text joins
# extend; every other name goes to vLLM's parser.
OWN_TOOL_PARSERS = frozenset({"hermes", "qwen3_coder", "qwen3_xml"})
# Families never probed against a template: vision-only ones (they need a processor) and
# gpt-oss (its renderer loads harmony's own vocabulary file; named explicitly it works).
_NOT_PROBED = frozenset({"default", "qwen3-vl", "gpt-oss", "inkling"})
_RENDERER_OPTIONS = frozenset({"thinking_retention"})


@dataclass(frozen=True)
class TokenFormat:
    """What token mode renders and parses with. `family`: a `renderers` name (then
    `renderer` is its instance) or None for the template path; `tool_call_parser` and
    `reasoning_parser`: vLLM names on the template path; `why`: how it was decided."""

    family: str | None
    renderer: Any = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    why: str = ""
    template_kwargs: dict[str, Any] = field(default_factory=dict)


def resolve(tokenizer: Any, *, renderer: str | None = None,
            tool_call_parser: str | None = None, reasoning_parser: str | None = None,
            chat_template: str | None = None,
            chat_template_kwargs: Mapping[str, Any] | None = None) -> TokenFormat:
    """The format for `tokenizer`'s model; ValueError naming the setting when it cannot
    be decided."""
    kwargs = dict(chat_template_kwargs or {})
    template = chat_template or getattr(tokenizer, "chat_template", None) or ""
    if renderer not in (None, "", "auto", GENERIC):
        return _family(tokenizer, str(renderer), kwargs, tool_call_parser, "the renderer "
                       "setting")
    if renderer != GENERIC and not chat_template:
        for find, why in ((_named_family, "the model's name"),
                          (_probed_family, "the model's chat template")):
            if (name := find(tokenizer, template)) is not None:
                return _family(tokenizer, name, kwargs, tool_call_parser, why)
    return _generic(template, tool_call_parser, reasoning_parser, kwargs)


def _family(tokenizer: Any, name: str, kwargs: dict[str, Any], parser: str | None,
            why: str) -> TokenFormat:
    renderers, config_from_name = _renderers()

    try:
        config = config_from_name(name)
        # Renderer options (`thinking_retention`: keep earlier reasoning so turns bridge)
        # go to the config; the rest must be template kwargs the family knows.
        options = {k: kwargs[k] for k in kwargs if k in _RENDERER_OPTIONS}
        if options and config is not None:
            config = type(config).model_validate({"name": name, **options})
        config = renderers.merge_chat_template_kwargs(
            config, {k: v for k, v in kwargs.items() if k not in options})
        instance = renderers.create_renderer(tokenizer, config)
    except (ValueError, KeyError, AssertionError, TypeError) as exc:
        raise ValueError(f"token mode cannot use the {name!r} renderer for this model "
                         f"({_first_line(exc)}); set --renderer to another family or "
                         f"{GENERIC!r} (the chat template)") from None
    accepted = FAMILY_TOOL_PARSERS.get(name)
    if parser and accepted is not None and parser not in accepted:
        raise ValueError(
            f"--tool-call-parser {parser!r} does not read {name!r} tool calls (it writes "
            f"{'/'.join(sorted(accepted))}); leave it unset, or set --renderer {GENERIC} "
            f"to render with the chat template and parse with {parser!r}")
    return TokenFormat(name, instance, parser, None, f"{name} (from {why})", kwargs)


def _named_family(tokenizer: Any, _template: str) -> str | None:
    from renderers.base import MODEL_RENDERER_MAP

    return MODEL_RENDERER_MAP.get(str(getattr(tokenizer, "name_or_path", "")))


_PROBE_TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]
_PROBE: list[dict[str, Any]] = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "List the files."},
    {"role": "assistant", "content": "Listing.", "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "bash", "arguments": {"command": "ls"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
    {"role": "assistant", "content": "There is a.txt."},
    {"role": "user", "content": "Thanks."},
]


def _probed_family(tokenizer: Any, template: str) -> str | None:
    """The family whose renderer writes what the template writes on `_PROBE`."""
    if not template:
        return None
    try:
        expected = tokenizer.apply_chat_template(
            _PROBE, tools=_PROBE_TOOLS, chat_template=template, tokenize=False,
            add_generation_prompt=True)
    except Exception:  # a template that cannot render the probe: no family claims it
        return None
    from renderers.base import RENDERER_REGISTRY, _populate_registry

    renderers, config_from_name = _renderers()
    _populate_registry()
    for name in sorted(set(RENDERER_REGISTRY) - _NOT_PROBED):
        try:
            instance = renderers.create_renderer(tokenizer, config_from_name(name))
            ids = instance.render_ids(_PROBE, tools=_PROBE_TOOLS, add_generation_prompt=True)
        except Exception:  # the family's special tokens are not this tokenizer's
            continue
        if tokenizer.decode(ids, skip_special_tokens=False) == expected:
            return name
    return None


def _generic(template: str, parser: str | None, reasoning: str | None,
             kwargs: dict[str, Any]) -> TokenFormat:
    if not template:
        raise ValueError("the tokenizer has no chat template and no renderer family "
                         "matches it; set --chat-template or --renderer")
    why = "the tool_call_parser setting"
    if not parser:
        parser = template_parser(template)
        why = "the chat template's tool-call markup"
    if parser is None:
        raise ValueError(
            "token mode cannot tell this model's tool-call format: no renderer family "
            "matches its chat template and the template's tool-call markup is not one "
            "it knows; set --tool-call-parser (a vLLM parser name, e.g. hermes, lfm2, "
            "llama3_json) or --renderer (a renderers family, e.g. qwen3, glm-4.5)")
    check_parser_names(parser, reasoning)
    return TokenFormat(None, None, parser, reasoning, f"chat template, {parser} tool "
                       f"calls (from {why})", kwargs)


def template_parser(template: str) -> str | None:
    """vLLM's tool-call parser name for the markup `template` writes, if known."""
    return next((name for markers, name in TEMPLATE_MARKUP
                 if all(m in template for m in markers)), None)


def check_parser_names(tool_call_parser: str, reasoning_parser: str | None) -> None:
    """Both names must be parsers something here can run: ours, or vLLM's registered
    ones (vLLM is imported only for a name that is not ours)."""
    if tool_call_parser in OWN_TOOL_PARSERS and reasoning_parser is None:
        return
    tools, reasoners = vllm_parser_names()
    if tool_call_parser not in OWN_TOOL_PARSERS | tools:
        raise ValueError(f"--tool-call-parser {tool_call_parser!r} is not a parser vLLM "
                         f"or token mode knows; known: {', '.join(sorted(tools))}")
    if reasoning_parser is not None and reasoning_parser not in reasoners:
        raise ValueError(f"--reasoning-parser {reasoning_parser!r} is not a vLLM reasoning "
                         f"parser; known: {', '.join(sorted(reasoners))}")


def vllm_parser_names() -> tuple[frozenset[str], frozenset[str]]:
    try:
        from vllm.reasoning import ReasoningParserManager
        from vllm.tool_parsers import ToolParserManager
    except ImportError:
        raise ValueError("this tool-call or reasoning parser is vLLM's, and vLLM is not "
                         "installed beside the proxy (pip install 'harnessrl[cpu]'); or "
                         "set --renderer to a renderers family") from None
    return (frozenset(ToolParserManager.list_registered()),
            frozenset(ReasoningParserManager.list_registered()))


def _renderers() -> tuple[Any, Any]:
    """The library and its config lookup, untyped: its configs are a tagged union and its
    messages TypedDicts; we hand it the OpenAI-shaped dicts it documents."""
    import renderers
    from renderers.configs import config_from_name

    return renderers, config_from_name


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
