#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'wordfreq.py' <<'HARNESSRL_EOF'
import re
from collections import Counter


def top_words(text: str, k: int) -> list[tuple[str, int]]:
    counts = Counter(w.lower() for w in re.findall(r"[A-Za-z']+", text))
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:k]
HARNESSRL_EOF
