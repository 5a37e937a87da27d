"""A Hermes/Qwen2.5-style chat template shared by every model we ship.

Layout of a rendered conversation::

    <|im_start|>system
    {system text}

    # Tools
    ...<tools>
    {one JSON tool per line}
    </tools>...<|im_end|>
    <|im_start|>user
    {text}<|im_end|>
    <|im_start|>assistant
    <think>
    {reasoning}
    </think>

    {content}
    <tool_call>
    {"name": "f", "arguments": {...}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    {result 1}
    </tool_response>
    <tool_response>
    {result 2}
    </tool_response><|im_end|>
    <|im_start|>assistant

Design notes (why, not what):

* Text parts of list-valued ``content`` are joined with ``"\\n"``: that is what
  vLLM does itself when it flattens OpenAI content parts for a template it
  classifies as "string" format, so both paths render the same bytes.
* The template never loops over ``message.content`` (it uses filters), so
  vLLM's AST sniffing classifies it as "string" format and normalises parts
  before rendering.
* ``arguments`` arrive as a dict from vLLM (it ``json.loads`` them) and may
  arrive as a JSON string from direct ``apply_chat_template`` callers: a dict is
  rendered with ``tojson`` (the same ``json.dumps`` formatting vLLM's hermes
  parser produces), a string verbatim, so a generated call re-renders to the
  very text the model produced when the model used canonical JSON.
* Reasoning is rendered for every assistant turn (unlike Qwen3, which drops it
  from history): a rollout's earlier turns then stay a byte-exact prefix of
  later prompts, which RL token accounting relies on.
* vLLM passes reasoning as ``reasoning`` and ``reasoning_content``; transformers
  callers usually use ``reasoning_content``: both are accepted.
"""

from __future__ import annotations

HERMES_TEMPLATE: str = r"""
{%- macro render_text(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {{- content | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\n') -}}
    {%- endif -%}
{%- endmacro -%}
{%- macro render_tool_call(call) -%}
    {%- if call.function is defined -%}
        {%- set call = call.function -%}
    {%- endif -%}
    {{- '<tool_call>\n{"name": ' + (call.name | tojson) + ', "arguments": ' -}}
    {%- if call.arguments is string -%}
        {{- call.arguments -}}
    {%- elif call.arguments is mapping -%}
        {{- call.arguments | tojson -}}
    {%- else -%}
        {{- '{}' -}}
    {%- endif -%}
    {{- '}\n</tool_call>' -}}
{%- endmacro -%}
{%- set first_is_system = messages | length > 0 and messages[0].role == 'system' -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if first_is_system -%}
        {{- render_text(messages[0].content) + '\n\n' -}}
    {%- endif -%}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and '
        'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n'
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif first_is_system -%}
    {{- '<|im_start|>system\n' + render_text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'system' and loop.first -%}
        {#- already rendered above, merged with the tool list -#}
    {%- elif message.role == 'assistant' -%}
        {%- set text = render_text(message.content) -%}
        {%- set reasoning = message.reasoning_content or message.reasoning or '' -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if reasoning -%}
            {{- '<think>\n' + reasoning + '\n</think>\n\n' -}}
        {%- endif -%}
        {{- text -}}
        {%- for call in message.tool_calls or [] -%}
            {%- if text or not loop.first -%}
                {{- '\n' -}}
            {%- endif -%}
            {{- render_tool_call(call) -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + render_text(message.content) + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\n' + render_text(message.content) + '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""
