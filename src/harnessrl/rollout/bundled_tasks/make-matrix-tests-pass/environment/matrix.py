def transpose(m: list[list[float]]) -> list[list[float]]:
    return [list(row) for row in m]


def multiply(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    return [[sum(x * y for x, y in zip(row, col, strict=False)) for col in b] for row in a]


def determinant(m: list[list[float]]) -> float:
    if len(m) == 1:
        return m[0][0]
    return m[0][0] * m[1][1] - m[0][1] * m[1][0]
