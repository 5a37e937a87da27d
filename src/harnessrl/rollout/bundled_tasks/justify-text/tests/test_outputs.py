import pytest
from justify import justify


def test_example():
    text = "This is an example of text justification."
    assert justify(text, 16) == ["This    is    an", "example  of text", "justification.  "]


def test_uneven_and_single():
    assert justify("What must be acknowledgment shall be", 16) == [
        "What   must   be", "acknowledgment  ", "shall be        "]


def test_edges():
    assert justify("", 10) == []
    assert justify("a b c d", 3) == ["a b", "c d"]
    assert all(len(line) == 20 for line in justify("lorem ipsum " * 30, 20))
    with pytest.raises(ValueError):
        justify("tiny enormousword", 5)
