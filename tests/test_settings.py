"""The settings layer: every command-line flag of a settings field has that field's own
default, flags and settings round-trip, and no flag restates a settings field by hand."""

from __future__ import annotations

import argparse
from typing import Annotated

import pytest

from harnessrl.cli import build_parser
from harnessrl.cli.common import SAMPLING_FLAGS, sampling_from_flags
from harnessrl.proxy.config import ProxySettings
from harnessrl.proxy.engines.build import EngineSettings
from harnessrl.rollout.cluster.driver import ClusterSettings
from harnessrl.rollout.rewards import Shaping
from harnessrl.rollout.runner import RolloutSettings, RunSettings
from harnessrl.settings import Field, add_flags, flag, flagged, from_flags
from harnessrl.types import Sampling

SETTINGS = (RolloutSettings, RunSettings, Shaping, EngineSettings, ProxySettings,
            ClusterSettings)
# (type, its flags where they are declared beside the commands)
FLAGGED = [(cls, None) for cls in SETTINGS] + [(Sampling, SAMPLING_FLAGS)]
# The least each command needs to parse.
REQUIRED = {
    "serve": ["--engine-url", "http://127.0.0.1:9"],
    "run": ["--harness", "h", "--tasks", "t", "--oracle"],
    "eval": ["--harness", "h", "--tasks", "t", "--oracle"],
    "doctor": ["some-harness"],
    "check": ["some-task-set"],
}


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, its parser) for every command and sub-command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _commands(sub, (*path, name))


def _linked(parser: argparse.ArgumentParser) -> list[tuple[argparse.Action, Field]]:
    return [(a, a.setting) for a in parser._actions if hasattr(a, "setting")]


def test_every_flag_default_is_its_settings_field_default() -> None:
    checked = 0
    for words, parser in _commands(build_parser()):
        if not _linked(parser):
            continue
        args = build_parser().parse_args([*words, *REQUIRED.get(words[-1], [])])
        for action, field in _linked(parser):
            if action.dest in ("engine_url", "oracle") or action.required:
                continue  # given above
            assert field.to_setting(getattr(args, action.dest)) == field.default, (
                f"{' '.join(words)} {action.option_strings[0]}: its default is not "
                f"{field.owner.__name__}.{field.name}'s")
            checked += 1
    assert checked > 40  # serve, run and eval all declare their settings this way


@pytest.mark.parametrize("command", ["run", "eval"])
def test_run_flags_build_the_settings_types_defaults(command: str) -> None:
    args = build_parser().parse_args([command, *REQUIRED[command]])
    assert from_flags(RolloutSettings, args) == RolloutSettings()
    assert from_flags(Shaping, args) == Shaping()
    assert from_flags(ClusterSettings, args) == ClusterSettings()
    assert sampling_from_flags(args) is None


def test_serve_flags_build_the_settings_types_defaults() -> None:
    args = build_parser().parse_args(["serve", *REQUIRED["serve"]])
    assert from_flags(ProxySettings, args) == ProxySettings()
    assert from_flags(EngineSettings, args) == EngineSettings(url="http://127.0.0.1:9")
    assert sampling_from_flags(args) is None


def test_no_flag_restates_a_settings_field_by_hand() -> None:
    """A flag spelled like a settings field's but declared with add_argument (its default
    written again) is found."""
    options = {o: f for cls, flags in FLAGGED for f in flagged(cls, flags).values()
               for o in f.option_strings}
    restated = [f"{' '.join(words)} {o}" for words, parser in _commands(build_parser())
                for a in parser._actions if not hasattr(a, "setting")
                for o in a.option_strings if o in options]
    # serve's --max-model-calls is the server-wide cap, ui's --tokenizer shows ids as text
    # and demo's --model is its model directory: none is a settings field
    assert restated == ["serve --max-model-calls", "ui --tokenizer", "demo --model"]


def test_flags_and_settings_round_trip() -> None:
    args = build_parser().parse_args([
        "run", *REQUIRED["run"], "--no-hide", "--concurrency", "5", "--tools-dir", "/x",
        "--shaping", "tests.test_runner:flat", "--tool-call-budget", "4", "-k", "3",
        "--max-model-calls", "7", "--temperature", "0.5"])
    assert from_flags(RolloutSettings, args) == RolloutSettings(
        hide_host=False, concurrency=5, tools_dir="/x", max_model_calls=7)
    assert from_flags(Shaping, args) == Shaping(custom=("tests.test_runner:flat",),
                                                tool_call_budget=4)
    assert sampling_from_flags(args) == Sampling(temperature=0.5)
    assert args.samples == 3
    serve = build_parser().parse_args(["serve", "--model", "m", "--max-body-mb", "0.5",
                                       "--stream-interval-ms", "20", "--vllm-arg", "a",
                                       "--vllm-arg", "b", "--engine-mode", "token"])
    assert from_flags(ProxySettings, serve).max_body_bytes == 512 * 1024
    spec = from_flags(EngineSettings, serve)
    assert (spec.stream_interval, spec.vllm_args, spec.kind) == (0.02, ["a", "b"], "token")


def test_a_flag_takes_its_default_and_help_from_the_field(capsys) -> None:
    import dataclasses

    @dataclasses.dataclass
    class Knobs:
        width: Annotated[int, flag("how wide (default %(default)s)")] = 7
        unflagged: str = "x"

    parser = argparse.ArgumentParser()
    add_flags(parser, Knobs)
    assert parser.parse_args([]).width == 7
    assert parser.parse_args(["--width", "3"]).width == 3
    assert not hasattr(parser.parse_args([]), "unflagged")
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert "how wide (default 7)" in capsys.readouterr().out


def test_a_bad_shaping_term_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"nowhere\.at\.all:f"):
        Shaping(custom=("nowhere.at.all:f",))
