#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'justify.py' <<'HARNESSRL_EOF'
def _spread(words: list[str], width: int) -> str:
    if len(words) == 1:
        return words[0].ljust(width)
    gaps = len(words) - 1
    spaces = width - sum(len(w) for w in words)
    line = ""
    for i, word in enumerate(words[:-1]):
        line += word + " " * (spaces // gaps + (1 if i < spaces % gaps else 0))
    return line + words[-1]


def justify(text: str, width: int) -> list[str]:
    lines: list[list[str]] = []
    for word in text.split():
        if len(word) > width:
            raise ValueError(f"word longer than {width}: {word!r}")
        if lines and len(" ".join([*lines[-1], word])) <= width:
            lines[-1].append(word)
        else:
            lines.append([word])
    out = [_spread(words, width) for words in lines[:-1]]
    return out + [" ".join(lines[-1]).ljust(width)] if lines else out
HARNESSRL_EOF
