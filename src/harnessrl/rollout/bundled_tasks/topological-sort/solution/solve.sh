#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'toposort.py' <<'HARNESSRL_EOF'
import heapq


class CycleError(ValueError):
    pass


def build_order(deps: dict[str, list[str]]) -> list[str]:
    nodes = set(deps) | {d for ds in deps.values() for d in ds}
    waiting = {n: set(deps.get(n, ())) for n in nodes}
    users: dict[str, list[str]] = {n: [] for n in nodes}
    for node, needs in waiting.items():
        for need in needs:
            users[need].append(node)
    ready = [n for n, needs in waiting.items() if not needs]
    heapq.heapify(ready)
    order = []
    while ready:
        node = heapq.heappop(ready)
        order.append(node)
        for user in users[node]:
            waiting[user].discard(node)
            if not waiting[user]:
                heapq.heappush(ready, user)
    if len(order) != len(nodes):
        stuck = sorted(n for n in nodes if n not in order)
        raise CycleError(f"dependency cycle among: {', '.join(stuck)}")
    return order
HARNESSRL_EOF
