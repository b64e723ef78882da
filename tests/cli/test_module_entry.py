"""``python -m fd_platforms`` is the command, and ``fd_platforms.__version__`` the installed distribution's."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata

import pytest

import fd_platforms


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_python_m_fd_platforms_is_the_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fd_platforms", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FD_PLATFORM": "cpu"},
    )
    assert done.returncode == 0, done.stderr
    assert '"cpu"' in done.stdout
    version = subprocess.run([sys.executable, "-m", "fd_platforms", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and metadata.version("fd-platforms") in version.stdout


def test_the_version_is_the_distributions_and_read_only_when_asked() -> None:
    assert fd_platforms.__version__ == metadata.version("fd-platforms")
    fresh = subprocess.run(
        [sys.executable, "-c", "import fd_platforms; print('__version__' in vars(fd_platforms))"],
        capture_output=True,
        text=True,
    )
    assert fresh.stdout.strip() == "False", "import fd_platforms reads no metadata"
