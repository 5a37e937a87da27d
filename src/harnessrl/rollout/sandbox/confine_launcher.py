"""Start a command confined to its sandbox directory (run under `unshare --mount`).

Usage: python -I confine_launcher.py --keep DIR --tmp DIR [--reveal PATH ...]
                                     [--show PATH ...] [--hide PATH ...] -- COMMAND...

In the new mount namespace:
- /tmp, /var/tmp and /dev/shm show the sandbox's own `--tmp` directory, so what a program
  writes to a hard-coded /tmp lands in the sandbox;
- each `--show` directory that lay under one of them (the interpreter, its site-packages,
  the launchers, the harness prefix, the PATH handed to the command) is bind-mounted back,
  read-only: the sandbox's own tools stay reachable wherever the user keeps them;
- each hidden PATH gets an empty, read-only tmpfs on top (the tasks' tests and solutions,
  other rollouts' sandboxes), also where it lies inside a shown directory;
- every other mount is read-only, except `--keep` (the sandbox directory) and the
  `--reveal` paths (the proxy relay's sockets), which are bind-mounted back in place.
So nothing the command writes escapes the sandbox directory, even as root. Nothing
changes outside the namespace.

Standard library only, and no imports from harnessrl: it runs with `python -I`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
# Kernel interfaces: remounting them is refused or meaningless; /proc is per-process.
_LEAVE = ("/proc",)


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def _options(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, value in enumerate(argv) if value == flag]


def _park(path: str) -> str:
    """Hold `path` open: once it is covered, /proc/<pid>/fd/<n> still reaches it."""
    return f"/proc/{os.getpid()}/fd/{os.open(path, os.O_RDONLY | os.O_DIRECTORY)}"


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as mountinfo:
        points = [line.split()[4] for line in mountinfo]
    # mountinfo escapes space, tab, newline and backslash as octal
    return [p.encode().decode("unicode_escape") for p in points]


def _read_only(point: str) -> None:
    """Remount `point` read-only. A bind remount changes this mount in this namespace only,
    not the filesystem. A mount that went away since the table was read (a container's
    overlay, seen while Docker stopped one) has nothing left to protect; any other failure
    stops the sandbox."""
    try:
        mount("-o", "remount,bind,ro", point)
    except subprocess.CalledProcessError:
        if point in _mount_points():
            raise


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _covered(paths: list[str]) -> list[str]:
    """The directories among `paths` that the tmp mounts would cover (below, not at, a tmp
    directory), outermost first, nested ones dropped: binding a parent shows them too."""
    # normpath: "/tmp/" or "/tmp/." on a PATH is /tmp itself, which must stay the sandbox's
    normal = {os.path.normpath(p) for p in paths}
    below = sorted(p for p in normal if os.path.isdir(p) and _under(p, list(TMP_DIRS))
                   and p not in TMP_DIRS)
    return [p for i, p in enumerate(below) if not _under(p, below[:i])]


def main(argv: list[str]) -> None:
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    (keep,), (tmp,) = _options(options, "--keep"), _options(options, "--tmp")
    hidden, reveal = _options(options, "--hide"), _options(options, "--reveal")
    shown = _covered(_options(options, "--show"))
    mount("--make-rprivate", "/")  # nothing below leaks back to the host
    parked = {path: _park(path) for path in (keep, tmp, *reveal, *shown)}
    for path in TMP_DIRS:
        if os.path.isdir(path):
            mount("--no-canonicalize", "--bind", parked[tmp], path)
    for path in shown:  # the mount point is made in the sandbox's own tmp/
        os.makedirs(path, exist_ok=True)
        mount("--no-canonicalize", "--bind", parked[path], path)
        mount("-o", "remount,bind,ro", path)
    # After the tmp and shown mounts, so a hidden path inside a shown one stays hidden.
    for path in hidden:
        if os.path.isdir(path):
            mount("-t", "tmpfs", "-o", "mode=755,size=64k", "hrl-hidden", path)
    writable = [keep, *reveal, *TMP_DIRS]
    for path in (keep, *reveal):  # the fd, not its path: the path may be covered now
        os.makedirs(path, exist_ok=True)
        mount("--no-canonicalize", "--bind", parked[path], path)
    for point in _mount_points():
        if _under(point, writable) or _under(point, [*_LEAVE, *hidden]):
            continue
        _read_only(point)
    for path in hidden:
        if os.path.isdir(path) and not keep.startswith(path.rstrip("/") + "/"):
            mount("-o", "remount,ro", path)
    # The working directory was entered before these mounts and still points into the old,
    # now read-only mount: entered again by its path, it is the writable bind (a program
    # that spawns its shell without a cwd, e.g. the Continue CLI, inherits this one).
    with contextlib.suppress(OSError):
        os.chdir(os.getcwd())
    try:
        os.execvp(command[0], command)
    except OSError as error:  # 127 as a shell says it: the program is not there to run
        sys.stderr.write(f"confined sandbox: cannot run {command[0]!r} in it: {error}\n")
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1:])
