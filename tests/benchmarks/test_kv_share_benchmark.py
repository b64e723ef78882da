"""The KV-sharing benchmark runs both models end to end and reports every measure with its goal.

Tiny sizes and few cycles. Only the shape and the invariants are checked (nothing leaks: no
``/dev/shm`` entry, no fd); the times are the benchmark's to show, not a test's to judge.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import shm_entries

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"


SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kv_share.py"
MEASURES = ("create", "attach", "recreate", "growth")
COMMON = {"model", "tensors", "num_blocks", "bytes", "measure", "goal", "met"}
FIELDS = {
    "create": {
        "samples",
        "create_ms",
        "create_gib_s",
        "fresh_ms",
        "fresh_gib_s",
        "ratio",
        "memset_ms",
        "memset_gib_s",
        "memset_ratio",
    },
    "attach": {"samples", "attach_ms", "wait_ms", "initialize_ms", "first_attach_ms"},
    "recreate": {
        "samples",
        "cycle_ms",
        "export_ms",
        "overhead_ms",
        "attacher_clear_ms",
        "creator_clear_ms",
        "attach_ms",
        "free_anchor_ms",
        "overhead_beyond_free_ms",
    },
    "growth": {
        "cycles",
        "cycles_before",
        "shm_entries",
        "shm_entries_growth",
        "fds_growth_benchmark",
        "fds_growth_creator",
        "rss_growth_benchmark_percent",
        "rss_growth_creator_percent",
        "rss_growth_benchmark_kib_per_cycle",
        "rss_growth_creator_kib_per_cycle",
    },
}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def ours(names: set[str]) -> set[str]:
    return {name for name in names if ".kv_share-" in name}


def test_json_rows_report_every_measure_with_its_goal_and_nothing_leaks() -> None:
    before = ours(shm_entries())
    done = run("--json", "--size", "8MiB", "--cycles", "5", "--repeat", "1", "--warmup", "1")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [(row["model"], row["measure"]) for row in rows] == [
        (model, measure) for model in ("deepseek-v3", "qwen3-30b-a3b") for measure in MEASURES
    ]
    for row in rows:
        assert COMMON | FIELDS[row["measure"]] <= row.keys(), row["measure"]
        assert isinstance(row["met"], bool) and row["goal"]
        assert row["num_blocks"] >= 1 and 0 < row["bytes"] <= 8 << 20
    tensors = {row["model"]: row["tensors"] for row in rows}
    assert tensors == {"deepseek-v3": 61, "qwen3-30b-a3b": 96}
    for row in rows:
        if row["measure"] == "create":
            assert row["create_gib_s"] > 0 and row["memset_gib_s"] > 0 and row["ratio"] > 0
            assert row["fresh_gib_s"] > 0 and row["memset_ratio"] > 0  # the anchors, measured in the same run
        elif row["measure"] == "attach":
            assert row["wait_ms"] >= 0 and 0 < row["attach_ms"] <= row["initialize_ms"]
        elif row["measure"] == "recreate":
            assert 0 < row["export_ms"] < row["cycle_ms"]
            assert abs(row["overhead_ms"] - (row["cycle_ms"] - row["export_ms"])) < 0.01, "one sample: cycle - export"
        else:
            assert row["cycles"] == 5 and row["shm_entries"] == 2, "the signal and the rank's publication"
            assert row["shm_entries_growth"] == 0
            assert row["fds_growth_benchmark"] == 0 and row["fds_growth_creator"] == 0
    assert not ours(shm_entries()) - before, "the benchmark left /dev/shm entries behind"


def test_table_names_each_goal_and_the_machine() -> None:
    done = run("--size", "8MiB", "--cycles", "2", "--repeat", "1", "--warmup", "1", "--models", "deepseek-v3")
    assert done.returncode == 0, done.stderr
    caption, header, *lines, footer = done.stdout.splitlines()
    assert "memset" in caption and header.split()[:2] == ["model", "tensors"]
    assert [line.split()[3] for line in lines] == list(MEASURES)
    assert all(line.split()[0] == "deepseek-v3" and (" met " in line or " missed " in line) for line in lines)
    assert footer.startswith(f"python {sys.version.split()[0]}, ") and " CPUs " in footer


def test_bad_arguments_are_refused() -> None:
    done = run("--models", "deepseek-v3,llama")
    assert done.returncode == 2 and "unknown ['llama']; choose from: deepseek-v3, qwen3-30b-a3b" in done.stderr
    done = run("--size", "1KiB")
    assert done.returncode == 2 and "holds no block of deepseek-v3" in done.stderr
