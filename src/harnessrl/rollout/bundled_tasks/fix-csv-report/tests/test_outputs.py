import os
from pathlib import Path

from report.parse import read_rows
from report.summary import summarize

WORK = Path(os.environ["WORKDIR"])


def test_rows():
    rows = read_rows(str(WORK / "employees.csv"))
    assert [r["name"] for r in rows] == ["Ann", "Bob", "Cid", "Dee", "Eve"]
    assert rows[0]["salary"] == 100


def test_summary():
    rows = read_rows(str(WORK / "employees.csv"))
    assert summarize(rows) == {
        "eng": {"count": 3, "average": 98.33, "max": 105},
        "ops": {"count": 2, "average": 82.5, "max": 85},
    }
