import os
from pathlib import Path

WORK = Path(os.environ["WORKDIR"])


def test_hello():
    assert (WORK / "hello.txt").read_bytes() == b"Hello, world!\n"


def test_keep():
    keep = WORK / "out" / ".keep"
    assert keep.is_file() and keep.stat().st_size == 0
