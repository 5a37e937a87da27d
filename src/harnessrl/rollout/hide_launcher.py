"""Start a command with parts of the host filesystem hidden (run under `unshare --mount`).

Usage: python -I hide_launcher.py --keep DIR --hide PATH [--hide PATH ...] -- COMMAND...

In the new mount namespace each hidden PATH gets an empty, read-only tmpfs on top, so the
command sees an empty directory where the tasks' tests and solutions, or other rollouts'
sandboxes, are. `--keep` is the sandbox's own directory: when it lies under a hidden path
it is bind-mounted back in place first, so the command still sees its own files. Nothing
changes outside the namespace.

Standard library only, and no imports from harnessrl: it runs with `python -I`.
"""

from __future__ import annotations

import os
import subprocess
import sys


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def main(argv: list[str]) -> None:
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    keep = options[options.index("--keep") + 1]
    hidden = [options[i + 1] for i, flag in enumerate(options) if flag == "--hide"]
    mount("--make-rprivate", "/")  # nothing below leaks back to the host
    # Hold the kept directory open: once covered, /proc/<pid>/fd/<n> still reaches it.
    parked = f"/proc/{os.getpid()}/fd/{os.open(keep, os.O_RDONLY | os.O_DIRECTORY)}"
    for path in hidden:
        if os.path.isdir(path):
            mount("-t", "tmpfs", "-o", "mode=755,size=64k", "hrl-hidden", path)
    for path in hidden:
        if keep.startswith(path.rstrip("/") + "/"):
            os.makedirs(keep, exist_ok=True)
            mount("--no-canonicalize", "--bind", parked, keep)  # the fd, not its path
    for path in hidden:
        if os.path.isdir(path) and not keep.startswith(path.rstrip("/") + "/"):
            mount("-o", "remount,ro", path)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
