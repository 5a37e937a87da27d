import ast
import os
import subprocess
import sys
from pathlib import Path

WORK = Path(os.environ["WORKDIR"])


def test_layout():
    assert not (WORK / "utils.py").exists()
    for name in ("__init__.py", "strings.py", "numbers.py"):
        assert (WORK / "utils" / name).is_file()


def defined(path):
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_definitions_moved():
    assert defined(WORK / "utils" / "strings.py") == {"slug", "title"}
    assert defined(WORK / "utils" / "numbers.py") == {"clamp", "mean"}
    assert defined(WORK / "utils" / "__init__.py") == set()


def test_behaviour():
    from utils import clamp, mean, slug, title
    from utils.numbers import clamp as clamp2
    assert clamp is clamp2
    assert slug("A  B c") == "a-b-c" and title("ab cd") == "Ab Cd"
    assert clamp(-1, 0, 5) == 0 and mean([2, 4]) == 3


def test_app_output():
    done = subprocess.run([sys.executable, "app.py"], cwd=WORK, capture_output=True,
                          text=True, timeout=30)
    assert done.stdout == "hello-big-world A Tale Of Two Cities 10 2.5\n"
