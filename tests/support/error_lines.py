"""Reading a command's refusal: one line on stderr, exit code 2, no traceback, a fix."""

from __future__ import annotations

import subprocess


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one ``fd-platforms: error: ... Fix: ...`` line a refused command printed (exit code 2, no traceback)."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("fd-platforms: error: ") and "Fix:" in line, line
    return line
