import json
from pathlib import Path
chapters = sorted(Path("/data/corpus/chapters").glob("*.txt"))
assert len(chapters) == 5
want = {p.name: len(p.read_text().split()) for p in chapters}
assert json.loads(Path("/data/corpus/index.json").read_text()) == want
