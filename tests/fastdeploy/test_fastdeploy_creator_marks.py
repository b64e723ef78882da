"""A creator's mark of FastDeploy's records (``<first record>.fdp-creator``, :func:`make_creator_mark`): anyone may
create that name in ``/dev/shm`` first, so whatever is there and is no dead mark of ours is a CacheSharingError naming
the entry, its owner and the fix, never a raw ``FileExistsError``; a dead mark of ours is reclaimed."""

from __future__ import annotations

import os
import secrets
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fd_platforms.contract.errors import CacheSharingError
from fd_platforms.fastdeploy.marks import creator_mark_name, make_creator_mark

RECORD = b"r" * 16


@pytest.fixture
def first_record() -> Iterator[str]:
    name = f"key_caches_0_rank0.device0.fdp-test-{secrets.token_hex(4)}"
    yield name
    mark = Path("/dev/shm", creator_mark_name(name))
    if mark.is_dir() and not mark.is_symlink():
        mark.rmdir()
    elif mark.exists() or mark.is_symlink():
        mark.unlink()


def _empty(path: Path) -> None:
    path.touch()


def _pid_zero(path: Path) -> None:
    path.write_bytes(struct.pack("=qi", 0, 1) + RECORD)


def _directory(path: Path) -> None:
    path.mkdir()


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _symlink(path: Path) -> None:
    path.symlink_to("/nonexistent-fd-platforms-target")


@pytest.mark.parametrize(
    ("plant", "named"),
    [
        (_empty, "a file of 0 bytes"),
        (_pid_zero, "a file of"),
        (_directory, "a directory"),
        (_fifo, "a FIFO"),
        (_symlink, "a symbolic link"),
    ],
)
def test_a_planted_entry_is_a_cache_sharing_error_naming_it_and_its_owner(
    first_record: str, plant: Callable[[Path], None], named: str
) -> None:
    path = Path("/dev/shm", creator_mark_name(first_record))
    plant(path)
    with pytest.raises(CacheSharingError) as caught:
        make_creator_mark(first_record, RECORD)
    message = str(caught.value)
    assert f"/dev/shm/{path.name} exists ({named}" in message and f"uid {os.geteuid()}" in message
    assert "Fix: if no engine uses this rank's records, remove" in message
    assert path.exists() or path.is_symlink(), "what is not provably ours and dead stays"


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's entry needs root here")
def test_another_users_entry_is_named_as_such(first_record: str) -> None:
    path = Path("/dev/shm", creator_mark_name(first_record))
    path.touch()
    os.chown(path, 65534, 65534)
    with pytest.raises(CacheSharingError, match=r"of uid 65534 \(another user\)"):
        make_creator_mark(first_record, RECORD)


def test_a_living_creators_mark_is_refused_and_a_dead_one_of_ours_is_reclaimed(first_record: str) -> None:
    code = (
        "import sys; from fd_platforms.fastdeploy.marks import make_creator_mark; "
        f"m = make_creator_mark({first_record!r}, {RECORD!r}); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(CacheSharingError, match="a living process holds it"):
            make_creator_mark(first_record, RECORD)
    finally:
        holder.communicate("", timeout=30)
    with make_creator_mark(first_record, RECORD) as mark:  # its creator is gone: the mark is reclaimed
        assert mark.read(8) == struct.pack("=q", os.getpid())
