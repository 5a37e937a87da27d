"""Canonical requests as OpenAI chat-completions JSON, for engines that take that shape
(vLLM's chat endpoint, and chat templates in transformers, which read the same shape)."""

from __future__ import annotations

from typing import Any

from harnessrl.types import (
    ChatRequest,
    Image,
    Message,
    Reasoning,
    Sampling,
    Text,
    Tool,
    ToolCall,
    ToolResult,
)


def messages(request: ChatRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in request.messages:
        out.extend(_message(message))
    return out


def _message(message: Message) -> list[dict[str, Any]]:
    # Tool results become one `tool` message each, before any text that came with them
    # (Anthropic and Gemini put results and new user text in one message).
    results = [p for p in message.parts if isinstance(p, ToolResult)]
    out = [{"role": "tool", "tool_call_id": r.call_id, "content": _content(r.content)}
           for r in results]
    content = [p for p in message.parts if isinstance(p, Text | Image)]
    calls = [p for p in message.parts if isinstance(p, ToolCall)]
    reasoning = "".join(p.text for p in message.parts if isinstance(p, Reasoning))
    if results and not content:
        return out
    entry: dict[str, Any] = {"role": message.role, "content": _content(content)}
    if message.name is not None:
        entry["name"] = message.name
    if reasoning:
        entry["reasoning_content"] = reasoning
    if calls:
        entry["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    out.append(entry)
    return out


def _content(parts: tuple[Text | Image, ...] | list[Text | Image]) -> str | list[Any] | None:
    if not parts:
        return None
    if len(parts) == 1 and isinstance(parts[0], Text):
        return parts[0].text
    return [
        {"type": "text", "text": p.text} if isinstance(p, Text)
        else {"type": "image_url", "image_url": {"url": p.url}}
        for p in parts
    ]


def tools(items: tuple[Tool, ...]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {
            "name": t.name,
            **({"description": t.description} if t.description is not None else {}),
            "parameters": t.parameters if t.parameters is not None else {"type": "object"},
            **({"strict": t.strict} if t.strict is not None else {}),
        }}
        for t in items
    ]


def sampling(values: Sampling) -> dict[str, Any]:
    out = {k: v for k, v in {
        "temperature": values.temperature, "top_p": values.top_p, "top_k": values.top_k,
        "min_p": values.min_p, "max_tokens": values.max_tokens, "seed": values.seed,
        "presence_penalty": values.presence_penalty,
        "frequency_penalty": values.frequency_penalty,
        "repetition_penalty": values.repetition_penalty,
    }.items() if v is not None}
    if values.stop is not None:
        out["stop"] = list(values.stop)
    return out


def chat_body(request: ChatRequest, *, stream: bool) -> dict[str, Any]:
    """The chat-completions body an engine is sent, asking for exact ids and logprobs."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages(request),
        **sampling(request.sampling),
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if request.tools:
        body["tools"] = tools(request.tools)
    choice = request.tool_choice
    if choice is not None and request.tools:
        body["tool_choice"] = (
            {"type": "function", "function": {"name": choice.name}} if choice.name else choice.mode
        )
    if request.parallel_tool_calls is not None and request.tools:
        body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.reasoning_effort is not None:
        body["reasoning_effort"] = request.reasoning_effort
    return body
