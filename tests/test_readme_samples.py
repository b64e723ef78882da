"""The README's engine API sample runs as written (from the repository root, as a reader would)."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import shm_entries
from run_helpers import ROOT


def readme_block(heading: str) -> str:
    """The first python block under ``heading`` in the README."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading) :]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, f"no python block under {heading!r}"
    return found.group(1)


def test_the_engine_api_sample_runs() -> None:
    before = shm_entries()
    code = readme_block("## The engine API")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert shm_entries() <= before, "the sample leaves nothing in /dev/shm"
