import ast
import os
from pathlib import Path

import payments
import pytest

SOURCE = (Path(os.environ["WORKDIR"]) / "payments.py").read_text()


def test_results_unchanged():
    cases = {("card", 100): 3.2, ("card", 0): 0.3, ("bank", 999): 0.8,
             ("bank", 1000): 5.0, ("wallet", 200): 3.0, ("wallet", 1): 0.01,
             ("crypto", 50): 1.0, ("crypto", 250): 2.5}
    for (kind, amount), expected in cases.items():
        assert payments.fee(kind, amount) == expected


def test_unknown():
    with pytest.raises(ValueError, match="unknown payment kind: cash"):
        payments.fee("cash", 1)


def test_table():
    assert set(payments.FEES) == {"card", "bank", "wallet", "crypto"}
    assert all(callable(f) for f in payments.FEES.values())
    assert payments.FEES["crypto"](250) == 2.5


def test_no_if_in_fee():
    tree = ast.parse(SOURCE)
    fee = next(node for node in tree.body
               if isinstance(node, ast.FunctionDef) and node.name == "fee")
    assert not any(isinstance(node, ast.If) for node in ast.walk(fee))
