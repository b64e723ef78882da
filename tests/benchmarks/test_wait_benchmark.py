"""The wait benchmark runs and reports every strategy with the fields the issue names.

Only the shape is checked: speed goals are the benchmark's to show, not a test's to time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"


SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "wait_ready.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_json_lists_each_strategy_with_latency_and_cpu() -> None:
    done = run("--json", "--cpu-seconds", "0.1", "--rounds", "2", "--strategies", "futex,spin,poll-10ms")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [row["strategy"] for row in rows] == ["futex", "spin", "poll-10ms"]
    for row in rows:
        assert {"strategy", "p50_ms", "p99_ms", "cpu_percent"} <= row.keys()
        assert row["samples"] == 3  # the CPU-measuring wait's return, then each round's
        assert 0 <= row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
        assert row["cpu_percent"] >= 0


def test_table_marks_the_goal_per_strategy() -> None:
    done = run("--cpu-seconds", "0.1", "--rounds", "1", "--strategies", "spin")
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()[1:]
    assert header.split()[:3] == ["strategy", "p50", "ms"]
    assert rows[0].startswith("spin") and rows[0].endswith("missed"), "a spinning waiter burns a core"


def test_unknown_strategy_is_refused_with_the_choices() -> None:
    done = run("--strategies", "futex,busyloop")
    assert done.returncode == 2
    assert "unknown ['busyloop']; choose from: futex, fastdeploy, fastdeploy-foreign, spin, poll-1s" in done.stderr


def test_a_foreign_store_is_measured_against_our_setter_with_its_own_goal() -> None:
    done = run("--json", "--cpu-seconds", "0.1", "--rounds", "2", "--strategies", "fastdeploy,fastdeploy-foreign")
    assert done.returncode == 0, done.stderr
    anchor, foreign = json.loads(done.stdout)
    assert (anchor["strategy"], foreign["strategy"]) == ("fastdeploy", "fastdeploy-foreign")
    assert foreign["samples"] == 3 and 0 <= foreign["p50_ms"] <= foreign["p99_ms"]
    table = run("--cpu-seconds", "0.1", "--rounds", "1", "--strategies", "fastdeploy-foreign")
    assert "fastdeploy-foreign: p50<=10 ms, p99<=20 ms, cpu<=0.1 %" in table.stdout.splitlines()[0]
