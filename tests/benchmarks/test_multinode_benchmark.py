"""The multi-node benchmark measures one node and two nodes in the same run, with the fields docs/performance.md quotes.

Only the shape and the agreement are checked: the times are the benchmark's to show, not a test's to judge.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"


SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "multinode.py"


def test_json_rows_put_two_nodes_next_to_one_node() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", "--repeat", "1", "--device-memory", "64MiB"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    one, two = json.loads(done.stdout)
    assert (one["setup"], two["setup"], one["runs"]) == ("1 node", "2 nodes", 1)
    assert one["num_blocks"] == two["num_blocks"] > 0, "the same ranks plan the same blocks on one node or two"
    assert one["join_s"] is None and one["agree_s"] is None and one["ratio"] == 1
    assert 0 < two["agree_s"] < two["join_s"] < two["run_s"]
    assert two["ratio"] == round(two["run_s"] / one["run_s"], 3)


def test_a_bad_repeat_is_refused() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--repeat", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--repeat must be >= 1" in done.stderr
