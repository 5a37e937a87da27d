import pytest
from duration import parse_duration


def test_valid():
    assert parse_duration("45s") == 45
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2d4h") == 187200
    assert parse_duration("1h 5m 10s") == 3910
    assert parse_duration("0s") == 0


def test_invalid():
    for bad in ("", "10", "5x", "1m1h", "1h1h", "h", "1.5h", "-1s"):
        with pytest.raises(ValueError):
            parse_duration(bad)
