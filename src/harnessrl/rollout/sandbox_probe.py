"""A sandbox's self-check, run through its whole launch chain before it is used.

Usage: python -I sandbox_probe.py [PORT ...] -- PATH...

Exits 0 when every PATH exists inside the sandbox and every relayed PORT on 127.0.0.1
answers a request (an HTTP HEAD: the relayed ports are the capture proxy's; a relay whose
host side cannot connect closes without a byte); otherwise prints
what is missing, one line each, and exits 1. That it runs at all shows the interpreter
is there.

Standard library only, and no imports from harnessrl: it runs with `python -I`.
"""

from __future__ import annotations

import os
import socket
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


def main(argv: list[str]) -> int:
    split = argv.index("--")
    ports, paths = argv[:split], argv[split + 1:]
    problems = [f"missing inside the sandbox: {path}" for path in paths
                if not os.path.exists(path)]
    problems += [p for port in ports if (p := port_problem(int(port))) is not None]
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
