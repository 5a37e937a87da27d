"""Tool-call formats token mode parses from sampled text, chosen per model by name.

Both formats wrap each call in `<tool_call>`…`</tool_call>` and reason inside `<think>`,
so they share `HermesParser`'s split-invariant state machine and differ only in what the
text between the call tags means:

* `hermes` (Hermes, Qwen2.5, Qwen3): `{"name": ..., "arguments": {...}}` JSON.
* `qwen3_coder` (Qwen3-Coder): XML, one `<parameter=…>` per argument, values as plain
  text, typed back into JSON with the tool's own parameter schema::

      <tool_call>
      <function=write_file>
      <parameter=path>
      a.txt
      </parameter>
      </function>
      </tool_call>

The names are vLLM's `--tool-call-parser` names, so the same table picks a parser for a
model in both engine modes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from harnessrl.proxy.engines.token.parsers import HermesParser
from harnessrl.types import Tool

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>\s*)?\Z", re.DOTALL)
_PARAMETER = re.compile(
    r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)
_STRING_TYPES = frozenset({"string", "str", "text", "varchar", "char", "enum"})
_INT_TYPES = frozenset({"integer", "int", "uint", "long", "short"})
_FLOAT_TYPES = frozenset({"number", "float", "double", "num"})
_JSON_TYPES = frozenset({"object", "array", "dict", "list"})


class Qwen3CoderParser(HermesParser):
    """Qwen3-Coder's XML calls; `tools` gives each parameter's JSON type."""

    def __init__(self, tools: tuple[Tool, ...] = (), new_id: Callable[[], str] | None = None,
                 *, in_reasoning: bool = False) -> None:
        super().__init__(new_id, in_reasoning=in_reasoning)
        self._schemas = {t.name: (t.parameters or {}).get("properties") or {} for t in tools}

    def parse_call(self, raw: str) -> tuple[str, str] | None:
        match = _FUNCTION.match(raw)
        if match is None:
            return None
        name, body = match.group(1).strip(), match.group(2)
        if _PARAMETER.sub("", body).strip():
            return None  # text that is neither a parameter nor layout: not this format
        properties = self._schemas.get(name, {})
        arguments = {
            key.strip(): typed(_trim_layout(value), properties.get(key.strip()))
            for key, value in _PARAMETER.findall(body)
        }
        return name, json.dumps(arguments, ensure_ascii=False)


def _trim_layout(value: str) -> str:
    """The template writes one newline after `<parameter=…>` and one before its end."""
    value = value.removeprefix("\n")
    return value.removesuffix("\n")


def _types(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    found = {kind} if isinstance(kind, str) else {k for k in kind or () if isinstance(k, str)}
    for union in ("anyOf", "oneOf"):
        for option in schema.get(union) or ():
            found |= _types(option)
    if "enum" in schema and not found:
        found.add("enum")
    return {k.lower() for k in found}


def typed(value: str, schema: Any) -> Any:
    """A parameter's text as the JSON value its schema asks for; text when it does not
    parse as that type (the model's text is kept, never replaced by a guess)."""
    kinds = _types(schema)
    if value.lower() == "null" and (not kinds or "null" in kinds):
        return None
    if schema is None or (kinds and kinds <= _STRING_TYPES | {"null"}):
        return value  # in a union with other types, those are tried first
    if kinds & _INT_TYPES:
        try:
            return int(value.strip())
        except ValueError:
            pass
    if kinds & _FLOAT_TYPES:
        try:
            number = float(value.strip())
        except ValueError:
            pass
        else:
            return int(number) if number.is_integer() and "." not in value else number
    if "boolean" in kinds or "bool" in kinds:
        lowered = value.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
    if kinds & _JSON_TYPES or not kinds:
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            pass
    return value


ParserFactory = Callable[[tuple[Tool, ...], bool], HermesParser]

# vLLM `--tool-call-parser` name -> the parser token mode uses for it.
TOOL_FORMATS: dict[str, ParserFactory] = {
    "hermes": lambda _tools, thinking: HermesParser(in_reasoning=thinking),
    "qwen3_coder": lambda tools, thinking: Qwen3CoderParser(tools, in_reasoning=thinking),
    "qwen3_xml": lambda tools, thinking: Qwen3CoderParser(tools, in_reasoning=thinking),
}


def make_parser(name: str, tools: tuple[Tool, ...] = (), *,
                in_reasoning: bool = False) -> HermesParser:
    try:
        factory = TOOL_FORMATS[name]
    except KeyError:
        raise ValueError(f"token mode cannot parse the {name!r} tool-call format; it knows "
                         f"{sorted(TOOL_FORMATS)}") from None
    return factory(tools, in_reasoning)
