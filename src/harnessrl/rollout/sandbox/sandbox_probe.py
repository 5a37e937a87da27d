"""A sandbox's self-check, run through its whole launch chain before it is used.

Usage: python -I sandbox_probe.py [--node NODE] [--report FILE] [PORT ...] -- PATH...

Exits 0 when every PATH exists inside the sandbox and every relayed PORT on 127.0.0.1
answers a request (an HTTP HEAD: the relayed ports are the capture proxy's; a relay whose
host side cannot connect closes without a byte); otherwise prints
what is missing, one line each, and exits 1. That it runs at all shows the interpreter
is there. `--node`: also that `NODE -e 0` runs.

`--report FILE` (a container's first process, so the check costs no extra `docker exec`):
write what is missing (nothing when all is well) to FILE at once, atomically, then wait
for a signal forever, keeping the container alive.

Standard library only, and no imports from harnessrl: it runs with `python -I`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys


def port_problem(port: int, timeout: float = 10.0) -> str | None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"HEAD / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            reply = sock.recv(5)
    except OSError as error:
        return f"port {port}: the relayed proxy is unreachable ({error})"
    if not reply:
        return f"port {port}: the relay closed without a reply (the proxy is not reachable)"
    return None


def node_problem(node: str) -> str | None:
    try:
        ran = subprocess.run([node, "-e", "0"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{node} cannot run here: {error}"
    if ran.returncode != 0:
        return f"{node} -e 0 exited {ran.returncode}: {ran.stderr.decode(errors='replace')[-500:]}"
    return None


def main(argv: list[str]) -> int:
    options: dict[str, str] = {}
    while argv and argv[0] in ("--node", "--report"):
        options[argv[0]], argv = argv[1], argv[2:]
    split = argv.index("--")
    ports, paths = argv[:split], argv[split + 1:]
    problems = [f"missing inside the sandbox: {path}" for path in paths
                if not os.path.exists(path)]
    if "--node" in options and (problem := node_problem(options["--node"])) is not None:
        problems.append(problem)
    problems += [p for port in ports if (p := port_problem(int(port))) is not None]
    if "--report" in options:
        report = options["--report"]
        with open(report + ".part", "w") as handle:
            handle.write("".join(f"{problem}\n" for problem in problems))
        os.replace(report + ".part", report)
        while True:
            signal.pause()
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
