import pytest
from ranges import inclusive_range


def test_up():
    assert inclusive_range(1, 5) == [1, 2, 3, 4, 5]
    assert inclusive_range(0, 10, 5) == [0, 5, 10]
    assert inclusive_range(0, 9, 5) == [0, 5]


def test_down():
    assert inclusive_range(5, 1, -2) == [5, 3, 1]
    assert inclusive_range(3, 3) == [3]


def test_zero_step():
    with pytest.raises(ValueError):
        inclusive_range(1, 2, 0)
