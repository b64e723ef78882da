"""The engine guide runs as written: ``examples/engine_runner.py`` end to end from another folder, and
every Python block of ``docs/engine-integration.md``, in order, as the one session the guide says they are."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import left_behind_by, run_tracked, shm_entries
from run_helpers import ROOT, clean_env

GUIDE = ROOT / "docs" / "engine-integration.md"
EXAMPLE = ROOT / "examples" / "engine_runner.py"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```[ \t]*$", re.S | re.M)
TIMEOUT = 120

pytestmark = [  # multi-process: left out of -m "not slow"
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("paddle") is None, reason="paddle is not installed"),
]

# Runs the blocks given as a JSON list, one after another in one namespace (the guide's session),
# each compiled under its own name so a traceback says which block and line failed.
SESSION = """
import json, sys
namespace = {"__name__": "__main__"}
for number, source in enumerate(json.load(open(sys.argv[1])), 1):
    exec(compile(source, f"<docs/engine-integration.md python block {number}>", "exec"), namespace)
    print(f"block {number} ran", flush=True)
"""


def python_blocks() -> list[str]:
    return PYTHON_BLOCK.findall(GUIDE.read_text(encoding="utf-8"))


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
        assert f"cycle {cycle}: attached=True (deciding term num_cpu_blocks), 96 tensors, read {ours} written by " \
               "the cache manager" in lines, lines
        assert f"cycle {cycle}: cleared; the cache manager (2 host swap blocks) read {theirs} written by the runner" \
               in lines, lines
    final = re.fullmatch(r"done: cache manager exited with 0, signal fd_cache_ready\.(\S+) removed: True", lines[-1])
    assert final, lines
    instance = final.group(1)
    assert not [name for name in shm_entries() if instance in name]
    assert not left_behind_by(pids, before)


@pytest.mark.usefixtures("fastdeploy_record_names")  # its FastDeploy section writes key_caches_0_rank0.device0, ...
def test_every_python_block_of_the_guide_runs_in_order(tmp_path: Path) -> None:
    blocks = python_blocks()
    text = GUIDE.read_text(encoding="utf-8")
    assert len(blocks) == text.count("```python") >= 5, "every ```python block is found (none skipped)"
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "session.py").write_text(SESSION)
    before = shm_entries()
    done, pids = run_python(str(tmp_path / "session.py"), str(tmp_path / "blocks.json"), cwd=ROOT)
    assert done.returncode == 0, f"rc={done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    ran = [line for line in done.stdout.splitlines() if re.fullmatch(r"block \d+ ran", line)]
    assert ran == [f"block {number} ran" for number in range(1, len(blocks) + 1)]
    assert not left_behind_by(pids, before)
