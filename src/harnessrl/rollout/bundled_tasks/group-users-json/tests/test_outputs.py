import json
import os
from pathlib import Path

WORK = Path(os.environ["WORKDIR"])


def test_grouped():
    data = json.loads((WORK / "by_country.json").read_text())
    assert data == {"FR": ["amir", "ana"], "NZ": ["li", "zoe"]}
    assert list(data) == ["FR", "NZ"]
