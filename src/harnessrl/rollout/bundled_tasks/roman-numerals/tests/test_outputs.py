import pytest
from roman import from_roman, to_roman


def test_known():
    for n, s in [(1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"), (40, "XL"), (90, "XC"),
                 (400, "CD"), (1994, "MCMXCIV"), (2024, "MMXXIV"), (3999, "MMMCMXCIX")]:
        assert to_roman(n) == s
        assert from_roman(s) == n


def test_round_trip():
    for n in range(1, 4000):
        assert from_roman(to_roman(n)) == n


def test_invalid():
    for bad in (0, 4000, -1):
        with pytest.raises(ValueError):
            to_roman(bad)
    for bad in ("", "IIII", "IC", "ABC", "VV", "MMMM"):
        with pytest.raises(ValueError):
            from_roman(bad)
