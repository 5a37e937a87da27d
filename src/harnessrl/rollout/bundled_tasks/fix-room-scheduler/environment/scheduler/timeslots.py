from dataclasses import dataclass


@dataclass(frozen=True)
class Meeting:
    name: str
    start: int
    end: int


def overlaps(a: Meeting, b: Meeting) -> bool:
    return a.start <= b.end and b.start <= a.end
