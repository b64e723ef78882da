"""Paddle imported by the core (``fd_platforms.contract.paddle_import``) prints none of its own import warnings
("No ccache found") to the user: checked in fresh interpreters, where Paddle is imported for the first time."""

from __future__ import annotations

import subprocess
import sys

import pytest
from run_helpers import ROOT


@pytest.mark.slow  # a fresh interpreter importing Paddle (run --nnodes's workers: tests/lifecycle/test_multinode.py)
def test_paddle_imported_by_the_core_prints_no_ccache_warning() -> None:
    argv = ["-c", "import fd_platforms\nfd_platforms.current_platform().host_alloc(4096).paddle()"]
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "No ccache found" not in done.stdout + done.stderr
