"""The conformance policy's choices, without a harness."""

from __future__ import annotations

import json

from harnessrl.proxy.engines.policy import MINI_SWE_DONE, WriteFilePolicy
from harnessrl.proxy.engines.token.parsers import HermesParser
from harnessrl.types import ChatRequest, Message, Text, Tool, ToolCall, ToolResult

SHELL = Tool("bash", None, {"type": "object", "properties": {
    "command": {"type": "string"}, "description": {"type": "string"},
    "timeout": {"type": "integer"}}, "required": ["command", "description"]})
CODEX_SHELL = Tool("shell", None, {"type": "object", "properties": {
    "command": {"type": "array", "items": {"type": "string"}}}, "required": ["command"]})


def calls(text: str) -> list[tuple[str, dict]]:
    parser = HermesParser()
    deltas = parser.feed(text) + parser.finish()
    return [(d.name, json.loads(d.arguments)) for d in deltas if hasattr(d, "index")]


def request(*tools: Tool, result: bool = False) -> ChatRequest:
    messages = [Message("user", (Text("create hello.txt"),))]
    if result:
        messages += [Message("assistant", (ToolCall("c1", "bash", "{}"),)),
                     Message("tool", (ToolResult("c1", (Text(""),)),))]
    return ChatRequest(model="m", messages=tuple(messages), tools=tools)


def test_first_turn_calls_the_shell_with_required_fields_filled() -> None:
    policy = WriteFilePolicy("hello.txt", "a b 'c'")
    [(name, args)] = calls(policy(request(SHELL)).text)
    assert name == "bash" and args["command"] == policy.command
    assert args["description"] and "timeout" not in args
    assert "printf" in policy.command and "'a b '\"'\"'c'\"'\"''" in policy.command


def test_array_command_gets_an_argv() -> None:
    [(name, args)] = calls(WriteFilePolicy("hello.txt", "x")(request(CODEX_SHELL)).text)
    assert name == "shell" and args["command"][:2] == ["bash", "-lc"]


def test_finishes_after_the_tool_result() -> None:
    assert WriteFilePolicy("hello.txt", "x")(request(SHELL, result=True)).text.startswith("Done")
    [(_, args)] = calls(WriteFilePolicy("hello.txt", "x", "mini-swe-agent")(
        request(SHELL, result=True)).text)
    assert args["command"] == MINI_SWE_DONE


def test_no_tools_means_a_side_call_or_a_whole_file_edit() -> None:
    assert "<tool_call>" not in WriteFilePolicy("hello.txt", "x")(request()).text
    edit = WriteFilePolicy("hello.txt", "x", "whole-file")(request()).text
    assert edit == "hello.txt\n```\nx\n```\n"
