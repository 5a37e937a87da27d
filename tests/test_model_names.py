"""One way to name a model (train/model_name.py): every command that takes one accepts the
built-in names, a directory, a run's model or checkpoint and a hub id; a name that cannot
load ends the command with one line and exit code 2, before vLLM starts where that is
knowable, and a vLLM that dies at start-up says why and where its log is."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from harnessrl.errors import ModelUnavailable
from harnessrl.harnesses.base import Harness
from harnessrl.proxy.engines import vllm_server
from harnessrl.train import model_name
from harnessrl.train.model_name import resolve_model


@pytest.fixture
def tiny_name(tiny_model: Path, monkeypatch) -> Path:
    """`tiny` built where the test session's tiny model already is."""
    monkeypatch.setattr(model_name, "TINY_DIR", tiny_model)
    return tiny_model


@pytest.fixture
def offline(monkeypatch, tmp_path: Path) -> Path:
    """The hub switched off and an empty Hugging Face cache of the test's own."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    return tmp_path / "hf"


def _model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_every_form_of_a_name_resolves(tiny_name, tmp_path, offline):
    assert resolve_model("tiny") == str(tiny_name)
    plain = _model_dir(tmp_path / "plain")
    assert resolve_model(str(plain)) == str(plain)
    run = tmp_path / "run"
    _model_dir(run / "model")
    assert resolve_model(str(run)) == str(run / "model")  # a run's trained model
    # a hub id in the local cache passes through to vLLM, which loads it from there
    snapshot = offline / "models--org--cached" / "snapshots" / "abc"
    _model_dir(snapshot)
    (offline / "models--org--cached" / "refs").mkdir()
    (offline / "models--org--cached" / "refs" / "main").write_text("abc")
    assert resolve_model("org/cached") == "org/cached"


@pytest.mark.parametrize(("name", "why"), [
    ("org/not-cached", "not in the local Hugging Face cache with the hub switched off"),
    ("no-such-model", r"not built-in \(tiny, smollm2\), not a directory"),
    ("./missing/dir", "no such directory"),
])
def test_names_that_cannot_load_say_why(name, why, offline):
    with pytest.raises(ModelUnavailable, match=why) as raised:
        resolve_model(name)
    assert repr(name) in str(raised.value)


def test_a_half_written_checkpoint_or_an_empty_directory_is_refused(tmp_path):
    half = _model_dir(tmp_path / "checkpoints" / "checkpoint-3")
    with pytest.raises(ModelUnavailable, match=r"COMPLETE\.json: missing"):
        resolve_model(str(half))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelUnavailable, match=r"config\.json: missing"):
        resolve_model(str(tmp_path / "empty"))


def _never_start(monkeypatch) -> None:
    def launch(self) -> None:
        raise AssertionError(f"vLLM started for {self.model}")

    monkeypatch.setattr(vllm_server.VLLMServer, "launch", launch)


def _train_config(tmp_path: Path, model: str) -> Path:
    config = tmp_path / "train.toml"
    config.write_text(f'run_dir = "{tmp_path / "train"}"\n[model]\npath = "{model}"\n'
                      '[rollout]\nharnesses = ["mini-swe-agent"]\n'
                      'tasks = "bundled:create-hello-file"\n'
                      "[grpo]\ntasks_per_step = 1\nnum_generations = 2\n")
    return config


COMMANDS = {
    "serve": lambda tmp: ["serve", "--run-dir", str(tmp / "s"), "--workers", "1"],
    "run": lambda tmp: ["run", "--harness", "mini-swe-agent", "--tasks",
                        "bundled:create-hello-file", "--run-dir", str(tmp / "r")],
    "eval": lambda tmp: ["eval", "--harness", "mini-swe-agent", "--tasks",
                         "bundled:create-hello-file", "--run-dir", str(tmp / "e")],
    "demo": lambda tmp: ["demo", "--run-dir", str(tmp / "d")],
}


@pytest.mark.parametrize("command", [*COMMANDS, "train"])
def test_a_name_that_cannot_load_ends_the_command_in_one_line(command, tmp_path, offline,
                                                             monkeypatch, capsys):
    from harnessrl.cli import main

    _never_start(monkeypatch)
    if command == "train":
        argv = ["train", "--config", str(_train_config(tmp_path, "no-such-model"))]
    else:
        argv = [*COMMANDS[command](tmp_path), "--model", "no-such-model"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("harnessrl: model 'no-such-model': not built-in"), err


FAKE_VLLM = """import sys
print("INFO starting vLLM API server", flush=True)
print("OSError: We couldn't connect to 'https://huggingface.co' to load the files, and "
      "couldn't find them in the cached files.", flush=True)
sys.exit(1)
"""


@pytest.mark.parametrize("command", ["serve", "run"])
def test_an_engine_that_dies_at_start_up_is_one_line(command, tmp_path, monkeypatch, capsys):
    """A hub id with the hub allowed goes to vLLM; this stand-in fails as vLLM does when
    no hub answers."""
    from harnessrl.cli import main

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM)
    monkeypatch.setattr(vllm_server.VLLMServer, "command",
                        lambda self: [sys.executable, str(script)])
    assert main([*COMMANDS[command](tmp_path), "--model", "org/some-model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    log = next(tmp_path.glob("*/vllm.log"))
    assert err == (f"harnessrl: model 'org/some-model': vLLM exited with code 1 while "
                   f"starting: not a directory and no hub is reachable (log: {log})")


def test_startup_causes_from_the_log():
    cause = vllm_server.startup_cause
    assert cause("x\nValueError: max_model_len 99999 is too large\nmore") == (
        "ValueError: max_model_len 99999 is too large")
    assert cause("torch.OutOfMemoryError: CUDA out of memory") == "out of memory"
    assert cause("INFO all fine\n") == ""


# -- vLLM started on the built-in model by each command ----------------------------------------

CALLER = r'''
import os, sys
from openai import OpenAI
client = OpenAI(base_url=os.environ["AGENT_BASE"], api_key=os.environ["AGENT_KEY"],
                max_retries=0)
reply = client.chat.completions.create(model="any", max_tokens=4,
                                       messages=[{"role": "user", "content": sys.argv[1]}])
print(reply.model)
'''


class _Caller(Harness):
    def executable(self, tools_dir: Path) -> Path:
        return Path(sys.executable)


@pytest.fixture
def caller(tmp_path: Path, monkeypatch) -> Path:
    """A harness `caller` that makes one chat call through the proxy; a task for it."""
    import harnessrl.harnesses

    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    harness = _Caller(name="caller", version="1", dialect="openai_chat", registry="pypi",
                      package="-", binary="python",
                      argv=lambda ctx, instruction: [str(script), instruction],
                      env=lambda ctx: {"AGENT_BASE": ctx.openai_base, "AGENT_KEY": ctx.key})
    get = harnessrl.harnesses.get
    monkeypatch.setattr(harnessrl.harnesses, "get",
                        lambda name: harness if name == "caller" else get(name))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "hi", "instruction": "Say hi",
                                 "verify": ["true"], "timeout": 120}))
    return tasks


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "eval"])
def test_run_and_eval_start_vllm_on_the_built_in_model(command, caller, tiny_name, tmp_path):
    from harnessrl.cli import main
    from harnessrl.store.reader import TraceReader

    run_dir = tmp_path / "run"
    assert main([command, "--harness", "caller", "--tasks", str(caller), "--model", "tiny",
                 "--run-dir", str(run_dir), "--no-hide", "--retries", "0",
                 "--max-tokens", "4"]) == 0
    with TraceReader(run_dir) as store:
        turns = list(store.iter_turns())
    assert turns and {t.engine for t in turns} == {"vllm"}
    # sampled by the tiny model, its ids captured
    assert all(t.completion and t.completion.tokens.completion_ids for t in turns)
    # vLLM's own INFO lines (which name the model) are off once an earlier test module
    # has configured vLLM's logging in this process; the weights loading is always logged
    log = (run_dir / "vllm.log").read_text()
    assert "tiny-qwen2" in log or "Loading safetensors checkpoint" in log


@pytest.mark.vllm
@pytest.mark.slow
def test_serve_starts_vllm_on_the_built_in_model(tmp_path):
    import subprocess

    import httpx

    from harnessrl.proxy.engines.vllm_server import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    built = model_name.TINY_DIR.expanduser()  # `tiny` as the command builds it (cached)
    server = subprocess.Popen([sys.executable, "-m", "harnessrl.cli", "serve", "--model",
                               "tiny", "--port", str(port), "--workers", "1", "--run-dir",
                               str(tmp_path / "s")], env=env, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert server.stderr is not None
        for line in server.stderr:
            if "harnessrl proxy on" in line:
                break
        else:
            raise AssertionError(f"serve ended: {server.wait()}")
        base = f"http://127.0.0.1:{port}"
        # the line is printed just before the proxy listens: a moment's retry
        for _ in range(100):
            try:
                key = httpx.post(f"{base}/rollouts", json={}, timeout=30).json()["key"]
                break
            except httpx.ConnectError:
                time.sleep(0.1)
        else:
            raise AssertionError("the proxy never listened")
        models = httpx.get(f"{base}/r/{key}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == [str(built)], models
    finally:
        server.terminate()
        server.wait(timeout=60)
