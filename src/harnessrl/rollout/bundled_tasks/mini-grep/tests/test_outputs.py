import os
import subprocess
import sys
from pathlib import Path

WORK = Path(os.environ["WORKDIR"])


def grep(*args):
    return subprocess.run([sys.executable, str(WORK / "mygrep.py"), *args], cwd=WORK,
                          capture_output=True, text=True, timeout=30)


def test_basic():
    done = grep("apple", "a.txt")
    assert done.returncode == 0 and done.stdout == "apple pie\n"


def test_options():
    assert grep("-i", "apple", "a.txt").stdout == "apple pie\nAPPLE juice\n"
    assert grep("-n", "tart", "a.txt").stdout == "3:cherry tart\n"
    assert grep("-c", "-i", "apple", "a.txt").stdout == "2\n"
    assert grep("-v", "a", "a.txt").stdout == "APPLE juice\n"
    assert grep("-n", "-i", "^b", "a.txt").stdout == "2:Banana split\n"


def test_many_files():
    done = grep("apple", "a.txt", "b.txt")
    assert done.stdout == "a.txt:apple pie\nb.txt:pineapple\n"
    assert grep("-c", "e", "a.txt", "b.txt").stdout == "a.txt:3\nb.txt:2\n"


def test_status():
    assert grep("zzz", "a.txt").returncode == 1
    done = grep("a", "nope.txt")
    assert done.returncode == 2 and done.stderr
