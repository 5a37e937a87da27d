"""bench/seed_table.py's state: one JSON file per finished unit of work, skipped when run
again; failures recorded apart; the heavy-run lock held per unit."""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import shutil
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

PROGRESS = ".metrics.jsonl"  # STATE/progress/<unit>.metrics.jsonl: a running unit's lines
VISITS = ".visits.json"  # STATE/progress/<unit>.visits.json: its tasks' visits (seed_visits)
# The state's small files beside its units, copied to and from the record.
SMALL = ("budget-calibrate.json", "budget-sft.json", "budget-run.json", "commands.txt",
         "events.jsonl", "notes.md")
# Seconds spent waiting for the lock, so a unit's own time can be told from its wait.
WAITED: list[float] = []


class State:
    """STATE/units/<unit>.json per finished unit; STATE/failed/<unit>.json per failed try.
    `mirror` (`--record`): a folder in the repository the records are copied to whenever
    one is written, so a machine lost mid-run loses no figure measured before it."""

    def __init__(self, root: Path, mirror: Path | None = None) -> None:
        self.root = root
        self.mirror = mirror if mirror and mirror.resolve() != root.resolve() else None
        new = not any((root / "units").glob("*.json"))
        for sub in ("units", "failed", "progress", "logs", "work", "models", "tasks"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        if new and self.mirror and any((self.mirror / "units").glob("*.json")):
            self.restore(self.mirror)

    def restore(self, record: Path) -> None:
        """A new state whose record holds units (a replaced machine, a fresh clone) starts
        from that record: every figure measured stays measured, and the first copy back to
        the record does not wipe it. Failures are not restored (they are tried again); the
        models and runs the units name are not in a record, so a unit whose model is gone
        is built again where something still needs it (`rebuild`)."""
        print(f"[seed_table] a new state: its records restored from {record}", flush=True)
        for kind, pattern in (("units", "*.json"), ("rebuilt", "*.json"), ("rows", "*.gz"),
                              ("progress", "*" + PROGRESS), ("progress", "*" + VISITS)):
            (self.root / kind).mkdir(parents=True, exist_ok=True)
            for path in (record / kind).glob(pattern):
                shutil.copy2(path, self.root / kind / path.name)
        for name in SMALL:
            if (record / name).is_file():
                shutil.copy2(record / name, self.root / name)
        if (record / "replaced").is_dir():
            shutil.copytree(record / "replaced", self.root / "replaced", dirs_exist_ok=True)

    def rebuild(self, units: Sequence[str]) -> None:
        """Forget these units so they are computed again (their model or run is gone from
        this machine); each first build's record is kept as STATE/rebuilt/<unit>.json, to
        compare the new build with."""
        (self.root / "rebuilt").mkdir(exist_ok=True)
        for name in units:
            path = self._file("units", name)
            if not path.is_file():
                continue
            first = self.root / "rebuilt" / path.name
            if first.is_file():  # built a third time: the first build stays the reference
                path.unlink()
            else:
                path.rename(first)

    def first_build(self, unit: str) -> dict[str, Any] | None:
        path = self._file("rebuilt", unit)
        return json.loads(path.read_text()) if path.is_file() else None

    def _file(self, kind: str, unit: str) -> Path:
        return self.root / kind / (unit.replace("/", "__") + ".json")

    def done(self, unit: str) -> dict[str, Any] | None:
        path = self._file("units", unit)
        return json.loads(path.read_text()) if path.is_file() else None

    def save(self, unit: str, result: dict[str, Any]) -> None:
        path = self._file("units", unit)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.rename(path)  # whole or absent: a kill never leaves half a result
        self._file("failed", unit).unlink(missing_ok=True)
        self.mirrored()

    def fail(self, unit: str, error: str) -> None:
        self._file("failed", unit).write_text(json.dumps({"unit": unit, "error": error}))
        self.mirrored()

    def mirrored(self) -> None:
        """The records copied to `mirror`; a copy that fails (a full disk, say) is said and
        the work goes on: the state keeps every record, and the next copy takes them all."""
        if self.mirror is None:
            return
        try:
            self.record(self.mirror)
        except OSError as error:
            print(f"[seed_table] records not copied to {self.mirror}: {error}", flush=True)

    def all(self, kind: str = "units") -> dict[str, dict[str, Any]]:
        found = {}
        for path in sorted((self.root / kind).glob("*.json")):
            found[path.stem.replace("__", "/")] = json.loads(path.read_text())
        return found

    def log(self, unit: str) -> Path:
        return self.root / "logs" / (unit.replace("/", "__") + ".log")

    def work(self, unit: str) -> Path:
        return self.root / "work" / unit.replace("/", "__")

    def progress(self, unit: str, metrics: Path) -> None:
        """A running unit's metrics.jsonl so far (a training run's step and eval lines) kept
        as STATE/progress/<unit>.metrics.jsonl and mirrored: a run takes hours, and a
        machine lost mid-run must not lose the steps it measured."""
        if not metrics.is_file():
            return
        shutil.copyfile(metrics, self.root / "progress" / (unit.replace("/", "__") + PROGRESS))
        self.mirrored()

    def replace_runs(self, prefixes: tuple[str, ...], why: str,
                     finished: Sequence[str] = ()) -> Path:
        """Set aside the runs of a replaced recipe, as measured history, in
        STATE/replaced/<time>/ beside a note of `why` and the old budget-run.json:
        - the `finished` units (a finished arm's training and its evals) move to units/
          there; their work dirs stay as work/<time>__<unit>, out of the records;
        - every unfinished run whose unit starts with one of `prefixes` moves its progress
          lines and visits to progress/ there, and its work dir (checkpoints that must not
          be resumed) is deleted. A finished unit not in `finished` stays (a probe's holds
          its own recipe)."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        dest = self.root / "replaced" / stamp
        for sub in ("progress", "units"):
            (dest / sub).mkdir(parents=True, exist_ok=True)
        for name in finished:
            key = name.replace("/", "__")
            self._file("units", name).rename(dest / "units" / (key + ".json"))
            if (work := self.work(name)).exists():
                work.rename(work.with_name(f"{stamp}__{key}"))
        kept = {n.replace("/", "__") for n in self.all()}  # finished and not replaced
        for key in (p.replace("/", "__") for p in prefixes):
            for path in (self.root / "progress").glob(key + "*"):
                if path.name.removesuffix(PROGRESS).removesuffix(VISITS) not in kept:
                    path.rename(dest / "progress" / path.name)
            for path in (self.root / "work").glob(key + "*"):
                if path.name not in kept:
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
        if (self.root / "budget-run.json").is_file():
            shutil.copy2(self.root / "budget-run.json", dest / "budget-run.json")
        (dest / "why.txt").write_text(why + "\n")
        return dest

    def record(self, dest: Path) -> None:
        """Copy the state's small records (units, failures, progress, budgets, commands,
        events, notes, the SFT starts' rows, the runs set aside, first builds; no models,
        runs or logs) to `dest`, a folder to commit: a lost machine then loses no figure,
        and `report --state DEST` writes the same tables again."""
        kinds = (("units", "*.json"), ("failed", "*.json"), ("rows", "*.gz"),
                 ("progress", "*" + PROGRESS), ("progress", "*" + VISITS))
        for kind, pattern in kinds:
            (dest / kind).mkdir(parents=True, exist_ok=True)
            kept = {path.name for path in (self.root / kind).glob(pattern)}
            for path in (dest / kind).glob(pattern):
                if path.name not in kept:  # a failure since retried, say: mirror, not pile up
                    path.unlink()
            for name in kept:
                shutil.copy2(self.root / kind / name, dest / kind / name)
        for name in SMALL:
            if (self.root / name).is_file():
                shutil.copy2(self.root / name, dest / name)
        for history in ("replaced", "rebuilt"):  # copied, never mirrored away
            if (self.root / history).is_dir():
                shutil.copytree(self.root / history, dest / history, dirs_exist_ok=True)


@contextlib.contextmanager
def heavy(lock: str, what: str) -> Iterator[None]:
    """The machine's heavy-run lock (the same flock(2) lock `flock` takes), held for one
    unit or one served model's evals, so other heavy work interleaves between them."""
    if not lock:
        yield
        return
    with open(lock, "a") as handle:
        started = time.monotonic()
        print(f"[seed_table] waiting for {lock} ({what})", flush=True)
        fcntl.flock(handle, fcntl.LOCK_EX)
        WAITED.append(time.monotonic() - started)
        print(f"[seed_table] lock taken after {WAITED[-1]:.0f} s: {what}", flush=True)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def unit(state: State, name: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """`work`'s result, computed once: stored with its wall time, skipped when stored. A
    failure is recorded (STATE/failed) and the run goes on with the next unit."""
    if (found := state.done(name)) is not None:
        return found
    print(f"[seed_table] {name} ...", flush=True)
    started, began = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    waits = len(WAITED)
    try:
        result = work()
    except Exception as error:  # one arm's failure must not lose the others' units
        state.fail(name, f"{error!r}\n{traceback.format_exc()}")
        print(f"[seed_table] {name} FAILED: {error!r} (see {state.root / 'failed'})",
              flush=True)
        return None
    result |= {"seconds": round(time.monotonic() - started, 1), "started": began,
               "lock_wait": round(sum(WAITED[waits:]), 1),
               "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    state.save(name, result)
    print(f"[seed_table] {name} done in {result['seconds']:.0f} s", flush=True)
    return result




def event(state: State, kind: str, **fields: Any) -> None:
    """A line of STATE/events.jsonl (a served model's start, a lock wait): the wall time of
    work outside any unit."""
    line = {"kind": kind, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **fields}
    with (state.root / "events.jsonl").open("a") as events:
        events.write(json.dumps(line) + "\n")


def run_child(command: list[str], log: Any, every: Callable[[], None] | None = None,
              every_s: float = 60.0) -> int:
    """A `harnessrl` command, its output to `log`; the exit code. `every` is called each
    `every_s` while it runs (a long training run's progress recorded as it goes). If this
    process is stopped meanwhile (SIGTERM, Ctrl-C) the child gets SIGTERM and a minute to
    stop its own children (harness CLIs, vLLM), then SIGKILL."""
    import subprocess

    child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        while True:
            try:
                return child.wait(timeout=every_s if every else None)
            except subprocess.TimeoutExpired:
                try:
                    if every:
                        every()
                except OSError as error:  # a failed copy must not stop hours of training
                    print(f"[seed_table] progress not kept this time: {error}", flush=True)
    except BaseException:
        child.terminate()
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
        raise


CHUNKED = re.compile(r"^(?P<cell>.+)/c(?P<n>\d+)of(?P<total>\d+)$")


def merged(units: dict[str, dict[str, Any]]
           ) -> tuple[dict[str, dict[str, Any]], dict[str, tuple[int, int]]]:
    """The units with each cell measured in chunks (`<cell>/c<n>of<N>`) as that one cell,
    once all N are in, and the cells still missing chunks (chunks in, N), which are left
    out: a figure of part of the tasks would not compare with the others'."""
    whole: dict[str, dict[str, Any]] = {}
    chunks: dict[str, list[dict[str, Any]]] = {}
    totals: dict[str, int] = {}
    for key, value in units.items():
        if (m := CHUNKED.match(key)) is None:
            whole[key] = value
            continue
        chunks.setdefault(m["cell"], []).append(value)
        totals[m["cell"]] = int(m["total"])
    partial = {}
    for cell, parts in chunks.items():
        if len(parts) == totals[cell]:
            whole[cell] = _merge(parts)
        else:
            partial[cell] = (len(parts), totals[cell])
    return whole, partial


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One eval cell from its chunks: the rollouts' outcomes together, counts summed."""
    errors: dict[str, int] = {}
    for part in parts:
        for kind, n in part.get("turn_errors", {}).items():
            errors[kind] = errors.get(kind, 0) + n
    prompts = [p[k] for p in parts for k in ("prompt_tokens_max", "prompt_tokens_first")
               if p.get(k) is not None]
    return {"returncode": max(p.get("returncode", 0) for p in parts),
            "samples": parts[0].get("samples"), "temperature": parts[0].get("temperature"),
            "eval": {"capped": sum(p["eval"].get("capped", 0) for p in parts)},
            "per_task": {k: v for p in parts for k, v in p["per_task"].items()},
            "turn_errors": errors, "chunks": len(parts),
            "prompt_tokens_max": max(prompts, default=None),
            "prompt_tokens_first": min(prompts, default=None),
            "seconds": round(sum(p["seconds"] for p in parts), 1),
            "lock_wait": round(sum(p.get("lock_wait", 0) for p in parts), 1),
            "started": min(p["started"] for p in parts),
            "finished": max(p["finished"] for p in parts)}

