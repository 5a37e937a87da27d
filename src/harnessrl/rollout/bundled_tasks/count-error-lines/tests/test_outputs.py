import os
from pathlib import Path

WORK = Path(os.environ["WORKDIR"])


def test_count():
    assert (WORK / "error_count.txt").read_text().strip() == "3"


def test_log_untouched():
    assert len((WORK / "data" / "app.log").read_text().splitlines()) == 8
