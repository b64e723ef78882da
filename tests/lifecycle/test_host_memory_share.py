"""The cpu platform's ranks share the host's memory: ``plan`` splits it across the ranks as ``run`` does, and a
run whose caches would take more than half of it (``HOST_ROOM_SHARE``) is refused naming the sizes, before any
process starts."""

from __future__ import annotations

import json

import pytest
from run_helpers import console_script, main_on_cpu


def test_plan_splits_the_host_across_the_ranks_as_run_does() -> None:
    done = main_on_cpu("plan", "--config", "examples/deploy.toml", "--json")
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)[0] if done.stdout.lstrip().startswith("[") else json.loads(done.stdout)
    memory = row["device_memory"]
    assert memory["source"].endswith("split evenly across 4 ranks sharing host memory")
    assert 4 * row["num_blocks"] * row["bytes_per_block"] <= 0.9 * 4 * memory["total_bytes"]


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_cpu_run_that_would_take_most_of_the_host_is_refused_naming_the_sizes_before_any_process_starts() -> None:
    done = console_script("run", "--config", "examples/deploy.toml")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.splitlines()  # the error alone: no worker was started, no signal made
    assert line.startswith('fd-platforms: error: --device-memory="not given (the host\'s memory)" is not valid')
    assert "4 rank(s) x (" in line and "more than half of the" in line and "Fix: give --device-memory SIZE" in line
