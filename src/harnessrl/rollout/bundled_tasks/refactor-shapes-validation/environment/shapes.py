import math


def circle_area(radius: float) -> float:
    if not isinstance(radius, (int, float)):
        raise TypeError("radius must be a number")
    if radius <= 0:
        raise ValueError("radius must be positive")
    return math.pi * radius * radius


def rectangle_area(width: float, height: float) -> float:
    if not isinstance(width, (int, float)):
        raise TypeError("width must be a number")
    if width <= 0:
        raise ValueError("width must be positive")
    if not isinstance(height, (int, float)):
        raise TypeError("height must be a number")
    if height <= 0:
        raise ValueError("height must be positive")
    return width * height


def triangle_area(base: float, height: float) -> float:
    if not isinstance(base, (int, float)):
        raise TypeError("base must be a number")
    if base <= 0:
        raise ValueError("base must be positive")
    if not isinstance(height, (int, float)):
        raise TypeError("height must be a number")
    if height <= 0:
        raise ValueError("height must be positive")
    return base * height / 2
