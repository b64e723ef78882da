"""``fd-platforms run --cycles`` when a process stops, dies or is held from outside between clear and re-create:
the run fails within its ``--timeout`` plus the margin, names the process and how it ended, and leaves nothing
in ``/dev/shm`` but what an outside process still holds, which it names."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from conftest import shm_entries
from run_helpers import QWEN, started

from fd_platforms.engine.publication import reclaim_stale_publications
from fd_platforms.ipc import shm

pytestmark = pytest.mark.slow  # multi-process, fault or benchmark-smoke: left out of -m "not slow"


def test_a_rank_stopped_during_cycles_fails_the_run_within_twice_the_timeout_and_leaves_nothing() -> None:
    timeout = 20  # the margin is min(30 s, --timeout); the stopped child is continued with its SIGTERM, so stopping it
    # adds nothing. Starting the workers (spawn, import paddle) is inside the first phase's --timeout too: 10 s was too
    # few beside another full run (load 6: its workers' warm import of Paddle took longer, 1 run in 4)
    with started(
        "--model",
        QWEN,
        "--tp",
        "2",
        "--device-memory",
        "256MiB",
        "--role",
        "decode",
        "--cycles",
        "100000",
        "--timeout",
        str(timeout),
    ) as run:
        found = run.read_until(
            r"started 2 worker\(s\) \(pid (\d+), (\d+)\), engine instance (\S+) \(its cache-ready signal\)"
        )
        run.read_until(r"cycle 1: cleared")
        stopped_at = time.monotonic()
        os.kill(int(found.group(1)), signal.SIGSTOP)
        code, stderr = run.finish()
        elapsed = time.monotonic() - stopped_at
    assert code == 1 and "rank 0: sent no" in stderr.splitlines()[-1], stderr
    assert elapsed < 2 * timeout + 10, f"{elapsed:.1f} s"  # 10 s for a busy machine
    instance = found.group(3).removeprefix("fd_cache_ready.")
    assert not {name for name in shm_entries() if instance in name}, "the run's signal and publications are gone"


def test_a_manager_killed_after_ready_is_reported_and_its_run_leaves_nothing() -> None:
    with started(
        "--model",
        QWEN,
        "--tp",
        "2",
        "--device-memory",
        "256MiB",
        "--role",
        "decode",
        "--cycles",
        "100000",
        "--timeout",
        "30",
    ) as run:
        signal_name = run.read_until(r"engine instance (\S+) \(its cache-ready signal\)").group(1)
        manager = int(run.read_until(r"starting the cache manager \(pid (\d+)\)").group(1))
        run.read_until(r"cycle 1: cleared")
        os.kill(manager, signal.SIGKILL)
        code, stderr = run.finish()
    assert code == 1, stderr
    assert re.search(rf"cache manager: pid {manager} was killed by SIGKILL before sending its '\w+'", stderr), stderr
    instance = signal_name.removeprefix("fd_cache_ready.")
    assert not {name for name in shm_entries() if instance in name}


def held_when_published(path: Path, seconds: float = 30.0) -> shm.Segment:
    """``path`` held (open, with a shared flock) once it is published: a run cycling clear/re-create unpublishes it
    for a moment each cycle (the fault loop caught an open landing in that moment), and may unlink the file opened
    before the lock was had, which :meth:`shm.Segment.open` refuses as removed."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return shm.Segment.open(path.name)
        except FileNotFoundError:
            assert time.monotonic() < deadline, f"{path} was not published again within {seconds:g} s"
            time.sleep(0.001)


def test_a_publication_held_from_outside_the_run_is_named_when_the_run_ends() -> None:
    with started(
        "--model",
        QWEN,
        "--tp",
        "1",
        "--device-memory",
        "256MiB",
        "--role",
        "decode",
        "--cycles",
        "100000",
        "--timeout",
        "30",
    ) as run:
        instance = run.read_until(r"engine instance fd_cache_ready\.(\S+) \(its cache-ready signal\)").group(1)
        manager = int(run.read_until(r"starting the cache manager \(pid (\d+)\)").group(1))
        run.read_until(r"cycle 1: cleared")
        path = Path("/dev/shm") / f"fd_kv_cache.{instance}.rank0"
        with held_when_published(path):  # a process outside the run holds the publication
            os.kill(manager, signal.SIGKILL)  # its creator dies without its clean-up
            code, stderr = run.finish()
            assert code == 1, stderr
            assert f"left /dev/shm/{path.name} in place: every process of this engine has ended" in stderr
            assert path.exists()
        reclaimed = reclaim_stale_publications()  # let go: the next run's sweep removes it
        assert path.name in reclaimed or not path.exists()  # (or a run beside this suite swept it first)
