from scheduler.timeslots import Meeting, overlaps


class NoRoomFree(Exception):
    pass


def assign(meetings: list[Meeting], rooms: list[str]) -> dict[str, str]:
    booked: dict[str, list[Meeting]] = {room: [] for room in rooms}
    result = {}
    for meeting in sorted(meetings, key=lambda m: m.name):
        for room in rooms:
            if not any(overlaps(meeting, other) for other in booked[room]):
                booked[room].append(meeting)
                result[meeting.name] = room
        raise NoRoomFree(meeting.name)
    return result
