import pytest
from matrix import determinant, multiply, transpose


def test_transpose():
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_multiply():
    assert multiply([[1, 2], [3, 4]], [[5, 6], [7, 8]]) == [[19, 22], [43, 50]]
    assert multiply([[1, 2, 3]], [[1], [2], [3]]) == [[14]]


def test_multiply_shape_error():
    with pytest.raises(ValueError):
        multiply([[1, 2]], [[1, 2]])


def test_determinant():
    assert determinant([[4]]) == 4
    assert determinant([[1, 2], [3, 4]]) == -2
    assert determinant([[2, 0, 1], [1, 3, 2], [1, 1, 2]]) == 6
