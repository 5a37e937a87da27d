import pytest
from scheduler.rooms import NoRoomFree, assign
from scheduler.timeslots import Meeting, overlaps


def test_overlaps():
    assert overlaps(Meeting("a", 9, 11), Meeting("b", 10, 12))
    assert not overlaps(Meeting("a", 9, 10), Meeting("b", 10, 12))
    assert overlaps(Meeting("a", 9, 12), Meeting("b", 10, 11))
    assert not overlaps(Meeting("a", 13, 14), Meeting("b", 10, 12))


def test_assign():
    meetings = [Meeting("standup", 9, 10), Meeting("review", 9, 11),
                Meeting("lunch", 12, 13), Meeting("planning", 10, 12)]
    assert assign(meetings, ["A", "B"]) == {
        "standup": "A", "review": "B", "planning": "A", "lunch": "A"}


def test_no_room():
    meetings = [Meeting("x", 9, 11), Meeting("y", 10, 12), Meeting("z", 10, 11)]
    with pytest.raises(NoRoomFree, match="y"):
        assign(meetings, ["A", "B"])


def test_back_to_back_single_room():
    meetings = [Meeting(f"m{i}", i, i + 1) for i in range(8, 16)]
    assert set(assign(meetings, ["only"]).values()) == {"only"}
