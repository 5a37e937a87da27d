import os
from pathlib import Path

WORK = Path(os.environ["WORKDIR"])


def test_totals():
    lines = (WORK / "totals.csv").read_text().strip().splitlines()
    assert lines == ["region,total", "east,255", "north,10", "west,200"]
