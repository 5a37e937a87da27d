import ast
import os
from pathlib import Path

import pytest
from calc import evaluate

SOURCE = (Path(os.environ["WORKDIR"]) / "calc.py").read_text()


def test_precedence():
    assert evaluate("1 + 2 * 3") == 7
    assert evaluate("(1 + 2) * 3") == 9
    assert evaluate("10 / 4") == 2.5
    assert evaluate("8 - 3 - 2") == 3
    assert evaluate("2 * (3 + 4) * 5 / 7") == 10


def test_unary_and_decimals():
    assert evaluate("-3 + 5") == 2
    assert evaluate("-(2 + 3) * -2") == 10
    assert evaluate(" 1.5 * 4 ") == 6
    assert evaluate("--4") == 4


def test_errors():
    for bad in ("", "1 +", "(1 + 2", "1 + 2)", "2 ** 3", "abc", "1 2", "()"):
        with pytest.raises(ValueError):
            evaluate(bad)
    with pytest.raises(ZeroDivisionError):
        evaluate("1 / (2 - 2)")


def test_no_eval():
    names = {node.id for node in ast.walk(ast.parse(SOURCE)) if isinstance(node, ast.Name)}
    assert not names & {"eval", "exec", "compile"}
