import hashlib
import os
from pathlib import Path

import pytest
from matrix import determinant, multiply, transpose

WORK = Path(os.environ["WORKDIR"])


def test_visible_tests_unchanged():
    data = (WORK / "tests" / "test_matrix.py").read_bytes()
    expected = "feb0a991fdafc25bdafb71c355332bb5414d30379073c7e69b49f0d3e3b17d10"
    assert hashlib.sha256(data).hexdigest() == expected


def test_visible_cases():
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]
    assert multiply([[1, 2], [3, 4]], [[5, 6], [7, 8]]) == [[19, 22], [43, 50]]
    assert multiply([[1, 2, 3]], [[1], [2], [3]]) == [[14]]
    with pytest.raises(ValueError):
        multiply([[1, 2]], [[1, 2]])
    assert determinant([[2, 0, 1], [1, 3, 2], [1, 1, 2]]) == 6


def test_hidden_cases():
    identity = [[1 if i == j else 0 for j in range(4)] for i in range(4)]
    m = [[2, 1, 0, 3], [1, 0, 2, 1], [0, 3, 1, 1], [1, 1, 1, 0]]
    assert multiply(m, identity) == m
    assert determinant(identity) == 1
    assert determinant(m) == pytest.approx(20)
    assert transpose([[1], [2]]) == [[1, 2]]
    assert determinant([[1, 2], [2, 4]]) == 0
