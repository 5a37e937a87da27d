from wordfreq import top_words


def test_basic():
    text = "the cat and the hat. The end, and THE cat!"
    assert top_words(text, 3) == [("the", 4), ("and", 2), ("cat", 2)]


def test_apostrophes_and_ties():
    assert top_words("don't stop, don't. b a c", 10) == [
        ("don't", 2), ("a", 1), ("b", 1), ("c", 1), ("stop", 1)]


def test_empty():
    assert top_words("", 3) == []
    assert top_words("123 456", 2) == []
