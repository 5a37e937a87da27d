from slugify import slugify


def test_basic():
    assert slugify("Hello World") == "hello-world"


def test_punctuation():
    assert slugify("Hello, World! How are you?") == "hello-world-how-are-you"


def test_dashes_collapse():
    assert slugify("  a -- b  ") == "a-b"


def test_accents():
    assert slugify("Crème Brûlée") == "creme-brulee"
