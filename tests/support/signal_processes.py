"""Bodies of the processes the cache-signal tests spawn (importable by spawned children)."""

from __future__ import annotations

import os
import time
from multiprocessing.connection import Connection

from fd_platforms.contract.errors import CacheNotReadyError
from fd_platforms.ipc.cache_signal import CacheReadySignal


def wait_and_report(name: str, rank: int, timeout: float, creator_pid: int | None, results: Connection) -> None:
    """Attach, wait on ``rank`` and send back ``(rank, "ready", seconds)`` or ``(rank, cause, message)``."""
    with CacheReadySignal.attach(name) as signal:
        try:
            waited = signal.wait(rank, timeout=timeout, creator_pid=creator_pid)
        except CacheNotReadyError as error:
            results.send((rank, error.cause, str(error)))
        else:
            results.send((rank, "ready", waited))


def set_ranks(name: str, ranks: list[int], delay: float) -> None:
    """Attach, then set each of ``ranks`` after ``delay`` seconds, like a cache manager."""
    with CacheReadySignal.attach(name) as signal:
        for rank in ranks:
            time.sleep(delay)
            signal.set(rank)


def sleep_forever() -> None:
    """A cache manager that never sets anything (the tests kill it)."""
    while True:
        time.sleep(60)


def create_and_report(num_ranks: int, results: Connection) -> None:
    """An engine: create a signal under a fresh name, report the name, hold it until told to stop."""
    with CacheReadySignal.create(num_ranks) as signal:
        signal.set(0)
        results.send(signal.name)
        results.recv()


def drive_and_report(suffix: str, timeout: float, start: float, results: Connection) -> None:
    """At ``start`` (``time.time()``), drive one FastDeploy clear/update on ``suffix``; send back
    ``(pid, error class or "ok", message, seconds)``."""
    from fd_platforms.fastdeploy.cache_status import drive_kv_cache_update

    time.sleep(max(0.0, start - time.time()))
    began = time.monotonic()
    try:
        drive_kv_cache_update(suffix, timeout=timeout)
    except Exception as error:  # noqa: BLE001 - reported to the test
        results.send((os.getpid(), type(error).__name__, str(error), time.monotonic() - began))
    else:
        results.send((os.getpid(), "ok", "", time.monotonic() - began))
