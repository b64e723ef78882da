"""The suite-cost benchmark runs pytest on what it is given and reports the CPU-seconds of the run and of each file.

Only the shape and the arithmetic are checked, on two small files in one process (``-n 0``): the times are the
benchmark's to show, not a test's to judge.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"


ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "suite_cost.py"
FILES = ("tests/rules/test_roles.py", "tests/contract/test_records.py")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """The benchmark, in an environment without this pytest's (an xdist worker's names would reach the run's)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


def test_json_lists_each_file_with_its_cpu_seconds_within_the_runs() -> None:
    done = run("--json", "--", "-n", "0", "-p", "no:cacheprovider", "-q", *FILES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stderr, "pytest's own output goes to stderr"
    report = json.loads(done.stdout)
    assert report["exit_status"] == 0 and report["command"][-len(FILES) :] == list(FILES)
    files = report["files"]
    assert sorted(row["file"] for row in files) == sorted(FILES)
    assert [row["cpu_s"] for row in files] == sorted((row["cpu_s"] for row in files), reverse=True), "slowest first"
    assert all(row["tests"] > 0 and row["cpu_s"] >= 0 and row["wall_s"] > 0 for row in files)
    assert report["tests"] == sum(row["tests"] for row in files)
    assert report["wall_s"] > 0 and report["cpu_s"] > 0
    assert abs(report["cpu_s"] - report["user_s"] - report["sys_s"]) <= 0.02
    attributed = sum(row["cpu_s"] for row in files)
    assert abs(report["attributed_cpu_s"] - attributed) <= 0.02
    assert 0 < report["attributed_cpu_s"] <= report["cpu_s"], "the files' sum is part of the whole run"
    assert report["unattributed_cpu_s"] == pytest.approx(report["cpu_s"] - report["attributed_cpu_s"], abs=0.02)
    [process] = report["processes"]  # -n 0: the tests ran in pytest's own process
    assert process["worker"] == "main" and process["tests_cpu_s"] <= process["cpu_s"] <= report["cpu_s"]


def test_a_negative_top_is_refused() -> None:
    done = run("--top", "-1")
    assert done.returncode == 2 and "--top must be >= 0" in done.stderr


ORPHAN_TEST = """
import subprocess, sys

BURN = "import time\\nend = time.process_time() + 1.0\\nwhile time.process_time() < end:\\n    pass\\n"


def test_a_grandchild_outlives_its_parent():
    starter = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', sys.argv[1]])"
    subprocess.run([sys.executable, "-c", starter, BURN], check=True)  # exits at once: its child is an orphan
"""


def test_an_orphans_cpu_seconds_count(tmp_path: Path) -> None:
    test_file = tmp_path / "test_orphan.py"
    test_file.write_text(ORPHAN_TEST)
    done = run("--json", "--", "-n", "0", "-p", "no:cacheprovider", "-q", str(test_file))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert (report["orphans_reaped"], report["orphans_running"]) == (1, 0)
    assert report["unattributed_cpu_s"] >= 0.9, "the orphan's second of CPU is the suite's, outside any test's"
