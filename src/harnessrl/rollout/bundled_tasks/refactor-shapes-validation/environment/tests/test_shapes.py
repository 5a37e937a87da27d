import math

import pytest
from shapes import circle_area, rectangle_area, triangle_area


def test_areas():
    assert circle_area(1) == pytest.approx(math.pi)
    assert rectangle_area(2, 3) == 6
    assert triangle_area(4, 5) == 10


def test_errors():
    with pytest.raises(ValueError, match="radius must be positive"):
        circle_area(0)
    with pytest.raises(TypeError, match="height must be a number"):
        rectangle_area(1, "2")
