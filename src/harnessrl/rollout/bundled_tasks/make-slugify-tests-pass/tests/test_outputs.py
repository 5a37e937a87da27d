import hashlib
import os
from pathlib import Path

from slugify import slugify

WORK = Path(os.environ["WORKDIR"])


def test_visible_tests_unchanged():
    data = (WORK / "tests" / "test_slugify.py").read_bytes()
    expected = "98b44b9e9c570aceb27d08a186d4caa0cccd10c86dea9de506f4808acb24ed74"
    assert hashlib.sha256(data).hexdigest() == expected


def test_visible_cases():
    assert slugify("Hello World") == "hello-world"
    assert slugify("Hello, World! How are you?") == "hello-world-how-are-you"
    assert slugify("  a -- b  ") == "a-b"
    assert slugify("Crème Brûlée") == "creme-brulee"


def test_hidden_cases():
    assert slugify("") == ""
    assert slugify("---") == ""
    assert slugify("Python 3.12 released") == "python-3-12-released"
    assert slugify("Ångström_unit") == "angstrom-unit"
