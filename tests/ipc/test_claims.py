"""One driver at a time (``fd_platforms.ipc.claims``): the kernel arbitrates the claim, and a loser is told
the claimer's pid even when it looks while the claimer is between its two locks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from fd_platforms.ipc import claims

# A claimer that stops after its first lock until the test writes a line: the window a loser may look in.
CLAIM_IN_TWO_STEPS = textwrap.dedent(
    """
    import os, sys
    from fd_platforms.ipc import claims
    first_lock = claims._lock
    def lock_then_wait(*args):
        taken = first_lock(*args)
        claims._lock = first_lock
        print("between", flush=True)
        sys.stdin.readline()
        return taken
    claims._lock = lock_then_wait
    fd = os.open(sys.argv[1], os.O_RDWR)
    print("claimed" if claims.try_claim(fd) else "refused", flush=True)
    sys.stdin.readline()  # hold the claim until the test closes stdin
    """
)


@pytest.fixture
def claimed_file(tmp_path: Path) -> Iterator[int]:
    """A descriptor of a file nobody claims yet."""
    path = tmp_path / "word"
    path.write_bytes(b"\0" * 8)
    fd = os.open(path, os.O_RDWR)
    yield fd
    os.close(fd)


def test_a_loser_looking_while_the_claimer_is_between_its_two_locks_is_refused_and_told_its_pid(
    claimed_file: int, tmp_path: Path
) -> None:
    """The CI failure of 2026-11-27: the loser found the claim taken but the pid not yet told."""
    claimer = subprocess.Popen(
        [sys.executable, "-c", CLAIM_IN_TWO_STEPS, str(tmp_path / "word")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert claimer.stdin is not None and claimer.stdout is not None
    try:
        assert claimer.stdout.readline() == "between\n"
        assert not claims.try_claim(claimed_file)
        assert claims.claimer(claimed_file) == f"pid {claimer.pid} (as this PID namespace sees it)"
        claimer.stdin.write("go on\n")
        claimer.stdin.flush()
        assert claimer.stdout.readline() == "claimed\n"
        assert not claims.try_claim(claimed_file)
        assert claims.claimer(claimed_file) == f"pid {claimer.pid} (as this PID namespace sees it)"
    finally:
        claimer.stdin.close()
        claimer.wait(10)
    assert claims.try_claim(claimed_file), "the claim goes with its claimer"


def test_two_claims_in_one_process_conflict_and_a_release_frees_the_claim(claimed_file: int, tmp_path: Path) -> None:
    other = os.open(tmp_path / "word", os.O_RDWR)
    try:
        assert claims.try_claim(claimed_file)
        assert not claims.try_claim(other)
        claims.release(claimed_file)
        assert claims.try_claim(other)
    finally:
        os.close(other)
