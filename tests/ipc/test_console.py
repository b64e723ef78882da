"""Progress and error lines of several processes sharing one stderr pipe never merge mid-line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from run_helpers import ROOT

WRITER = textwrap.dedent(
    """
    import sys
    from fd_platforms.lifecycle.progress import Progress
    say = Progress(quiet=False, prefix=f"rank {sys.argv[1]}: ")
    for index in range(3000):
        say(f"line {index} of a message long enough to be interleaved with the other process's lines")
    """
)


def test_lines_of_two_unbuffered_processes_on_one_pipe_stay_whole() -> None:
    """Unbuffered stderr (PYTHONUNBUFFERED, python -u) made print() two writes, so lines merged."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    read, write = os.pipe()
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(rank)], stderr=write, cwd=ROOT, env=env) for rank in (0, 1)
    ]
    os.close(write)
    with os.fdopen(read) as stream:
        lines = stream.read().splitlines()
    assert all(writer.wait(60) == 0 for writer in writers)
    assert len(lines) == 6000
    for line in lines:
        assert line.startswith(("fd-platforms: rank 0: line ", "fd-platforms: rank 1: line ")), line
        assert line.count("fd-platforms:") == 1 and line.endswith("with the other process's lines"), line
