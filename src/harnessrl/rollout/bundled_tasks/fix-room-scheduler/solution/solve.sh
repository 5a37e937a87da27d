#!/usr/bin/env bash
# Reference solution: run in the task's workdir.
set -euo pipefail
mkdir -p 'scheduler'
cat > 'scheduler/timeslots.py' <<'HARNESSRL_EOF'
from dataclasses import dataclass


@dataclass(frozen=True)
class Meeting:
    name: str
    start: int
    end: int


def overlaps(a: Meeting, b: Meeting) -> bool:
    return a.start < b.end and b.start < a.end
HARNESSRL_EOF
mkdir -p 'scheduler'
cat > 'scheduler/rooms.py' <<'HARNESSRL_EOF'
from scheduler.timeslots import Meeting, overlaps


class NoRoomFree(Exception):
    pass


def assign(meetings: list[Meeting], rooms: list[str]) -> dict[str, str]:
    booked: dict[str, list[Meeting]] = {room: [] for room in rooms}
    result = {}
    for meeting in sorted(meetings, key=lambda m: (m.start, m.end, m.name)):
        for room in rooms:
            if not any(overlaps(meeting, other) for other in booked[room]):
                booked[room].append(meeting)
                result[meeting.name] = room
                break
        else:
            raise NoRoomFree(meeting.name)
    return result
HARNESSRL_EOF
