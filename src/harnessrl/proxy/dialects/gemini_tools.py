"""Gemini's tools and tool config as canonical `Tool`s and a `ToolChoice`. Pure.

Function declarations in Gemini's OpenAPI subset (`parameters`) become JSON Schema, each
change recorded in `extra["schema_changes"]`; `parametersJsonSchema` passes as sent. Built-in
tools (googleSearch, ...) and what `toolConfig` says beyond a mode and one forced name are
recorded in `extra`, not offered.
"""

from __future__ import annotations

from typing import Any

from harnessrl.errors import InvalidRequest
from harnessrl.proxy.dialects.base import ToolMode, expect, lookup, optional
from harnessrl.types import Tool, ToolChoice

_MODES: dict[str, ToolMode] = {"AUTO": "auto", "ANY": "required", "NONE": "none",
                                "VALIDATED": "auto", "MODE_UNSPECIFIED": "auto"}


def parse_tools(raw: list[Any], extra: dict[str, Any]) -> tuple[Tool, ...]:
    tools: list[Tool] = []
    unmapped: list[Any] = []
    changes: list[str] = []
    for i, item in enumerate(raw):
        item = expect(item, dict, f"tools[{i}]")
        # googleSearch, codeExecution, ...: recorded, not offered (no faithful rendering).
        unmapped.extend({k: v} for k, v in item.items() if k != "functionDeclarations")
        decls = optional(item, "functionDeclarations", list, f"tools[{i}].") or []
        for j, decl in enumerate(decls):
            tools.append(_declaration(decl, f"tools[{i}].functionDeclarations[{j}]", changes))
    if unmapped:
        extra["unmapped_tools"] = unmapped
    if changes:
        extra["schema_changes"] = changes
    return tuple(tools)


def _declaration(raw: Any, where: str, changes: list[str]) -> Tool:
    raw = expect(raw, dict, where)
    params = optional(raw, "parametersJsonSchema", dict, f"{where}.")
    if params is None:  # the OpenAPI subset: converted, each change recorded
        schema = optional(raw, "parameters", dict, f"{where}.")
        params = None if schema is None else _json_schema(schema, f"{where}.parameters", changes)
    return Tool(name=expect(raw.get("name"), str, f"{where}.name"),
                description=optional(raw, "description", str, f"{where}."),
                parameters=params)


# Gemini sends int64 fields as JSON strings.
_INT64_KEYS = frozenset({"minItems", "maxItems", "minLength", "maxLength", "minProperties",
                         "maxProperties"})


def _json_schema(raw: Any, where: str, changes: list[str]) -> dict[str, Any]:
    """Gemini's OpenAPI-subset `Schema` as JSON Schema; unknown keywords are kept as sent."""
    schema = dict(expect(raw, dict, where))
    kind = schema.get("type")
    if isinstance(kind, str) and kind != kind.lower():
        if kind == "TYPE_UNSPECIFIED":
            del schema["type"]
            changes.append(f"{where}.type: dropped TYPE_UNSPECIFIED")
        else:
            schema["type"] = kind.lower()
            changes.append(f"{where}.type: {kind} -> {kind.lower()}")
    for key in _INT64_KEYS & schema.keys():
        if isinstance(schema[key], str) and schema[key].isdigit():
            changes.append(f"{where}.{key}: string {schema[key]!r} -> integer")
            schema[key] = int(schema[key])
    if "example" in schema:
        schema["examples"] = [schema.pop("example")]
        changes.append(f"{where}.example -> examples")
    if "nullable" in schema:
        _nullable(schema, where, changes)
    for key in ("properties", "$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            schema[key] = {k: _json_schema(v, f"{where}.{key}.{k}", changes)
                           for k, v in schema[key].items()}
    if isinstance(schema.get("items"), dict):
        schema["items"] = _json_schema(schema["items"], f"{where}.items", changes)
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            schema[key] = [_json_schema(s, f"{where}.{key}[{n}]", changes)
                           for n, s in enumerate(schema[key])]
    return schema


def _nullable(schema: dict[str, Any], where: str, changes: list[str]) -> None:
    if schema.pop("nullable") is not True:
        changes.append(f"{where}.nullable: dropped (false)")
        return
    kind = schema.get("type")
    if isinstance(kind, str):
        schema["type"] = [kind, "null"]
        changes.append(f"{where}.nullable: type {kind} -> [{kind}, null]")
    elif "anyOf" in schema:
        schema["anyOf"] = [*schema["anyOf"], {"type": "null"}]
        changes.append(f"{where}.nullable: anyOf += null")
    else:
        changes.append(f"{where}.nullable: dropped (no type: null is already allowed)")
    if isinstance(schema.get("enum"), list) and None not in schema["enum"]:
        schema["enum"] = [*schema["enum"], None]
        changes.append(f"{where}.nullable: enum += null")


def parse_tool_config(raw: dict[str, Any] | None, extra: dict[str, Any]) -> ToolChoice | None:
    if raw is None:
        return None
    rest = {k: v for k, v in raw.items() if k != "functionCallingConfig"}
    if rest:
        extra["toolConfig"] = rest
    config = optional(raw, "functionCallingConfig", dict, "toolConfig.")
    if config is None:
        return None
    where = "toolConfig.functionCallingConfig"
    mode = _MODES.get(lookup(config.get("mode", "AUTO")))
    if mode is None:
        raise InvalidRequest(f"`{where}.mode` must be one of {sorted(_MODES)}, got "
                             f"{config.get('mode')!r}", param=f"{where}.mode")
    names = optional(config, "allowedFunctionNames", list, f"{where}.") or []
    names = [expect(n, str, f"{where}.allowedFunctionNames[{i}]") for i, n in enumerate(names)]
    if mode == "required" and len(names) == 1:
        return ToolChoice("required", names[0])
    if names:  # a set of names cannot be expressed canonically; recorded
        extra["allowed_function_names"] = names
    return ToolChoice(mode)
