import json
import os
from pathlib import Path

WORK = Path(os.environ["WORKDIR"])


def test_report():
    report = json.loads((WORK / "report.json").read_text())
    assert report == {"status_counts": {"200": 3, "302": 1, "404": 1, "500": 1, "304": 1},
                      "top_path": "/index.html"}
