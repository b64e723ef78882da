"""The lifecycle benchmark runs and reports each path with the fields the issue names.

Only the shape is checked: the times are the benchmark's to show, not a test's to judge.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"


SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "lifecycle.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_json_rows_split_the_time_into_plan_allocate_and_wait() -> None:
    done = run("--json", "--ranks", "1", "--repeat", "1", "--device-memory", "64MiB")
    assert done.returncode == 0, done.stderr
    creator, manager = json.loads(done.stdout)
    assert [(row["ranks"], row["path"], row["runs"]) for row in (creator, manager)] == [
        (1, "creator", 1),
        (1, "manager", 1),
    ]
    for row in (creator, manager):
        for phase in ("plan", "allocate"):
            assert 0 <= row[f"{phase}_mean_s"] <= row[f"{phase}_max_s"]
        assert 0 < row["run_s"] <= row["command_s"]
        assert row["num_blocks"] > 0 and row["device_bytes"] > 0
    assert creator["wait_max_s"] is None and creator["host_bytes"] == 0, "creators do not wait"
    assert 0 <= manager["wait_mean_s"] <= manager["wait_max_s"] and manager["host_bytes"] > 0


def test_bad_ranks_are_refused() -> None:
    done = run("--ranks", "0,2")
    assert done.returncode == 2
    assert "--ranks='0,2': give whole numbers >= 1" in done.stderr
