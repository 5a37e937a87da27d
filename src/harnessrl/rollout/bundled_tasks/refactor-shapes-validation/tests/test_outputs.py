import ast
import math
import os
from pathlib import Path

import pytest
from shapes import check_positive, circle_area, rectangle_area, triangle_area

SOURCE = (Path(os.environ["WORKDIR"]) / "shapes.py").read_text()


def test_behaviour():
    assert circle_area(2) == pytest.approx(4 * math.pi)
    assert rectangle_area(2.5, 4) == 10
    assert triangle_area(3, 3) == 4.5
    for call, kind, message in [
        (lambda: circle_area(-1), ValueError, "radius must be positive"),
        (lambda: circle_area("x"), TypeError, "radius must be a number"),
        (lambda: rectangle_area(0, 1), ValueError, "width must be positive"),
        (lambda: rectangle_area(1, -1), ValueError, "height must be positive"),
        (lambda: triangle_area(None, 1), TypeError, "base must be a number"),
        (lambda: triangle_area(1, 0), ValueError, "height must be positive"),
    ]:
        with pytest.raises(kind, match=message):
            call()


def test_helper():
    check_positive("x", 1)
    with pytest.raises(ValueError, match="x must be positive"):
        check_positive("x", 0)


def test_structure():
    raises = [node.exc.func.id for node in ast.walk(ast.parse(SOURCE))
              if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
              and isinstance(node.exc.func, ast.Name)]
    assert sorted(raises) == ["TypeError", "ValueError"]
