#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'mygrep.py' <<'HARNESSRL_EOF'
import argparse
import re
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    for flag in ("-i", "-n", "-c", "-v"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("pattern")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    pattern = re.compile(args.pattern, re.IGNORECASE if args.i else 0)
    found, status = False, 0
    for name in args.files:
        prefix = f"{name}:" if len(args.files) > 1 else ""
        try:
            with open(name) as handle:
                lines = handle.read().splitlines()
        except OSError as error:
            print(f"mygrep: {error}", file=sys.stderr)
            status = 2
            continue
        hits = [(i, line) for i, line in enumerate(lines, 1)
                if bool(pattern.search(line)) != args.v]
        found = found or bool(hits)
        if args.c:
            print(f"{prefix}{len(hits)}")
        for i, line in [] if args.c else hits:
            print(f"{prefix}{f'{i}:' if args.n else ''}{line}")
    return status or (0 if found else 1)


if __name__ == "__main__":
    sys.exit(main())
HARNESSRL_EOF
