"""A generated task family in kind of the reference's data-analysis tasks.

Each task is a small CSV table (two for a join) and one question with one deterministic
answer, which the agent writes to `answer.txt` in its workdir. Tasks are written in the
Harbor layout (`write_sets`), so they run through the ordinary runner, local or Docker, and
`harnessrl tasks check` checks them: the reference solution computes the answer from the
CSV files with Python's csv module (independently of the generator), and the verifier
compares `answer.txt` with the generator's answer.

Tiers, from easy to hard (each task's `difficulty`):

    lookup    one cell: the value of a column in the row of a named key
    count     the number of data rows
    filter    the number of rows whose category is a given value
    sum       the sum of a numeric column over the rows of one category
    groupmax  the category with the largest total of a numeric column (no ties)
    join      the total of a numeric column over the categories that a second table maps
              to a given value

Generation is pure and seeded: the same seed gives the same tasks, byte for byte. The
train and held-out sets come from separate random streams and share no table and no
question instance (a held-out table or question drawn again for train is drawn anew).
"""

from __future__ import annotations

import hashlib
import json
import random
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

TIERS = ("lookup", "count", "filter", "sum", "groupmax", "join")
ANSWER_FILE = "answer.txt"


@dataclass(frozen=True)
class Theme:
    """A kind of table: its file, a unique key column, a category column and two numeric
    columns, with the words its values are drawn from."""
    file: str
    key: str
    keys: tuple[str, ...]
    category: str
    categories: tuple[str, ...]
    numbers: tuple[tuple[str, int, int], ...]  # (column, low, high)
    # join: a second table giving each category one of `links` and a number of its own
    # (which makes every link table, too, one of a kind)
    link_file: str
    link: str
    links: tuple[str, ...]
    link_number: tuple[str, int, int]


THEMES = (
    Theme("sales.csv", "order", tuple(f"A{n:03d}" for n in range(1, 400)), "region",
          ("north", "south", "east", "west", "central"),
          (("units", 1, 40), ("revenue", 10, 900)),
          "regions.csv", "manager", ("kim", "lee", "ada"), ("target", 100, 9999)),
    Theme("staff.csv", "name", ("ana", "ben", "cal", "dee", "eli", "fay", "gus", "hal",
                                "ivy", "jon", "kai", "liv", "max", "ned", "oli", "pam",
                                "quin", "rex", "sam", "tia", "uma", "vic", "wes", "zoe"),
          "team", ("infra", "data", "web", "mobile", "sales"),
          (("age", 21, 64), ("salary", 30, 180)),
          "teams.csv", "floor", ("one", "two", "three"), ("budget", 100, 9999)),
    Theme("stock.csv", "item", tuple(f"SKU{n:03d}" for n in range(1, 400)), "warehouse",
          ("oslo", "lima", "pune", "kiev", "doha", "perth"),
          (("qty", 0, 250), ("weight", 1, 60)),
          "warehouses.csv", "owner", ("acme", "zeta", "nova"), ("docks", 1, 99)),
    Theme("trips.csv", "trip", tuple(f"T{n:03d}" for n in range(1, 400)), "city",
          ("paris", "rome", "tokyo", "cairo", "quito"),
          (("days", 1, 21), ("cost", 50, 3000)),
          "cities.csv", "agency", ("sunway", "globo", "terra", "vista"),
          ("hotels", 10, 999)),
)


@dataclass(frozen=True)
class GeneratedTask:
    id: str
    tier: str
    instruction: str
    files: dict[str, str]  # CSV files placed in the workdir: name -> text
    answer: str
    solution: str  # a Python program that computes the answer from the files


@dataclass(frozen=True)
class TaskSets:
    seed: int
    tiers: tuple[str, ...]
    train: tuple[GeneratedTask, ...]
    held_out: tuple[GeneratedTask, ...]


@dataclass(frozen=True)
class _Table:
    theme: Theme
    rows: tuple[tuple[str, str, tuple[int, int]], ...]  # key, category, numbers

    def csv(self) -> str:
        t = self.theme
        lines = [f"{t.key},{t.category},{t.numbers[0][0]},{t.numbers[1][0]}"]
        lines += [f"{k},{c},{a},{b}" for k, c, (a, b) in self.rows]
        return "\n".join(lines) + "\n"


def _table(rng: random.Random, theme: Theme, size: int) -> _Table:
    keys = rng.sample(theme.keys, size)
    (_, lo0, hi0), (_, lo1, hi1) = theme.numbers
    rows = tuple((k, rng.choice(theme.categories), (rng.randint(lo0, hi0), rng.randint(lo1, hi1)))
                 for k in keys)
    return _Table(theme, rows)


# -- the questions: (instruction, answer, solution program) from a table ------------------

_READ = "import csv\nrows = list(csv.DictReader(open({file!r}, newline='')))\n"
_TAIL = f"open({ANSWER_FILE!r}, 'w').write(str(answer) + '\\n')\n"
Question = tuple[str, str, str, dict[str, str]]  # instruction, answer, solution, extra files


def _lookup(rng: random.Random, table: _Table) -> Question | None:
    key, _, (a, b) = rng.choice(table.rows)
    col, value = rng.choice(((table.theme.numbers[0][0], a), (table.theme.numbers[1][0], b)))
    t = table.theme
    text = f"In `{t.file}`, what is the {col} of the row whose {t.key} is {key}?"
    code = f"answer = next(r[{col!r}] for r in rows if r[{t.key!r}] == {key!r})\n"
    return text, str(value), code, {}


def _count(rng: random.Random, table: _Table) -> Question | None:
    text = f"How many data rows (not counting the header) does `{table.theme.file}` have?"
    return text, str(len(table.rows)), "answer = len(rows)\n", {}


def _filter(rng: random.Random, table: _Table) -> Question | None:
    t = table.theme
    value = rng.choice(sorted({c for _, c, _ in table.rows}))
    answer = sum(1 for _, c, _ in table.rows if c == value)
    text = f"How many rows of `{t.file}` have {t.category} equal to {value}?"
    code = f"answer = sum(1 for r in rows if r[{t.category!r}] == {value!r})\n"
    return text, str(answer), code, {}


def _sum(rng: random.Random, table: _Table) -> Question | None:
    t = table.theme
    value = rng.choice(sorted({c for _, c, _ in table.rows}))
    i = rng.randrange(2)
    col = t.numbers[i][0]
    answer = sum(row[2][i] for row in table.rows if row[1] == value)
    text = f"In `{t.file}`, what is the total {col} of the rows whose {t.category} is {value}?"
    code = (f"answer = sum(int(r[{col!r}]) for r in rows "
            f"if r[{t.category!r}] == {value!r})\n")
    return text, str(answer), code, {}


def _groupmax(rng: random.Random, table: _Table) -> Question | None:
    t = table.theme
    i = rng.randrange(2)
    col = t.numbers[i][0]
    totals: dict[str, int] = {}
    for row in table.rows:
        totals[row[1]] = totals.get(row[1], 0) + row[2][i]
    ranked = sorted(totals.values(), reverse=True)
    if len(ranked) > 1 and ranked[0] == ranked[1]:
        return None  # a tie has no one answer: drawn again
    best = max(totals, key=lambda c: totals[c])
    text = (f"In `{t.file}`, which {t.category} has the largest total {col}? "
            f"Answer with the {t.category} alone.")
    code = (f"totals = {{}}\nfor r in rows:\n"
            f"    totals[r[{t.category!r}]] = totals.get(r[{t.category!r}], 0) + int(r[{col!r}])\n"
            "answer = max(totals, key=totals.get)\n")
    return text, best, code, {}


def _join(rng: random.Random, table: _Table) -> Question | None:
    t = table.theme
    mapping = {c: rng.choice(t.links) for c in t.categories}
    target = rng.choice(sorted(set(mapping.values())))
    i = rng.randrange(2)
    col = t.numbers[i][0]
    answer = sum(row[2][i] for row in table.rows if mapping[row[1]] == target)
    number, low, high = t.link_number
    link_csv = f"{t.category},{t.link},{number}\n" + "".join(
        f"{c},{m},{rng.randint(low, high)}\n" for c, m in mapping.items())
    text = (f"`{t.file}` and `{t.link_file}` share the column {t.category}. What is the "
            f"total {col} of the rows of `{t.file}` whose {t.category} has {t.link} "
            f"{target} in `{t.link_file}`?")
    code = (f"link = {{r[{t.category!r}]: r[{t.link!r}] for r in "
            f"csv.DictReader(open({t.link_file!r}, newline=''))}}\n"
            f"answer = sum(int(r[{col!r}]) for r in rows "
            f"if link[r[{t.category!r}]] == {target!r})\n")
    return text, str(answer), code, {t.link_file: link_csv}


_QUESTIONS: dict[str, Callable[[random.Random, _Table], Question | None]] = {
    "lookup": _lookup, "count": _count, "filter": _filter, "sum": _sum,
    "groupmax": _groupmax, "join": _join,
}
# Rows per table, by tier: small enough that a whole table fits a small model's context.
_SIZES = {"lookup": (5, 9), "count": (4, 12), "filter": (6, 12), "sum": (6, 12),
          "groupmax": (8, 14), "join": (8, 14)}

_INSTRUCTION = """{question}

The file{s} {names} {are} in the current directory. Write the answer alone (a bare
{kind}, no other text) to `{answer_file}` in the current directory.
"""


def _task(rng: random.Random, tier: str) -> GeneratedTask | None:
    table = _table(rng, rng.choice(THEMES), rng.randint(*_SIZES[tier]))
    drawn = _QUESTIONS[tier](rng, table)
    if drawn is None:
        return None
    question, answer, code, extra = drawn
    files = {table.theme.file: table.csv(), **extra}
    names = ", ".join(f"`{name}`" for name in files)
    instruction = _INSTRUCTION.format(
        question=question, s="s" if len(files) > 1 else "", names=names,
        are="are" if len(files) > 1 else "is", answer_file=ANSWER_FILE,
        kind="number" if answer.lstrip("-").isdigit() else "word")
    solution = _READ.format(file=table.theme.file) + code + _TAIL
    digest = hashlib.sha256(json.dumps([tier, files, question]).encode()).hexdigest()
    return GeneratedTask(f"{tier}-{digest[:10]}", tier, instruction, files, answer, solution)


def _instances(task: GeneratedTask) -> set[str]:
    """What no two tasks may share: a table (so neither a question asked of a table)."""
    return {hashlib.sha256(text.encode()).hexdigest() for text in task.files.values()}


def _draw(rng: random.Random, tiers: Sequence[str], count: int, taken: set[str]
          ) -> list[GeneratedTask]:
    """`count` tasks, the tiers in turn, none sharing an instance with `taken` (updated)."""
    tasks: list[GeneratedTask] = []
    for _ in range(count * 100):  # bounded: a space too small to draw from says so
        if len(tasks) == count:
            return tasks
        task = _task(rng, tiers[len(tasks) % len(tiers)])
        if task is None or _instances(task) & taken:
            continue
        taken |= _instances(task)
        tasks.append(task)
    if len(tasks) < count:
        raise ValueError(f"only {len(tasks)} distinct tasks of tiers {list(tiers)} could be "
                         f"drawn, not {count}")
    return tasks


def generate_sets(seed: int = 0, train: int = 1000, held_out: int = 250,
                  tiers: Sequence[str] = TIERS) -> TaskSets:
    """A train set and a held-out set, the given tiers in equal shares, deterministic per
    seed. The held-out set is drawn first, so its tasks do not depend on the train size."""
    unknown = [t for t in tiers if t not in _QUESTIONS]
    if unknown or not tiers:
        raise ValueError(f"unknown tiers {unknown}; the tiers are {', '.join(TIERS)}")
    taken: set[str] = set()
    held = _draw(random.Random(f"{seed}:held_out"), tiers, held_out, taken)
    trained = _draw(random.Random(f"{seed}:train"), tiers, train, taken)
    return TaskSets(seed, tuple(tiers), tuple(trained), tuple(held))


# -- the Harbor layout ------------------------------------------------------------------------

_TOML = """version = "1.0"

[metadata]
author_name = "harnessrl tablegen"
difficulty = "{tier}"
category = "data-analysis"
tags = ["tablegen", "tier:{tier}"]

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 600.0
"""

# The verifier: the answer file, stripped and compared without case; numbers as numbers
# ("42.0" is 42). Harbor paths: the local sandbox maps /app, /tests and /logs to its own.
_CHECK = """import pathlib, sys
expected = {answer!r}
path = pathlib.Path("/app/{answer_file}")
got = path.read_text(errors="replace").strip().lower() if path.is_file() else None
try:
    ok = got is not None and float(got) == float(expected)
except ValueError:
    ok = got == expected.lower()
print(f"expected {{expected!r}}, answer.txt holds {{got!r}}")
sys.exit(0 if ok else 1)
"""

_TEST_SH = """#!/usr/bin/env bash
# Verifier (Harbor layout): 1 when /app/answer.txt holds the answer, else 0.
mkdir -p /logs/verifier
if python3 /tests/check.py; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""

_SOLVE_SH = """#!/usr/bin/env bash
# Reference solution: computes the answer from the CSV files, in the workdir.
set -euo pipefail
python3 /solution/solve.py
"""


def task_files(task: GeneratedTask) -> dict[str, str]:
    """The task's files in the Harbor layout, by path relative to its directory."""
    files = {"task.toml": _TOML.format(tier=task.tier), "instruction.md": task.instruction,
             "tests/test.sh": _TEST_SH,
             "tests/check.py": _CHECK.format(answer=task.answer, answer_file=ANSWER_FILE),
             "solution/solve.sh": _SOLVE_SH, "solution/solve.py": task.solution}
    files.update({f"environment/{name}": text for name, text in task.files.items()})
    return files


def write_sets(sets: TaskSets, out: Path) -> dict[str, int]:
    """Write OUT/train/<id>/ and OUT/held_out/<id>/ (Harbor task directories) and
    OUT/manifest.json. OUT must not hold a task set already."""
    out = Path(out)
    if (out / "manifest.json").exists():
        raise FileExistsError(f"{out} holds a generated task set already")
    counts = {"train": len(sets.train), "held_out": len(sets.held_out)}
    for name, tasks in (("train", sets.train), ("held_out", sets.held_out)):
        for task in tasks:
            for relative, text in task_files(task).items():
                path = out / name / task.id / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                if path.suffix == ".sh":
                    path.chmod(0o755)
    manifest = {"generator": "harnessrl tablegen", "seed": sets.seed, "tiers": list(sets.tiers),
                "counts": counts, "answer_file": ANSWER_FILE,
                "command": shlex.join(["harnessrl", "tasks", "generate", str(out),
                                       "--seed", str(sets.seed), "--train",
                                       str(counts["train"]), "--held-out",
                                       str(counts["held_out"]), "--tiers",
                                       ",".join(sets.tiers)])}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return counts
