import json
import os
from pathlib import Path

WORK = Path(os.environ["WORKDIR"])


def test_config():
    config = json.loads((WORK / "config.json").read_text())
    assert config == {
        "name": "service", "version": "1.2.0", "debug": True,
        "network": {"host": "0.0.0.0", "port": 8080, "retries": 3},
        "features": ["a", "b"],
    }
