import pytest
from payments import fee


def test_fees():
    assert fee("card", 100) == 3.2
    assert fee("bank", 10) == 0.8
    assert fee("wallet", 200) == 3.0


def test_unknown():
    with pytest.raises(ValueError, match="unknown payment kind: cash"):
        fee("cash", 1)
