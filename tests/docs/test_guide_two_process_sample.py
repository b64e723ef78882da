"""The engine guide's two-process sample runs as written: ``two_processes.py``, taken from the guide as it stands, run
as a file from the repository root on the cpu platform; the engine starts the cache manager and the model runner,
each an OS process of its own (spawned), the manager creates, the runner attaches to the same memory, each exits 0,
and nothing of theirs is left in ``/dev/shm``."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from conftest import left_behind_by, run_tracked, shm_entries
from run_helpers import ROOT, clean_env

GUIDE = ROOT / "docs" / "engine-integration.md"
SAMPLE = re.compile(r'^```python title="two_processes.py"\n(.*?)^```', re.S | re.M)
TIMEOUT = 120  # the sample bounds its own waits: 30 s each, 60 s for each join
RUNNER = r"runner (?P<pid>\d+): created=False num_blocks=(?P<blocks>\d+) read (?P<read>[\d.]+), wrote 1\.5"
MANAGER = (
    r"manager (?P<pid>\d+): created=True num_blocks=(?P<blocks>\d+) host num_blocks=(?P<host>\d+) read (?P<read>[\d.]+)"
)
ENGINE = r"engine (?P<pid>\d+): planned (?P<blocks>\d+) blocks, runner exit 0, manager exit 0"

pytestmark = [  # multi-process: left out of -m "not slow"
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("paddle") is None, reason="paddle is not installed"),
]


def the_sample() -> str:
    found = SAMPLE.findall(GUIDE.read_text(encoding="utf-8"))
    assert len(found) == 1, "the guide has one two_processes.py"
    return str(found[0])


def test_the_sample_is_short_and_opens_the_guide() -> None:
    """Before the long per-topic sections: right after the first table, under the guide's first heading but one."""
    text = GUIDE.read_text(encoding="utf-8")
    assert the_sample().count("\n") <= 50
    assert re.findall(r"^## .+$", text, re.M)[0].startswith("## Two processes")
    assert text.index('```python title="two_processes.py"') < text.index("\n## ", text.index("## Two processes") + 1)
    assert the_sample().startswith("# two_processes.py")


def test_the_two_process_sample_runs_as_two_processes_beside_the_engine(tmp_path: Path) -> None:
    script = tmp_path / "two_processes.py"
    script.write_text(the_sample(), encoding="utf-8")
    before = shm_entries()
    command = [sys.executable, str(script)]
    done, pids = run_tracked(command, cwd=ROOT, env=clean_env(FD_PLATFORM="cpu"), timeout=TIMEOUT)
    assert done.returncode == 0, f"rc={done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    lines = done.stdout.splitlines()
    assert len(lines) == 3, lines  # whole lines: the runner says its own before the manager may say anything
    matched = [re.fullmatch(pattern, line) for pattern, line in zip((RUNNER, MANAGER, ENGINE), lines, strict=True)]
    assert all(matched), lines
    runner, manager, engine = (match for match in matched if match is not None)
    runner_pid, manager_pid, engine_pid = int(runner["pid"]), int(manager["pid"]), int(engine["pid"])
    assert len({runner_pid, manager_pid, engine_pid}) == 3, "three OS processes"
    assert {runner_pid, manager_pid, engine_pid} <= pids, "the engine and the two processes it started"
    planned = int(engine["blocks"])
    assert planned > 0 and int(runner["blocks"]) == int(manager["blocks"]) == planned  # the same cache
    assert int(manager["host"]) > 0  # the manager holds the host swap space: the rule sent the runner to attach
    # the runner read the zero fill the manager wrote before it set the slot, and the manager the runner's 1.5
    assert (runner["read"], manager["read"]) == ("0.0", "1.5"), lines
    left = left_behind_by(pids, before)
    assert not left, f"two_processes.py left {left} in /dev/shm"
    assert not [name for name in shm_entries() if f".{engine_pid}-" in name], "the signal and publication are gone"
