from text_utils import reverse_words


def test_simple():
    assert reverse_words("the quick brown fox") == "fox brown quick the"


def test_whitespace():
    assert reverse_words("  hello \t  world\n") == "world hello"


def test_empty_and_single():
    assert reverse_words("") == ""
    assert reverse_words("   ") == ""
    assert reverse_words("one") == "one"
