#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
cat > 'shapes.py' <<'HARNESSRL_EOF'
import math


def check_positive(name: str, value: float) -> None:
    if not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number")
    if value <= 0:
        raise ValueError(f"{name} must be positive")


def circle_area(radius: float) -> float:
    check_positive("radius", radius)
    return math.pi * radius * radius


def rectangle_area(width: float, height: float) -> float:
    check_positive("width", width)
    check_positive("height", height)
    return width * height


def triangle_area(base: float, height: float) -> float:
    check_positive("base", base)
    check_positive("height", height)
    return base * height / 2
HARNESSRL_EOF
