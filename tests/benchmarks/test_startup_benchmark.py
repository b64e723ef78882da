"""The start-up benchmark reports each measurement and selection as a fraction of ``import paddle``.

Only the shape and the arithmetic are checked: the speed goal is the benchmark's to show.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"


SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "startup.py"


def test_json_has_every_measurement_and_the_ratio_of_the_same_run() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--repeat", "1", "--json"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    median = {row["measurement"]: row["median_ms"] for row in payload["rows"]}
    assert {"import fd_platforms", "discovery + selection (all installed)", "import paddle"} <= set(median)
    anchored = payload["selection_vs_import_paddle"]
    expected = median["discovery + selection (all installed)"] / median["import paddle"]
    assert abs(anchored["ratio"] - expected) < 0.001 and anchored["goal"] == 0.05
    assert anchored["met"] == (expected <= 0.05)
