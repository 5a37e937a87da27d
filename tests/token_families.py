# ruff: noqa: RUF001  (the DeepSeek tokens are written with full-width bars)
"""Per-family test material for token mode: each family's special tokens (added at test
time to the tiny model's trained tokenizer, so no hub is needed), what a model of that
family samples for "reason, then call bash ls" in its own markup, and a plain answer.

The markup strings are written out here as the families' templates write them (not
produced by the renderer under test), so the renderer's parser is checked against them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

QWEN_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>",
               "<tool_response>", "</tool_response>", "<think>", "</think>")
VISION = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


@dataclass(frozen=True)
class Family:
    name: str  # the `renderer` setting (a renderers family) or "lfm2" (generic path)
    tokens: tuple[str, ...]
    call: str  # reasoning + a bash("ls") call, ending with the family's stop token
    answer: str  # a plain answer, ending with the stop token
    eos: str  # the tokenizer's EOS
    settings: tuple[tuple[str, Any], ...] = ()  # TokenEngine keyword arguments
    template: str | None = None  # the tokenizer's chat template (generic path only)
    reasoning: str | None = "plan"  # the reasoning the call's reply holds


LFM2_TEMPLATE = r"""
{{- bos_token -}}
{%- set ns = namespace(system="") -%}
{%- if messages[0]["role"] == "system" -%}
  {%- set ns.system = messages[0]["content"] -%}
  {%- set messages = messages[1:] -%}
{%- endif -%}
{%- if tools -%}
  {%- set ns.system = ns.system + ("\n" if ns.system else "") -%}
  {%- set ns.system = ns.system + "List of tools: <|tool_list_start|>[" -%}
  {%- for tool in tools -%}
    {%- set ns.system = ns.system + (tool | tojson) + (", " if not loop.last else "") -%}
  {%- endfor -%}
  {%- set ns.system = ns.system + "]<|tool_list_end|>" -%}
{%- endif -%}
{%- if ns.system -%}{{- "<|im_start|>system\n" + ns.system + "<|im_end|>\n" -}}{%- endif -%}
{%- for message in messages -%}
  {{- "<|im_start|>" + message["role"] + "\n" -}}
  {%- if message["role"] == "tool" -%}
    {{- "<|tool_response_start|>" + message["content"] + "<|tool_response_end|>" -}}
  {%- else -%}
    {{- message["content"] or "" -}}
  {%- endif -%}
  {%- if message["tool_calls"] -%}
    {{- "<|tool_call_start|>[" -}}
    {%- for call in message["tool_calls"] -%}
      {%- set arguments = call["function"]["arguments"] -%}
      {{- call["function"]["name"] + "(" -}}
      {%- for key, value in arguments.items() -%}
        {{- key + "=" + (value | tojson) + (", " if not loop.last else "") -}}
      {%- endfor -%}
      {{- ")" + (", " if not loop.last else "") -}}
    {%- endfor -%}
    {{- "]<|tool_call_end|>" -}}
  {%- endif -%}
  {{- "<|im_end|>\n" -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- "<|im_start|>assistant\n" -}}{%- endif -%}
"""

FAMILIES: tuple[Family, ...] = (
    Family("qwen3", QWEN_TOKENS,
           '<think>\nplan\n</think>\n\nListing.\n<tool_call>\n{"name": "bash", "arguments": '
           '{"command": "ls"}}\n</tool_call><|im_end|>', "Done.<|im_end|>", "<|im_end|>"),
    Family("qwen3.5", QWEN_TOKENS + VISION,
           "plan\n</think>\n\nListing.\n\n<tool_call>\n<function=bash>\n<parameter=command>"
           "\nls\n</parameter>\n</function>\n</tool_call><|im_end|>",
           "Checked.\n</think>\n\nDone.<|im_end|>", "<|im_end|>"),
    Family("glm-4.5", ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
                       "<|observation|>", "<|endoftext|>", "<think>", "</think>",
                       "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                       "<arg_value>", "</arg_value>"),
           "\n<think>plan</think>\nListing.\n<tool_call>bash\n<arg_key>command</arg_key>\n"
           "<arg_value>ls</arg_value>\n</tool_call><|observation|>",
           "\n<think></think>\nDone.<|user|>", "<|endoftext|>"),
    Family("llama-3", ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                       "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
           '{"name": "bash", "parameters": {"command": "ls"}}<|eot_id|>',
           "Done.<|eot_id|>", "<|eot_id|>", reasoning=None),
    Family("deepseek-v3", ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
                           "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                           "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
                           "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
                           "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"),
           "Listing.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>bash\n"
           '```json\n{"command": "ls"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
           "<｜end▁of▁sentence｜>", "Done.<｜end▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
           reasoning=None),
    Family("kimi-k2", ("<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>",
                       "<|im_end|>", "<|tool_calls_section_begin|>",
                       "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                       "<|tool_call_argument_begin|>", "<|tool_call_end|>"),
           "Listing.<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0"
           '<|tool_call_argument_begin|>{"command": "ls"}<|tool_call_end|>'
           "<|tool_calls_section_end|><|im_end|>", "Done.<|im_end|>", "<|im_end|>",
           reasoning=None),
    Family("lfm2", ("<|im_start|>", "<|im_end|>", "<|tool_list_start|>", "<|tool_list_end|>",
                    "<|tool_call_start|>", "<|tool_call_end|>", "<|tool_response_start|>",
                    "<|tool_response_end|>"),
           '<|tool_call_start|>[bash(command="ls")]<|tool_call_end|><|im_end|>',
           "Done.<|im_end|>", "<|im_end|>", (("tool_parser", "lfm2"),),
           template=LFM2_TEMPLATE, reasoning=None),
)
BY_NAME = {f.name: f for f in FAMILIES}


def family_tokenizer(tiny_model: Path, family: Family, *, template: str | None = None) -> Any:
    """The tiny model's tokenizer with `family`'s special tokens (and template) added."""
    from transformers import PreTrainedTokenizerFast

    # Not AutoTokenizer: the tiny model's config makes that a Qwen2Tokenizer, whose unk
    # token is <|endoftext|>, which a family's renderer then takes for a missing token.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny_model)
    tokenizer.add_special_tokens({"additional_special_tokens": list(family.tokens)})
    tokenizer.eos_token = family.eos
    tokenizer.chat_template = template if template is not None else (family.template or "")
    return tokenizer


def engine_settings(family: Family) -> dict[str, Any]:
    if family.template is not None:
        return dict(family.settings)
    return {"renderer": family.name, **dict(family.settings)}


def speaking(family: Family, tokenizer: Any) -> Any:
    """A policy wrapper: the scripted policy's replies (Hermes `<tool_call>` JSON) written
    in `family`'s own markup, as its renderer writes an assistant message after the
    generation prompt (what a model of the family samples)."""
    import json

    import renderers
    from renderers.configs import config_from_name

    from harnessrl.proxy.engines.scripted import Reply
    from harnessrl.proxy.engines.token.parsers import HermesParser
    from harnessrl.types import TextDelta, ToolCallDelta

    renderer = renderers.create_renderer(tokenizer, config_from_name(family.name))
    base = [{"role": "user", "content": "Do the task."}]
    prompt = renderer.render_ids(base, add_generation_prompt=True)

    def wrap(policy: Any) -> Any:
        def ask(request: Any) -> Reply:
            parser = HermesParser()
            deltas = parser.feed(policy(request).text) + parser.finish()
            text = "".join(d.text for d in deltas if isinstance(d, TextDelta))
            calls = [{"id": f"call_{d.index}", "type": "function", "function": {
                "name": d.name, "arguments": json.loads(d.arguments)}}
                for d in deltas if isinstance(d, ToolCallDelta)]
            # With reasoning, as thinking models answer (and the prompt may open it).
            message: dict[str, Any] = {"role": "assistant", "content": text,
                                       "reasoning_content": "Plan."}
            if calls:
                message["tool_calls"] = calls
            ids = renderer.render_ids([*base, message])
            assert ids[:len(prompt)] == prompt, "the family's reply does not follow its prompt"
            ids = ids[len(prompt):]
            stops = renderer.get_stop_token_ids()
            if ids[-1] not in stops:  # GLM: the next role's token ends the reply
                after = tokenizer.convert_tokens_to_ids(
                    "<|observation|>" if calls else "<|user|>")
                ids.append(after if after in stops else stops[0])
            return Reply(tokenizer.decode(ids, skip_special_tokens=False), eos=False)
        return ask
    return wrap
