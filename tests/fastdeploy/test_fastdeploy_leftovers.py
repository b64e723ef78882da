"""What a SIGKILLed run beside FastDeploy leaves, and what the next run's engine sweeps when it creates its signals:
a dead run's own, never one a living process holds, one of the wrong size, FastDeploy's own or another user's."""

from __future__ import annotations

import fcntl
import os
import secrets
from collections.abc import Iterator

import pytest

from fd_platforms.fastdeploy.protocol import FASTDEPLOY

OTHER_UID = 65534  # nobody
RUN_SIGNALS = (
    "cache_ready_signal",
    "swap_space_ready_signal",
    "cache_transfer_inited_signal",
    "kv_cache_status",
    "get_profile_block_num",
)


def make(name: str, size: int, *, uid: int | None = None) -> int:
    """A signal file as a dead run leaves it (no lock held); its descriptor, for a test that holds it."""
    fd = os.open(f"/dev/shm/{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)
    if uid is not None:
        os.fchown(fd, uid, uid)
    return fd


@pytest.fixture
def leftovers() -> Iterator[dict[str, list[str]]]:
    """Signal files under run suffixes: a dead run's five, one a living process holds, one of the wrong
    size, another user's (where root), and one under a FastDeploy engine's own suffix."""

    def suffix() -> str:
        return f"fdp{secrets.randbelow(10**9)}-{secrets.token_hex(3)}"

    dead = suffix()
    files = {"dead": [f"{signal}.{dead}" for signal in RUN_SIGNALS]}
    fds = [make(name, 4 if name.startswith("kv_cache_status.") else 8) for name in files["dead"]]
    files["kept"] = [f"cache_ready_signal.{suffix()}", f"kv_cache_status.{suffix()}", f"kv_cache_status.t{dead}"]
    held = make(files["kept"][0], 8)
    fcntl.flock(held, fcntl.LOCK_SH)  # a living run's engine holds its signals so
    fds += [held, make(files["kept"][1], 8), make(files["kept"][2], 4)]
    if os.geteuid() == 0:  # else test_another_users_leftover_is_never_swept says why it skips
        files["kept"].append(f"kv_cache_status.{suffix()}")
        fds.append(make(files["kept"][-1], 4, uid=OTHER_UID))
    for fd in fds:
        if fd != held:
            os.close(fd)
    try:
        yield files
    finally:
        os.close(held)
        for name in files["dead"] + files["kept"]:
            if os.path.exists(f"/dev/shm/{name}"):
                os.unlink(f"/dev/shm/{name}")


def test_the_engines_signal_creation_sweeps_only_what_dead_runs_of_ours_left(leftovers: dict[str, list[str]]) -> None:
    _suffix, made = FASTDEPLOY.create_signals(1, device_type="cpu", block_count_suffix=None)
    made.close()
    assert [name for name in leftovers["dead"] if os.path.exists(f"/dev/shm/{name}")] == [], "a dead run's signals"
    assert [name for name in leftovers["kept"] if not os.path.exists(f"/dev/shm/{name}")] == [], (
        "held by a process, of the wrong size, under FastDeploy's own suffix, or another user's: never removed"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="playing another user's leftover needs root (fchown)")
def test_another_users_leftover_is_never_swept(leftovers: dict[str, list[str]]) -> None:
    theirs = leftovers["kept"][-1]
    assert os.stat(f"/dev/shm/{theirs}").st_uid == OTHER_UID
    FASTDEPLOY.create_signals(1, device_type="cpu", block_count_suffix=None)[1].close()
    assert os.path.exists(f"/dev/shm/{theirs}")
