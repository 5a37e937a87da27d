from pathlib import Path
here = Path("/code/pkgx")
assert (here / "VERSION").read_text().strip() == "1.3.0"
lines = (here / "CHANGELOG.md").read_text().splitlines()
assert lines[0] == "## 1.3.0", lines[:2]
assert "## 1.2.7" in lines and "- fix a crash" in lines and "## 1.2.6" in lines
