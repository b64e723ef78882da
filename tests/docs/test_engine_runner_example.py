"""The engine guide's example runs as written: ``examples/engine_runner.py`` end to end, from another folder, leaving
nothing behind (the guide's own blocks run in ``test_doc_samples.py``, with every doc's)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import left_behind_by, run_tracked, shm_entries
from run_helpers import ROOT, clean_env

EXAMPLE = ROOT / "examples" / "engine_runner.py"
TIMEOUT = 120

pytestmark = [  # multi-process: left out of -m "not slow"
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("paddle") is None, reason="paddle is not installed"),
]


def run_python(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], set[int]]:
    """The run, and the pids of it and every process it started."""
    return run_tracked([sys.executable, *args], cwd=cwd, env=clean_env(FD_PLATFORM="cpu"), timeout=TIMEOUT)


def test_the_example_runs_from_any_folder_and_leaves_nothing_behind(tmp_path: Path) -> None:
    before = shm_entries()
    done, pids = run_python(str(EXAMPLE), cwd=tmp_path)
    assert done.returncode == 0, f"rc={done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"platform cpu: \d+ blocks of 6 MiB, 2 host swap blocks", lines[0]), lines
    for cycle, (ours, theirs) in enumerate(((101.0, 7.0), (102.0, 14.0)), 1):
        assert (
            f"cycle {cycle}: attached=True (deciding term num_cpu_blocks), 96 tensors, read {ours} written by "
            "the cache manager" in lines
        ), lines
        assert (
            f"cycle {cycle}: cleared; the cache manager (2 host swap blocks) read {theirs} written by the runner"
            in lines
        ), lines
    final = re.fullmatch(r"done: cache manager exited with 0, signal fd_cache_ready\.(\S+) removed: True", lines[-1])
    assert final, lines
    instance = final.group(1)
    assert not [name for name in shm_entries() if instance in name]
    assert not left_behind_by(pids, before)
