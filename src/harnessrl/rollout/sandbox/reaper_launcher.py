"""A sandbox command's first process: runs the command and kills it with its owner.

Usage: python -I -S reaper_launcher.py --owner PID --token TOKEN -- COMMAND...
       python -I -S reaper_launcher.py --owner PID --docker-label LABEL=VALUE

The runner starts it (in a new session, so the command's process group is this one's),
and it starts COMMAND, waits for it and exits as it did (code or signal). If the owner
PID dies first, even by SIGKILL, it kills what the command started: every process that
carries the sandbox's marker TOKEN in its environment (those that left the group too), then
the whole process group, itself last. With --docker-label it runs no command: it waits for
the owner and then removes every container with that label (`docker rm -f`).

The owner is watched through a pidfd (Linux 5.3), not PR_SET_PDEATHSIG: that signal comes
when the *thread* that forked the child ends, and an event loop's thread can end long
before the runner does. Without pidfds it polls its parent pid (a dead owner's children
are handed to init or a subreaper).

Standard library only, and no imports from harnessrl: it runs with `python -I -S` (no
site import: it starts before every sandbox command, ~20 ms instead of ~30).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys

MARKER = "HARNESSRL_SANDBOX"
POLL = 0.5  # seconds between parent checks without pidfds


def parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    split = argv.index("--") if "--" in argv else len(argv)
    options, rest = argv[:split], argv[split + 1:]
    if len(options) % 2 or not all(flag in ("--owner", "--token", "--docker-label")
                                   for flag in options[::2]):
        raise SystemExit(f"reaper_launcher: bad options {options}")
    return dict(zip(options[::2], options[1::2], strict=True)), rest


def watch(owner: int) -> int | None:
    """A pidfd that becomes readable when the owner dies, or None (then poll)."""
    try:
        fd = os.pidfd_open(owner)
    except (AttributeError, OSError):
        return None
    # The owner may have died (and its pid been reused) before the pidfd was taken; as its
    # child we still have it as parent only if it is the same, living process.
    if os.getppid() != owner:
        os.close(fd)
        raise ProcessLookupError
    return fd


def wait_for(owner: int, child: int | None) -> int | None:
    """Until the child ends (its wait status) or the owner dies (None). Without a child,
    until the owner dies."""
    owner_fd = watch(owner)
    if owner_fd is not None:
        child_fd = [os.pidfd_open(child)] if child is not None else []
        ready, _, _ = select.select([owner_fd, *child_fd], [], [])
        if owner_fd in ready or child is None:
            return None
        return os.waitpid(child, 0)[1]
    while os.getppid() == owner:
        if child is not None and (done := os.waitpid(child, os.WNOHANG))[0]:
            return done[1]
        select.select([], [], [], POLL)
    return None


def kill_marked(token: str) -> None:
    needle = f"{MARKER}={token}".encode()
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        with contextlib.suppress(OSError), open(f"/proc/{name}/environ", "rb") as handle:
            if needle in handle.read().split(b"\0"):
                os.kill(int(name), signal.SIGKILL)


def remove_containers(label: str) -> None:
    import subprocess  # here: most reapers never need it, and each start costs

    listed = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={label}"],
                            capture_output=True, text=True, timeout=60)
    if names := listed.stdout.split():
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True, timeout=120)


def exit_as(status: int) -> None:
    """Exit as the child did: its code, or killed by its signal."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


def main(argv: list[str]) -> None:
    options, command = parse(argv)
    owner = int(options["--owner"])
    if os.getppid() != owner:  # the owner died before we started: start nothing
        os._exit(137)
    if "--docker-label" in options:
        with contextlib.suppress(ProcessLookupError):
            wait_for(owner, None)
        remove_containers(options["--docker-label"])
        return
    # The group's signals (the sandbox's SIGTERM at a timeout) are for the command; a
    # handler, unlike SIG_IGN, is not inherited by it.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: None)
    try:
        child = os.posix_spawnp(command[0], command, os.environ)
    except OSError as error:
        print(f"{command[0]}: {error.strerror}", file=sys.stderr)
        os._exit(127)
    try:
        status = wait_for(owner, child)
    except ProcessLookupError:  # the owner died as we started
        status = None
    if status is not None:
        exit_as(status)
    kill_marked(options.get("--token", ""))
    os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1:])
