"""Start a command inside a fresh network namespace (run under `unshare --net`).

Usage: python -I netns_launcher.py [--relay PORT=UNIX_SOCKET ...] -- COMMAND...

A new namespace has only `lo`, and it is down. This brings `lo` up, listens on
127.0.0.1:PORT for every relay and hands each connection to a Unix socket the host side
serves (a path on the shared filesystem is the one channel that crosses the namespace
boundary), then execs the command. Listening happens before the exec, so the command never
races the relay. The relay is a forked child in the command's process group: the sandbox
kills the group when the command ends or times out.

Standard library only, and no imports from harnessrl: it runs with `python -I`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
import sys
import threading

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def bring_up_loopback() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        if flags & IFF_UP:  # a container's (--network none): already up, and no NET_ADMIN
            return
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass  # a reset ends the relay like an orderly close
    finally:
        # half-close so the peer sees end of stream while the other direction drains
        for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                sock.shutdown(how)


def serve(listener: socket.socket, unix_path: str) -> None:
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(unix_path)
        except OSError:
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pipe, args=(a, b), daemon=True).start()


def run_relays(relays: list[tuple[socket.socket, str]]) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # never hold the sandbox's output pipes open
        os.dup2(devnull, fd)
    threads = [threading.Thread(target=serve, args=r, daemon=True) for r in relays]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    os._exit(0)


def parse(argv: list[str]) -> tuple[list[tuple[int, str]], list[str]]:
    split = argv.index("--")
    relays, options = [], argv[:split]
    while options:
        flag, value, *options = options
        if flag != "--relay":
            raise SystemExit(f"netns_launcher: unknown option {flag}")
        port, _, path = value.partition("=")
        relays.append((int(port), path))
    return relays, argv[split + 1:]


def main(argv: list[str]) -> None:
    relays, command = parse(argv)
    bring_up_loopback()
    listeners = []
    for port, path in relays:
        listener = socket.create_server(("127.0.0.1", port), backlog=128)
        listeners.append((listener, path))
    if listeners and os.fork() == 0:
        run_relays(listeners)
    for listener, _ in listeners:
        listener.close()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
