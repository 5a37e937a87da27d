"""The engine's format settings where they were missing: in chat mode a configured chat
template and its kwargs go to vLLM with every call (and a vLLM started here trusts them);
`--chat-template FILE` in serve, run and eval; a call's `reasoning_effort` reaches a
`renderers` family in token mode as vLLM hands it to a template; and `POST /rollouts`
naming one of them is told it is the engine's (one served model, one format)."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from harnessrl.errors import InvalidRequest
from harnessrl.proxy.engines.build import EngineSettings, make, server_for
from harnessrl.proxy.engines.token.engine import TokenEngine
from harnessrl.proxy.serve import in_thread, running
from harnessrl.types import ChatRequest, Message, Text
from tests.fake_vllm import FakeVLLM
from tests.token_families import QWEN_TOKENS, VISION, Family, family_tokenizer

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def test_chat_mode_sends_the_configured_template_and_kwargs_with_every_call(tmp_path) -> None:
    fake = FakeVLLM()
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    with in_thread(fake.app()) as (url, _):
        spec = EngineSettings(kind="chat", url=url, chat_template=str(template),
                              chat_template_kwargs={"enable_thinking": False})
        with running(make(spec), tmp_path / "run") as served:
            key = httpx.post(f"{served.url}/rollouts", json={}).json()["key"]
            client = openai.OpenAI(base_url=f"{served.url}/r/{key}/v1", api_key=key,
                                   max_retries=0)
            client.chat.completions.create(model="fake", reasoning_effort="low",
                                           messages=[{"role": "user", "content": "hi"}])
            list(client.chat.completions.create(
                model="fake", stream=True, messages=[{"role": "user", "content": "hi"}]))
    first, second = fake.requests
    for body in (first, second):
        assert body["chat_template"] == TEMPLATE
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert first["reasoning_effort"] == "low" and "reasoning_effort" not in second
    plain = FakeVLLM()
    with in_thread(plain.app()) as (url, _), \
            running(make(EngineSettings(kind="chat", url=url)), tmp_path / "plain") as served:
        key = httpx.post(f"{served.url}/rollouts", json={}).json()["key"]
        openai.OpenAI(base_url=f"{served.url}/r/{key}/v1", api_key=key).chat.completions.create(
            model="fake", messages=[{"role": "user", "content": "hi"}])
    assert not {"chat_template", "chat_template_kwargs"} & set(plain.requests[0])


def test_a_vllm_started_here_trusts_the_template_it_is_sent() -> None:
    def command(**spec) -> list[str]:
        server = server_for(EngineSettings(model="m", **spec))
        server.port = 8000
        return server.command()

    assert "--trust-request-chat-template" in command(chat_template="template.jinja")
    assert "--trust-request-chat-template" not in command()
    # token mode: the proxy renders, vLLM only samples from ids
    assert "--trust-request-chat-template" not in command(kind="token",
                                                          chat_template="template.jinja")


def test_chat_template_is_a_file_flag_in_serve_run_and_eval(tmp_path) -> None:
    from harnessrl.cli import build_parser
    from harnessrl.cli.run import _run_engine_spec
    from harnessrl.cli.serve import engine_spec

    path = tmp_path / "template.jinja"
    path.write_text(TEMPLATE)
    url = ["--engine-url", "http://127.0.0.1:9", "--chat-template", str(path)]
    assert engine_spec(build_parser().parse_args(["serve", *url])).template_text() == TEMPLATE
    for command in ("run", "eval"):
        args = build_parser().parse_args([command, "--harness", "pi", "--tasks", "bundled",
                                          "--run-dir", str(tmp_path / command), *url])
        assert _run_engine_spec(args).template_text() == TEMPLATE
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", *url[:2], "--chat-template",
                                   str(tmp_path / "missing.jinja")])


def _qwen38_engine(tiny_model: Path, **options) -> TokenEngine:
    family = Family("qwen3.8", QWEN_TOKENS + VISION, "", "", "<|im_end|>")
    return TokenEngine("http://127.0.0.1:9", family_tokenizer(tiny_model, family),
                       renderer="qwen3.8", **options)


def _prompt(engine: TokenEngine, effort: str | None) -> str:
    request = ChatRequest(model="m", reasoning_effort=effort, messages=(
        Message(role="system", parts=(Text("Be brief."),)),
        Message(role="user", parts=(Text("hi"),))))
    return engine.renderer.render(request).text


def test_a_calls_reasoning_effort_reaches_a_family_renderer(tiny_model) -> None:
    engine = _qwen38_engine(tiny_model, chat_template_kwargs={"enable_thinking": True})
    assert "Reasoning effort is set to low." in _prompt(engine, "low")
    assert "Reasoning effort is set to xhigh." in _prompt(engine, "xhigh")
    assert "Reasoning effort" in _prompt(engine, None)  # the configured renderer's own
    with pytest.raises(InvalidRequest, match=r"'high'.*qwen3\.8.*'xhigh', 'medium' or 'low'"):
        _prompt(engine, "high")
    # unless configured, an effort turns thinking on and "none" turns it off, as vLLM
    # does for a template
    unset = _qwen38_engine(tiny_model)
    assert "Reasoning effort is set to low." in _prompt(unset, "low")
    assert "Reasoning effort" not in _prompt(unset, "none")
    assert _prompt(unset, "none").endswith("<think>\n\n</think>\n\n")


def test_post_rollouts_naming_an_engine_setting_is_told_where_it_is_set(tmp_path) -> None:
    fake = FakeVLLM()
    with in_thread(fake.app()) as (url, _), \
            running(make(EngineSettings(kind="chat", url=url)), tmp_path / "run") as served:
        for name, flag in (("tool_call_parser", "--tool-call-parser"),
                           ("chat_template_kwargs", "--chat-template-kwargs")):
            resp = httpx.post(f"{served.url}/rollouts", json={name: "x"})
            error = resp.json()["error"]
            assert resp.status_code == 400 and error["param"] == name, resp.text
            assert flag in error["message"] and "engine" in error["message"]
        assert httpx.post(f"{served.url}/rollouts", json={"nope": 1}).status_code == 400


def test_the_template_is_read_from_its_file_once_and_travels_as_text(tmp_path) -> None:
    """`chat_template` is a path in every setting; the text is read by `template_text`, and
    a Ray node builds its engines from the driver's text, without the file."""
    from harnessrl.rollout.cluster.run import engines_from

    path = tmp_path / "template.jinja"
    path.write_text(TEMPLATE)
    spec = EngineSettings(kind="chat", url="http://127.0.0.1:9", chat_template=str(path))
    assert make(spec).template["chat_template"] == TEMPLATE  # type: ignore[attr-defined]
    text = spec.template_text()
    path.unlink()  # as on a node that lacks the driver's file
    [engine] = engines_from([spec], text)
    assert engine.template["chat_template"] == TEMPLATE  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="chat_template: cannot read"):
        make(spec)
