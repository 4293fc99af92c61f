import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def vectors():
    path = Path(os.environ.get("AIRLOCK_VECTORS", REPO / "schemas" / "vectors" / "client.json"))
    return json.loads(path.read_text("utf-8"))
