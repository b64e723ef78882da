"""Shared-memory segments: sized before mapping, never a SIGBUS, and only proven-ours inodes unlinked."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fd_platforms.ipc import shm


@pytest.fixture
def small_shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 1 MiB tmpfs standing in for a container's small /dev/shm (Docker's default is 64 MiB)."""
    mount = tmp_path / "shm"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root and CAP_SYS_ADMIN): {done.stderr.strip()}")
    monkeypatch.setattr(shm, "SHM_DIR", str(mount))
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_segment_larger_than_shm_is_refused_at_creation_naming_the_sizes(small_shm: Path) -> None:
    with pytest.raises(shm.ShmSpaceError) as info:
        shm.Segment.create("fd_test_big", 8 << 20)
    message = str(info.value)
    assert "cannot hold shared memory segment fd_test_big of 8388608 bytes" in message
    assert "bytes free" in message and "--shm-size" in message
    assert os.listdir(small_shm) == [], "a refused segment leaves nothing behind"


def test_a_segment_that_fits_is_reserved_and_mapped_whole(small_shm: Path) -> None:
    segment = shm.Segment.create("fd_test_fits", 256 << 10)
    try:
        mapped = segment.map()
        mapped[-1] = 7  # the last page is real memory: no SIGBUS
        assert os.stat(small_shm / "fd_test_fits").st_blocks * 512 >= 256 << 10, "pages reserved up front"
    finally:
        segment.unlink()
        segment.close()


def test_unlink_removes_only_the_inode_it_holds() -> None:
    name = f"fd_test_inode_{uuid.uuid4().hex[:8]}"
    segment = shm.Segment.create(name, 64)
    path = Path(shm.SHM_DIR, name)
    try:
        path.unlink()
        path.write_bytes(b"someone else's segment under the same name")
        assert segment.unlink() is False
        assert path.read_bytes() == b"someone else's segment under the same name"
    finally:
        segment.close()
        path.unlink(missing_ok=True)


def test_creating_a_taken_name_is_file_exists_and_leaves_it() -> None:
    name = f"fd_test_taken_{uuid.uuid4().hex[:8]}"
    first = shm.Segment.create(name, 64)
    try:
        with pytest.raises(FileExistsError):
            shm.Segment.create(name, 128)
        assert os.stat(shm.shm_path(name)).st_size == 64
    finally:
        first.unlink()
        first.close()


def test_a_segment_is_named_only_once_complete_and_a_creator_killed_before_leaves_nothing() -> None:
    """A creator killed while it sizes a segment (the sweep's and an outside holder's moment) leaves no name:
    a half-made entry under it would be neither recognisable nor ever proven dead."""
    name = f"fd_test_unfinished_{uuid.uuid4().hex[:8]}"
    stalled = (
        "import sys, time\n"
        "from fd_platforms.ipc import shm\n"
        "def stall(fd, name, size):\n"
        "    print('sizing', flush=True)\n"
        "    time.sleep(60)\n"
        "shm._reserve = stall\n"
        f"shm.Segment.create({name!r}, 64, b'header')\n"
    )
    creator = subprocess.Popen([sys.executable, "-c", stalled], stdout=subprocess.PIPE, text=True)
    try:
        assert creator.stdout is not None and creator.stdout.readline() == "sizing\n"
        assert not Path(shm.SHM_DIR, name).exists(), "named before it was complete"
    finally:
        creator.kill()
        creator.wait()
    assert not Path(shm.SHM_DIR, name).exists()
    with shm.Segment.create(name, 64, b"header") as segment:
        try:
            assert Path(shm.SHM_DIR, name).read_bytes() == b"header" + bytes(58)
        finally:
            segment.unlink()


def test_a_held_segment_is_used_and_a_released_one_unused() -> None:
    name = f"fd_test_held_{uuid.uuid4().hex[:8]}"
    holder = shm.Segment.create(name, 64)
    probe = shm.Segment.inspect(name)
    try:
        assert not probe.unused(), "this process holds it through another open file"
        holder.close()
        assert probe.unused()
        assert probe.unlink()
    finally:
        probe.close()
        holder.close()


def test_an_open_that_waits_out_a_probe_which_removes_the_segment_is_file_not_found() -> None:
    """A remover unlinks while it holds the segment exclusively (a creator's probe before it frees). An open
    that opened the file before and waited for its shared lock would get it on the removed inode: an attach
    nobody will wait for. It is FileNotFoundError, as when the segment is gone before the open."""
    name = f"fd_test_probed_{uuid.uuid4().hex[:8]}"
    shm.Segment.create(name, 64).close()
    probe = shm.Segment.inspect(name)
    outcome: list[object] = []

    def attach() -> None:
        try:
            outcome.append(shm.Segment.open(name))
        except OSError as exc:
            outcome.append(exc)

    try:
        assert probe.unused(), "nobody holds it: the probe holds it exclusively"
        opener = threading.Thread(target=attach)
        opener.start()
        deadline = time.monotonic() + 10
        while open_descriptors(shm.shm_path(name)) < 2:  # the opener has it open, and waits for its lock
            assert time.monotonic() < deadline, "the opener never opened the segment"
            time.sleep(0.001)
        assert probe.unlink()
    finally:
        probe.close()
    opener.join(10)
    [result] = outcome
    if isinstance(result, shm.Segment):
        result.close()
    assert isinstance(result, FileNotFoundError), result


def open_descriptors(path: str) -> int:
    """How many of this process's descriptors are open on ``path``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == path
        except OSError:
            continue
    return count


@pytest.mark.slow
def test_flock_holders_are_the_processes_the_kernel_lists_as_holding_a_segment() -> None:
    name = f"fd_test_holders_{uuid.uuid4().hex[:8]}"
    segment = shm.Segment.create(name, 8)
    try:
        holder = subprocess.Popen(
            [
                "python3",
                "-c",
                (
                    f"import fcntl, sys; f = open('/dev/shm/{name}'); fcntl.flock(f, fcntl.LOCK_SH); "
                    "print('held', flush=True); sys.stdin.read()"
                ),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout.readline().strip() == "held"  # type: ignore[union-attr]
        assert shm.flock_holders(segment.inode) == {os.getpid(), holder.pid}
        holder.stdin.close()  # type: ignore[union-attr]
        holder.wait(10)
        assert shm.flock_holders(segment.inode) == {os.getpid()}
    finally:
        segment.unlink()
        segment.close()
    assert shm.flock_holders(segment.inode) == set()
