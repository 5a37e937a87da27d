"""The disk fills while the proxy writes turns (issue 8, item 2).

The run directory lives on a small tmpfs mounted for the test; a ballast file takes every
free page, so the next WAL append fails with SQLITE_FULL. Then, in every dialect, streamed
and not: the client gets a clear error in its dialect's shape (its SDK raises), no turn
that did not commit is in the store as complete, the store passes `PRAGMA integrity_check`,
new rollouts are refused in the admin API's shape, and once the ballast is gone the same
proxy commits new turns again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harnessrl.proxy.engines.vllm import VLLMEngine
from harnessrl.proxy.serve import in_thread
from harnessrl.rollout.analysis.chains import link
from tests.dialects import IDS, WIRE, WireDialect
from tests.fake_vllm import FakeVLLM
from tests.helpers import ServedProxy, make_proxy

DISK = "4m"  # room for the schema, a few turns and the WAL of this test
FULL_WORDS = "could not record"


def _mount_tmpfs(where: Path) -> str | None:
    """Mount a small tmpfs at `where`; the reason it could not be mounted, or None."""
    if shutil.which("mount") is None:
        return "no mount(8) on this machine"
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); needs root"
    return None


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "disk"
    if (reason := _mount_tmpfs(where)) is not None:
        pytest.skip(reason)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


class Ballast:
    """A file that takes every free page of the filesystem it is on, until removed."""

    def __init__(self, where: Path) -> None:
        self.path = where / "ballast"

    def fill(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for size in (1 << 16, 1 << 12, 1 << 9, 1):
                with contextlib.suppress(OSError):
                    while True:
                        os.write(fd, b"\0" * size)
            with pytest.raises(OSError) as full:  # really full: one more byte does not fit
                os.write(fd, b"\0")
        finally:
            os.close(fd)
        assert full.value.errno == errno.ENOSPC

    def remove(self) -> None:
        self.path.unlink()


@pytest.fixture
def fake() -> Iterator[FakeVLLM]:
    fake = FakeVLLM()
    with in_thread(fake.app()) as (url, _server):
        fake.url = url  # type: ignore[attr-defined]
        yield fake


@pytest.fixture
def served(fake: FakeVLLM, disk: Path) -> Iterator[ServedProxy]:
    engine = VLLMEngine(fake.url)  # type: ignore[attr-defined]
    with ServedProxy(make_proxy(engine, disk / "run")).running() as served:
        rollout = served.new_rollout()
        served.key, served.root = rollout["key"], rollout["base_url"]  # type: ignore[attr-defined]
        yield served


def _stored(served: ServedProxy) -> list[tuple[int, str]]:
    return [(t.index, t.status) for t in served.store.turns(served.key)]  # type: ignore[attr-defined]


def _integrity(path: Path) -> str:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()


@pytest.mark.parametrize("dialect", WIRE, ids=IDS)
def test_disk_full(served: ServedProxy, disk: Path, dialect: WireDialect) -> None:
    dialect_ok = dialect.post(served)
    assert dialect_ok.status_code == 200, dialect_ok.text
    assert _stored(served) == [(0, "ok")]
    ballast = Ballast(disk)
    ballast.fill()

    # Not streamed: an error status in the dialect's own error shape, saying why.
    resp = dialect.post(served)
    assert resp.status_code >= 500, resp.text
    error = dialect.error(resp.status_code, resp.json())
    assert FULL_WORDS in error["message"] and "full" in error["message"], error

    # Streamed: the tokens, then the dialect's error event in place of the final event.
    resp = dialect.post(served, stream=True)
    content = resp.content
    last = content.rstrip().rsplit(b"\n\n", 1)[-1]
    assert last.startswith(dialect.last_event), content
    assert FULL_WORDS.encode() in last, content

    # The dialect's SDK raises on both: no silent success.
    for stream in (False, True):
        with pytest.raises(dialect.sdk_error) as caught:
            dialect.sdk(served, stream)
        assert FULL_WORDS in str(caught.value), caught.value

    # A new rollout cannot be recorded either: refused in the admin API's (OpenAI) shape.
    refused = httpx.post(f"{served.url}/rollouts", json={})
    assert refused.status_code >= 500, refused.text
    assert FULL_WORDS in refused.json()["error"]["message"]
    closing = httpx.delete(f"{served.url}/rollouts/{served.key}",  # type: ignore[attr-defined]
                           headers={"authorization": f"Bearer {served.key}"})  # type: ignore[attr-defined]
    assert closing.status_code >= 500 and FULL_WORDS in closing.json()["error"]["message"]

    # Nothing that did not commit is stored as done; the file is sound.
    assert _stored(served) == [(0, "ok")]
    assert _integrity(served.store.path) == "ok"

    # Space comes back: the same proxy commits again, and the turn is trainable.
    ballast.remove()
    again = dialect.post(served, stream=True)
    assert again.status_code == 200 and not again.content.rstrip().rsplit(
        b"\n\n", 1)[-1].startswith(dialect.last_event), again.content
    stored = _stored(served)
    assert [s for _, s in stored] == ["ok", "ok"], stored
    assert len(link(served.store.turns(served.key)).chains) >= 1  # type: ignore[attr-defined]
    assert httpx.post(f"{served.url}/rollouts", json={}).status_code == 201
    assert _integrity(served.store.path) == "ok"
