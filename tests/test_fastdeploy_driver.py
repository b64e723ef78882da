"""drive_kv_cache_update on hostile ground: one driver at a time, and a failed drive leaves the word
where the next one can start (issue 34)."""

from __future__ import annotations

import logging
import multiprocessing
import subprocess
import time
from collections.abc import Iterator

import pytest

from fd_platforms.contract.errors import SignalWaitError
from fd_platforms.engine.cache_status import drive_kv_cache_update
from fd_platforms.engine.protocols.fastdeploy import FASTDEPLOY
from fd_platforms.ipc.fastdeploy_signals import CACHE_READY, KV_CACHE_STATUS, FastDeploySignal, KVCacheStatus
from signal_processes import drive_and_report


@pytest.fixture
def suffix() -> Iterator[str]:
    """A run's signals for one local rank; its slot is 0 (nobody attached), the status NORMAL."""
    name, made = FASTDEPLOY.create_signals(1, device_type="cpu", block_count_suffix=None)
    with made:
        yield name


@pytest.mark.slow
def test_two_drivers_started_together_one_drives_and_the_other_is_told_at_once_who_holds_it(suffix: str) -> None:
    """No creator answers, so the driver that got the word waits its whole timeout; the other is refused at once."""
    spawn = multiprocessing.get_context("spawn")
    links = [spawn.Pipe(duplex=False) for _ in range(2)]
    start = time.time() + 2.0  # both import first, then call together
    drivers = [spawn.Process(target=drive_and_report, args=(suffix, 1.5, start, sender)) for _, sender in links]
    for driver in drivers:
        driver.start()
    try:
        results = sorted((receiver.recv() for receiver, _ in links if receiver.poll(30)), key=lambda result: result[3])
    finally:
        for driver in drivers:
            driver.join(10)
    assert len(results) == 2, results
    (_, loser_kind, loser_says, loser_seconds), (winner_pid, winner_kind, _, winner_seconds) = results
    assert winner_kind == "SignalWaitError" and winner_seconds >= 1.4, results
    assert loser_kind == "CacheSignalError" and loser_seconds < 0.5, results
    assert (f"kv_cache_status.{suffix} (/dev/shm/kv_cache_status.{suffix}) is being driven by another "
            f"drive_kv_cache_update, pid {winner_pid} (as this PID namespace sees it)") in loser_says  # fmt: skip


def test_a_drive_that_finds_a_dead_attacher_names_it_and_leaves_the_word_where_the_next_drive_starts(
    suffix: str, caplog: pytest.LogCaptureFixture
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
        ready = FastDeploySignal.attach(CACHE_READY, suffix)
        ready.set(0, 1)  # rank 0's attacher is attached, and dies without letting go
        with caplog.at_level(logging.WARNING), pytest.raises(SignalWaitError) as caught:
            drive_kv_cache_update(suffix, attacher_pids={0: dead.pid}, timeout=5)
        assert caught.value.cause == "watched_exited" and f"(pid {dead.pid}) exited" in str(caught.value)
        written_back = f"kv_cache_status.{suffix} was written back to NORMAL (it said CLEARING)"
        assert written_back in str(caught.value)
        warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
        assert any(written_back in line for line in warned), warned
        assert status.get(0) == KVCacheStatus.NORMAL
        ready.set(0, 0)
        with pytest.raises(SignalWaitError, match="the cache creator freeing the caches"):
            drive_kv_cache_update(suffix, timeout=0.5)  # the next drive starts (no creator answers here)
        assert status.get(0) == KVCacheStatus.NORMAL
        ready.close()


# -- the two events (issue 35, item 7): clear and restore callable separately --


def test_a_restore_without_a_clear_done_is_refused_before_writing_anything(suffix: str) -> None:
    from fd_platforms.contract.errors import ConfigError
    from fd_platforms.engine import drive_kv_cache_restore

    with pytest.raises(ConfigError, match=r"kv_cache_status='NORMAL' is not valid; allowed: CLEARED \(a clear done\)"):
        drive_kv_cache_restore(suffix, timeout=0.5)
    with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
        assert status.get(0) == KVCacheStatus.NORMAL


def test_each_half_that_fails_writes_normal_back_and_says_so(suffix: str) -> None:
    from fd_platforms.engine import drive_kv_cache_clear, drive_kv_cache_restore

    with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
        with pytest.raises(SignalWaitError, match="the cache creator freeing the caches") as caught:
            drive_kv_cache_clear(suffix, timeout=0.3)  # nobody attached (slot 0), no creator answers
        assert "was written back to NORMAL (it said CLEARING)" in str(caught.value)
        assert status.get(0) == KVCacheStatus.NORMAL
        status.set(0, KVCacheStatus.CLEARED)  # as a creator answers a clear
        with pytest.raises(SignalWaitError, match="the cache creator creating the caches") as caught:
            drive_kv_cache_restore(suffix, timeout=0.3)
        assert "was written back to NORMAL (it said UPDATING)" in str(caught.value)
        assert status.get(0) == KVCacheStatus.NORMAL


def test_a_second_restore_while_one_runs_is_told_who_holds_the_word(suffix: str) -> None:
    """Each half claims kv_cache_status while it runs; the word's value between halves says which may come next."""
    from fd_platforms.contract.errors import CacheSignalError
    from fd_platforms.engine import drive_kv_cache_restore

    with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
        assert status.claim() is None  # another driver holds it (this process, through another descriptor)
        status.set(0, KVCacheStatus.CLEARED)
        with pytest.raises(CacheSignalError, match="is being driven by another drive_kv_cache_update"):
            drive_kv_cache_restore(suffix, timeout=0.3)
        assert status.get(0) == KVCacheStatus.CLEARED, "nothing written"
        status.set(0, KVCacheStatus.NORMAL)


@pytest.mark.usefixtures("fastdeploy_record_names")
def test_a_late_updating_over_the_managers_normal_is_answered_normal_again(suffix: str) -> None:
    """FastDeploy's workers each write kv_cache_status UPDATING on an update request
    (check_model_weights_status, fastdeploy/rl/dynamic_weight_manager.py); a slower rank's can land after the
    NORMAL our cache manager wrote. Holding every cache with every slot set, it answers NORMAL again instead of
    leaving FastDeploy's engine waiting for NORMAL."""
    import threading

    from engine_processes import qwen_layout

    from fd_platforms.engine import manage_kv_cache, serve_kv_cache_status
    from fd_platforms.loading.selection import select_platform

    cpu = select_platform({"FD_PLATFORM": "cpu"}).platform
    managed = manage_kv_cache(cpu, qwen_layout(0, 1, 6), 4, num_cpu_blocks=2, suffix=suffix,
                              protocol="fastdeploy", rule="2026-01")  # fmt: skip
    stop = threading.Event()
    served: list[object] = []
    server = threading.Thread(target=lambda: served.extend(
        serve_kv_cache_status([managed], lambda rank: managed, suffix=suffix, until=stop.is_set, timeout=5)))
    server.start()
    try:
        with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
            status.set(0, KVCacheStatus.UPDATING)  # the late worker's word, every slot set, every cache held
            deadline = time.monotonic() + 3
            while status.get(0) != KVCacheStatus.NORMAL and time.monotonic() < deadline:
                time.sleep(0.01)
            assert status.get(0) == KVCacheStatus.NORMAL
    finally:
        stop.set()
        server.join(10)
    assert served == [managed], "nothing cleared or created again"
    with FastDeploySignal.attach(CACHE_READY, suffix) as ready:
        ready.set(0, 0)  # its attacher lets go
    managed.clear(5, clear_host=True)
