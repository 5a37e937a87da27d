"""Start vLLM as a child process with the flags a model needs, and stop it again."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harnessrl.errors import EngineStartFailed
from harnessrl.http.call import call
from harnessrl.http.client import TransportError
from harnessrl.proxy.engines.token.formats import template_parser

# Tool-call parser by model family, for models whose chat template does not say.
# Checked in order against the model's `model_type` and its name.
_TOOL_PARSERS: list[tuple[str, str]] = [
    ("qwen3_coder", "qwen3_coder"),
    ("qwen3-coder", "qwen3_coder"),
    ("qwen", "hermes"),
    ("hermes", "hermes"),
    ("llama", "llama3_json"),
    ("mistral", "mistral"),
    ("deepseek", "deepseek_v3"),
]
_REASONING_PARSERS: list[tuple[str, str]] = [("qwen3", "qwen3"), ("deepseek-r1", "deepseek_r1")]
# Why vLLM did not start, from its log: the first of these found (checked in order)
# names the cause; otherwise the log's last error line is quoted.
_STARTUP_CAUSES: list[tuple[str, str]] = [
    ("OfflineModeIsEnabled", "not a directory, and not in the local Hugging Face cache "
                             "with the hub switched off (HF_HUB_OFFLINE)"),
    ("LocalEntryNotFoundError", "not a directory and no hub is reachable"),
    ("couldn't connect to", "not a directory and no hub is reachable"),
    ("Failed to resolve", "not a directory and no hub is reachable"),
    ("Max retries exceeded", "not a directory and no hub is reachable"),
    ("RepositoryNotFoundError", "no such model on the hub"),
    ("is not a local folder and is not a valid model identifier",
     "not a directory and no hub is reachable"),
    ("Unrecognized model", "the directory holds no model vLLM knows (config.json)"),
    ("does not appear to have a file named config.json", "no config.json in the directory"),
    ("Cannot allocate memory", "out of memory"),
    ("out of memory", "out of memory"),
    ("Address already in use", "its port is taken"),
]


@dataclass
class VLLMServer:
    """A vLLM OpenAI-compatible server run as a child in its own process group."""

    model: str
    served_name: str | None = None
    port: int | None = None
    host: str = "127.0.0.1"
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    max_model_len: int | None = None
    dtype: str | None = None
    extra_args: list[str] = field(default_factory=list)
    python: str = sys.executable
    log_path: Path | None = None
    startup_timeout: float = 900.0
    process: subprocess.Popen[bytes] | None = None
    # chat: vLLM renders and parses (needs its tool/reasoning parsers); token: the proxy
    # renders and parses, vLLM only samples from ids (/v1/completions), so none are set.
    engine_mode: str = "chat"
    # chat mode with a configured chat template: the engine sends it with every call
    # (`VLLMEngine`), which vLLM takes only when told to trust a request's template
    trust_request_chat_template: bool = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def parser(self) -> str | None:
        """The tool-call format name for this model (vLLM's and token mode's)."""
        return self.tool_call_parser or tool_call_parser_for(self.model)

    def command(self) -> list[str]:
        chat = self.engine_mode == "chat"
        parser = self.parser() if chat else None
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
               "--host", self.host, "--port", str(self.port)]
        if self.served_name:
            cmd += ["--served-model-name", self.served_name]
        if parser:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
        reasoning = self.reasoning_parser or _match(self.model, _REASONING_PARSERS)
        if reasoning and chat:
            cmd += ["--reasoning-parser", reasoning]
        if self.trust_request_chat_template and chat:
            cmd += ["--trust-request-chat-template"]
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.dtype:
            cmd += ["--dtype", self.dtype]
        if _cpu_build():
            cmd += ["--enforce-eager"]  # torch.compile costs a minute of start-up on CPU
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", "1" if Path(self.model).exists() else "0")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("VLLM_SERVER_DEV_MODE", "1")  # /weight_info and weight reloads
        if _cpu_build():
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        return env

    def start(self) -> str:
        self.launch()
        self.wait_healthy()
        return self.url

    def launch(self) -> None:
        """Start the process without waiting for it to serve. The calling thread is its
        parent for Linux: the child is signalled when that thread ends (see
        `_die_with_parent`), so launch from a thread that outlives the server."""
        if self.port is None:
            self.port = free_port(self.host)
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(self.command(), env=self.environment(), stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=_die_with_parent)

    def wait_healthy(self) -> None:
        """Until vLLM answers /health; EngineStartFailed (one line: the model, why, the
        log) if it exits first or is not healthy by `startup_timeout`."""
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise EngineStartFailed(self._failure(
                    f"vLLM exited with code {self.process.returncode} while starting"))
            with contextlib.suppress(TransportError, TimeoutError, OSError):
                if call("GET", f"{self.url}/health", timeout=2).status == 200:
                    return
            time.sleep(0.5)  # not up yet, or up and not ready (a 503)
        self.stop()
        raise EngineStartFailed(self._failure(
            f"vLLM was not healthy after {self.startup_timeout:.0f} s"))

    def _failure(self, what: str) -> str:
        """`what` happened to the vLLM for this model, why (from its log), where the log is."""
        log = self.log_path
        tail = ""
        if log is not None:
            with contextlib.suppress(OSError), open(log, "rb") as handle:
                handle.seek(max(0, os.path.getsize(log) - 64_000))
                tail = handle.read().decode(errors="replace")
        why = startup_cause(tail)
        where = f"log: {log}" if log is not None else "no log kept (--vllm-log FILE keeps one)"
        return f"model {self.model!r}: {what}{f': {why}' if why else ''} ({where})"

    def stop(self, grace: float = 15.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def tool_call_parser_for(model: str) -> str | None:
    """The tool-call parser the local model's chat template writes for (token mode's
    table: `<tool_call>` JSON is hermes, with `<function=…>` qwen3_coder, `<|tool_call_start|>`
    lfm2, ...); otherwise the family decides by name."""
    path = Path(model)
    template = ""
    config = path / "tokenizer_config.json"
    if config.is_file():
        template += str(json.loads(config.read_text()).get("chat_template") or "")
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        template += jinja.read_text(errors="replace")
    if found := template_parser(template):
        return found
    model_type = ""
    if (path / "config.json").is_file():
        model_type = json.loads((path / "config.json").read_text()).get("model_type", "")
    return _match(f"{model_type} {model}", _TOOL_PARSERS)


def startup_cause(log: str) -> str:
    """Why vLLM did not start, from the end of its log: a known cause, else the last line
    that names an error, else nothing."""
    if found := next((cause for needle, cause in _STARTUP_CAUSES if needle in log), None):
        return found
    errors = [line.strip() for line in log.splitlines()
              if "Error" in line or "error:" in line.lower()]
    return errors[-1][-300:] if errors else ""


def _match(text: str, table: list[tuple[str, str]]) -> str | None:
    lowered = text.lower()
    return next((value for needle, value in table if needle in lowered), None)


def _cpu_build() -> bool:
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _die_with_parent() -> None:
    """In the child: ask Linux to SIGTERM it when its parent dies, even by SIGKILL, so a
    killed proxy does not leave a vLLM holding gigabytes behind."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
