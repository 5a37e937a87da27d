from greet import greet


def test_greet():
    assert greet("Ada") == "Hello, Ada!"


def test_greet_strips():
    assert greet("  Bob ") == "Hello, Bob!"


def test_greet_default():
    assert greet("") == "Hello, stranger!"
