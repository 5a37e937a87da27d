import os
from pathlib import Path

DOCS = Path(os.environ["WORKDIR"]) / "docs"


def test_renamed():
    names = sorted(p.name for p in DOCS.iterdir())
    assert names == ["faq.md", "intro.md", "logo.svg", "notes.txt.bak", "usage.md"]


def test_contents_kept():
    assert (DOCS / "intro.md").read_text() == "Intro\n"
    assert (DOCS / "faq.md").read_text() == "FAQ\n"
