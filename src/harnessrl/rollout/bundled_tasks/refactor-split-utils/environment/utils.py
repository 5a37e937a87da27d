"""Helpers used all over the project."""


def slug(text: str) -> str:
    return "-".join(text.lower().split())


def title(text: str) -> str:
    return " ".join(word.capitalize() for word in text.split())


def clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def mean(values: list[float]) -> float:
    return sum(values) / len(values)
