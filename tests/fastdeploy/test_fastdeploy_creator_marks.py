"""A creator's mark of FastDeploy's records (``<first record>.fdp-creator.<pid>-<hex>``, :func:`make_creator_mark`):
anyone may create any free name in ``/dev/shm``, so no mark has a fixed name; whatever is planted under the prefix
and is no mark of this user's stops no creator and stays where it is; a dead mark of ours is reclaimed; a living
creator of ours is a CacheSharingError naming its mark."""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fd_platforms.contract.errors import CacheSharingError
from fd_platforms.fastdeploy.marks import creator_attachers, creator_prefix, make_creator_mark, stale_creator

RECORD = b"r" * 16
NOBODY = 65534


@pytest.fixture
def first_record() -> Iterator[str]:
    name = f"key_caches_0_rank0.device0.fdp-test-{secrets.token_hex(4)}"
    yield name
    for path in map(Path, glob.glob(f"/dev/shm/{glob.escape(creator_prefix(name))}*")):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _empty(path: Path) -> None:
    path.touch()


def _pid_zero(path: Path) -> None:
    path.write_bytes(struct.pack("=qq", 0, 1) + RECORD)


def _directory(path: Path) -> None:
    path.mkdir()


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _symlink(path: Path) -> None:
    path.symlink_to("/nonexistent-fd-platforms-target")


@pytest.mark.parametrize("plant", [_empty, _pid_zero, _directory, _fifo, _symlink])
def test_a_planted_entry_stops_no_creator_and_stays(first_record: str, plant: Callable[[Path], None]) -> None:
    path = Path("/dev/shm", f"{creator_prefix(first_record)}{os.getpid()}-planted")
    plant(path)
    with make_creator_mark(first_record, RECORD, 2) as mark:
        assert mark.name.startswith(creator_prefix(first_record)) and mark.name != path.name
        assert creator_attachers(first_record) == 2, "readers find the real mark beside the planted entry"
    assert path.exists() or path.is_symlink(), "what is not provably ours and dead stays"


@pytest.mark.skipif(os.geteuid() != 0, reason="planting as another user needs root (setuid) here")
def test_another_user_planting_names_first_stops_no_creator(first_record: str) -> None:
    """Another uid (nobody, 65534) creates names under the prefix, as any user may in /dev/shm, and a mark-like
    file holding this process's pid and the record: our creator passes over them and leaves them."""
    planted = [f"/dev/shm/{creator_prefix(first_record)}{os.getpid()}-{n}" for n in ("0", "ffffffffffffffff")]
    content = struct.pack("=qq", os.getpid(), 1) + RECORD
    child = os.fork()
    if child == 0:  # only system calls here: the forked copy of a threaded process must not take Python's locks
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            for path in planted:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                os.write(fd, content)
                os.close(fd)
        finally:
            os._exit(0)
    assert os.waitpid(child, 0)[1] == 0
    assert all(os.stat(path).st_uid == NOBODY for path in planted)
    assert stale_creator(first_record, RECORD) is None, "another user's file never proves the records stale"
    with make_creator_mark(first_record, RECORD, 1):
        assert creator_attachers(first_record) == 1
    assert all(os.path.exists(path) for path in planted), "another user's entries are not ours to remove"


def test_a_living_creators_mark_is_refused_and_a_dead_one_of_ours_is_reclaimed(first_record: str) -> None:
    code = (
        "import sys; from fd_platforms.fastdeploy.marks import make_creator_mark; "
        f"m = make_creator_mark({first_record!r}, {RECORD!r}); print(m.name, flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        held = holder.stdout.readline().strip()
        with pytest.raises(CacheSharingError, match=rf"/dev/shm/{held} is another creator's mark.*a living process"):
            make_creator_mark(first_record, RECORD)
    finally:
        holder.communicate("", timeout=30)
    assert os.path.exists(f"/dev/shm/{held}"), "its holder exited without clearing: the mark is left, unheld"
    with make_creator_mark(first_record, RECORD) as mark:  # its creator is gone: the mark is reclaimed
        assert mark.read(8) == struct.pack("=q", os.getpid())
        assert not os.path.exists(f"/dev/shm/{held}")


def test_an_unheld_mark_of_ours_holding_the_records_bytes_proves_them_stale(first_record: str) -> None:
    mark = make_creator_mark(first_record, RECORD)
    mark.close()  # as a SIGKILLed creator leaves it
    assert creator_attachers(first_record) is None, "no living creator"
    assert stale_creator(first_record, RECORD + b"x") is None, "other bytes: rewritten since, no proof"
    assert stale_creator(first_record, RECORD) == os.getpid()
    assert not os.path.exists(f"/dev/shm/{mark.name}")
