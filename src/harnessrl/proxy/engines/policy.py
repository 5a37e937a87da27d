"""A scripted policy for conformance: it drives any harness to write a file through its
own tools, answering in the model's own tool-call format so the real parsing path runs.

Given the tools a harness offers, it picks the shell tool (or a file-writing tool), makes
one correct call, and after the tool result finishes the way that harness expects: a
plain answer, a finish tool, mini-swe-agent's completion command, or (for harnesses with
no tools) the harness's own text format: aider's whole-file edit, Terminus 2's JSON
keystroke batches.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from harnessrl.proxy.engines.scripted import Reply
from harnessrl.types import ChatRequest, Tool, ToolResult

Finish = Literal["answer", "mini-swe-agent", "finish-tool", "whole-file", "terminus-json"]

# Tool names harnesses give their shell, in order of preference.
SHELL_TOOLS = ("bash", "Bash", "shell", "run_shell_command", "exec_command", "shell_command",
               "terminal", "Shell", "execute_bash", "run_command", "bash_tool", "Execute",
               "exec")
FINISH_TOOLS = ("finish", "attempt_completion", "task_complete", "submit", "complete")
MINI_SWE_DONE = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# Placeholder text for required parameters we do not care about, by JSON type.
_FILLERS: dict[str, Any] = {"string": "write the requested file", "boolean": False,
                            "integer": 60000, "number": 60, "array": [], "object": {}}


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A call in the Hermes/Qwen format the tiny model's template uses."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@dataclass
class WriteFilePolicy:
    """Create `filename` holding `line` (plus a newline), then finish."""

    filename: str
    line: str
    finish: Finish = "answer"

    @property
    def command(self) -> str:
        return f"printf '%s\\n' {shlex.quote(self.line)} > {shlex.quote(self.filename)}"

    def __call__(self, request: ChatRequest) -> Reply:
        if not request.tools:
            return self._no_tools(request)
        if not _has_tool_result(request):
            return Reply(self._act(request.tools))
        return Reply(self._done(request.tools))

    def _no_tools(self, request: ChatRequest) -> Reply:
        if self.finish == "whole-file" and _mentions(request, self.filename):
            # aider's "whole" edit format: the file name, then the whole new file.
            return Reply(f"{self.filename}\n```\n{self.line}\n```\n")
        if self.finish == "terminus-json" and _mentions(request, self.filename):
            return Reply(self._terminus(request))
        return Reply("Write the requested file")  # a side call, e.g. a session title

    def _act(self, tools: tuple[Tool, ...]) -> str:
        shell = _pick(tools, SHELL_TOOLS)
        if shell is None:
            names = ", ".join(t.name for t in tools)
            raise LookupError(f"no shell tool among the offered tools: {names}")
        return tool_call(shell.name, _shell_arguments(shell, self.command))

    def _done(self, tools: tuple[Tool, ...]) -> str:
        if self.finish == "mini-swe-agent":
            shell = _pick(tools, SHELL_TOOLS)
            assert shell is not None
            return tool_call(shell.name, _shell_arguments(shell, MINI_SWE_DONE))
        if self.finish == "finish-tool" and (finish := _pick(tools, FINISH_TOOLS)):
            return tool_call(finish.name, _filled(finish, {"message": "hello.txt written"}))
        return f"Done: {self.filename} now holds the requested line."

    def _terminus(self, request: ChatRequest) -> str:
        """Terminus 2 reads keystrokes from JSON: the command first; then `task_complete`,
        which it asks to have confirmed, so the same answer again."""
        acted = any(m.role == "assistant" for m in request.messages)
        commands = [] if acted else [{"keystrokes": self.command + "\n", "duration": 0.5}]
        return json.dumps({"analysis": "The file is " + ("written." if acted else "missing."),
                           "plan": "Finish." if acted else "Write it with printf.",
                           "commands": commands, "task_complete": acted})


def _has_tool_result(request: ChatRequest) -> bool:
    return any(isinstance(p, ToolResult) for m in request.messages for p in m.parts)


def _mentions(request: ChatRequest, text: str) -> bool:
    return any(text in getattr(p, "text", "") for m in request.messages for p in m.parts)


def _pick(tools: tuple[Tool, ...], names: tuple[str, ...]) -> Tool | None:
    by_name = {t.name: t for t in tools}
    return next((by_name[n] for n in names if n in by_name), None)


def _shell_arguments(tool: Tool, command: str) -> dict[str, Any]:
    properties = (tool.parameters or {}).get("properties", {})
    key = next((k for k in ("command", "cmd", "script") if k in properties), "command")
    kind = properties.get(key, {}).get("type")
    # Codex's `shell` takes an argv array; everyone else a command string.
    value: Any = ["bash", "-lc", command] if kind == "array" else command
    return _filled(tool, {key: value})


def _filled(tool: Tool, arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` plus a plausible value for every other required parameter."""
    schema = tool.parameters or {}
    properties = schema.get("properties", {})
    for name in schema.get("required", []):
        if name in arguments:
            continue
        spec = properties.get(name, {})
        if spec.get("enum"):  # e.g. OpenHands' security_risk: only listed values validate
            arguments[name] = spec["enum"][0]
            continue
        kind = spec.get("type", "string")
        arguments[name] = _FILLERS.get(kind if isinstance(kind, str) else kind[0], "")
    return arguments



@dataclass
class OraclePolicy:
    """Runs each task's reference solution through the harness's own shell tool, then
    finishes the way the harness asks: the runner's end-to-end test policy (every rollout
    should score 1). `solutions` maps a task's instruction to its solution script;
    `listings` maps it to the files the solution writes (path -> text), for a harness that
    runs nothing and only writes the files a reply lists whole (aider): what it cannot
    express (a file deleted or renamed) stays undone."""

    solutions: dict[str, str]
    listings: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def __call__(self, request: ChatRequest) -> Reply:
        task = self._task(request)
        shell = _pick(request.tools, SHELL_TOOLS)
        if task is not None and not request.tools and task in self.listings and _mentions(
                request, WHOLE_FILE_MARKER):
            return Reply(_whole_files(self.listings[task]))
        if task is None or shell is None:
            return Reply("Working on it.")  # a side call (title, summary) or no shell
        if not _has_tool_result(request):
            return Reply(tool_call(shell.name, _shell_arguments(shell, self.solutions[task])))
        if _mentions(request, "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"):  # mini-swe-agent
            return Reply(tool_call(shell.name, _shell_arguments(shell, MINI_SWE_DONE)))
        if finish := _pick(request.tools, FINISH_TOOLS):
            return Reply(tool_call(finish.name, _filled(finish, {"message": "done"})))
        return Reply("Done: the task is complete.")

    def _task(self, request: ChatRequest) -> str | None:
        """The instruction of the task the conversation states. Harnesses quote, escape,
        wrap and reflow the instruction, so it is found by its letters and digits alone;
        the longest match wins, should one task's text hold another's."""
        said = _letters(" ".join(getattr(p, "text", "") for m in request.messages
                                 for p in m.parts))
        found = [(len(key), text) for text in self.solutions
                 if (key := _letters(text)) and key in said]
        return max(found)[1] if found else None


# aider's system prompt for its "whole" edit format names the format so.
WHOLE_FILE_MARKER = "*file listing*"


def _whole_files(files: Mapping[str, str]) -> str:
    """Each file as aider's whole format lists it: the path, then the text in a fence
    longer than any run of backticks inside it."""
    blocks = []
    for path, text in sorted(files.items()):
        fence = "`" * max(3, 1 + max((len(r) for r in re.findall("`+", text)), default=0))
        end = "" if text.endswith("\n") or not text else "\n"  # an empty file stays empty
        blocks.append(f"{path}\n{fence}\n{text}{end}{fence}\n")
    return "Done.\n\n" + "\n".join(blocks)


def _letters(text: str) -> str:
    return "".join(c for c in text.casefold() if c.isalnum())
