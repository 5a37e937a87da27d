"""Who owns a sandbox, and what a dead owner left behind.

Every sandbox (local or Docker) is written to a registry when it is made and removed from
it when it closes: one small JSON file per sandbox under the cache directory
(`$HARNESSRL_SANDBOX_REGISTRY`, default `~/.cache/harnessrl/sandboxes`), naming its owner
process (pid and start time, so a reused pid is not mistaken for the owner), its marker
token, its directories and, for Docker, its container. A runner killed with SIGKILL cannot
close its sandboxes; each of its commands has a watcher that kills the command's processes
when the owner dies (reaper_launcher.py), and what is left all the same (a watcher killed
too, a container, the directories) is removed by `sweep()`, which every runner start calls
and `harnessrl sandboxes --remove` runs on demand.

Only entries written in this PID namespace since this boot are judged: a pid from another
namespace means nothing here, so such an entry is listed, never removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

REGISTRY_ENV = "HARNESSRL_SANDBOX_REGISTRY"
MARKER = "HARNESSRL_SANDBOX"  # set in every command's environment; finds escaped processes
LABEL = "harnessrl.owner"  # a container's label: "<pid>:<start time>" of its owner


def registry_dir() -> Path:
    if given := os.environ.get(REGISTRY_ENV):
        return Path(given)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "harnessrl" / "sandboxes"


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner() -> str:
    """This process as an owner: "<pid>:<start time>"."""
    return f"{os.getpid()}:{start_time(os.getpid())}"


def alive(label: str) -> bool:
    """Whether the owner "<pid>:<start time>" is still running (the same process)."""
    pid, _, started = label.partition(":")
    return pid.isdigit() and start_time(int(pid)) == started


def _namespace() -> str:
    """This boot and PID namespace: an owner's pid means something only within them."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return "unknown"


@dataclass(frozen=True)
class Entry:
    token: str  # the sandbox's marker value
    owner: str  # "<pid>:<start time>" of the process that made it
    directory: str  # the sandbox directory (work/, home/, tmp/)
    private: str  # host-side files: command output, relay sockets
    container: str = ""  # Docker: the container's name
    namespace: str = ""
    created: float = 0.0

    @property
    def pid(self) -> int:
        return int(self.owner.partition(":")[0] or 0)

    def here(self) -> bool:
        """Written in this boot and PID namespace (its owner can be judged)."""
        return self.namespace == _namespace()

    def left_over(self) -> bool:
        """Its owner is gone (judged only for entries made here)."""
        return self.here() and not alive(self.owner)


def register(token: str, directory: Path, private: Path, container: str = "") -> None:
    """Record a sandbox of this process (again, to add its container)."""
    entry = Entry(token=token, owner=owner(), directory=str(directory), private=str(private),
                  container=container, namespace=_namespace(), created=time.time())
    folder = registry_dir()
    folder.mkdir(parents=True, exist_ok=True)
    staged = folder / f".{token}.tmp"
    staged.write_text(json.dumps(asdict(entry)))
    staged.replace(folder / f"{token}.json")  # atomic: a reader never sees half an entry


def unregister(token: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (registry_dir() / f"{token}.json").unlink()


def entries() -> list[Entry]:
    """Every registered sandbox, oldest first (unreadable files are skipped)."""
    found = []
    folder = registry_dir()
    for path in folder.glob("*.json") if folder.is_dir() else ():
        try:
            found.append(Entry(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(found, key=lambda e: e.created)


def marked(token: str) -> list[int]:
    """The pids whose environment carries this sandbox's marker (those that left the
    process group with setsid; a container's, seen from the host)."""
    needle = f"{MARKER}={token}".encode()
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    pids.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def kill_marked(token: str, sig: signal.Signals = signal.SIGKILL) -> int:
    """Signal every process carrying this sandbox's marker; how many were signalled."""
    killed = 0
    for pid in marked(token):
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
            killed += 1
    return killed


def remove_containers(names: list[str]) -> None:
    if names and shutil.which("docker"):
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True, timeout=120)


def dead_containers() -> list[tuple[str, str]]:
    """(name, owner) of every container labelled with an owner that is gone, whether
    registered or not; none when Docker is not here or does not answer."""
    if shutil.which("docker") is None:
        return []
    try:
        listed = subprocess.run(["docker", "ps", "-a", "--filter", f"label={LABEL}", "--format",
                                 f'{{{{.Names}}}} {{{{.Label "{LABEL}"}}}}'],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    pairs = [tuple(line.split(" ", 1)) for line in listed.stdout.splitlines() if " " in line]
    return [(name, label) for name, label in pairs if not alive(label)]


def remove_tree(path: Path) -> None:
    def retry(func: Callable, failed: str, _exc: object) -> None:
        # an agent may leave read-only directories behind
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            func(failed)

    shutil.rmtree(path, onerror=retry)


def clean(entry: Entry) -> None:
    """Remove what a dead owner's sandbox left: its processes, its container, its
    directories, then its entry."""
    kill_marked(entry.token)
    remove_containers([entry.container] if entry.container else [])
    for directory in (entry.private, entry.directory):
        if directory and Path(directory).exists():
            remove_tree(Path(directory))
    unregister(entry.token)


def sweep() -> list[Entry]:
    """Clean every sandbox whose owner is gone; those cleaned."""
    dead = [entry for entry in entries() if entry.left_over()]
    for entry in dead:
        clean(entry)
    return dead
