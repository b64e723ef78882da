"""FastDeploy's clear/update driven from our side (``fd_platforms.fastdeploy.cache_status``: ``drive_kv_cache_update``,
and its two halves ``drive_kv_cache_clear`` and ``drive_kv_cache_restore``): one driver at a time; a failed drive
leaves ``kv_cache_status`` where the next drive can start, or saying the caches may be freed; every argument is
checked before any word is written."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Iterator

import pytest
from signal_processes import drive_and_report
from warm_processes import warm

from fd_platforms.contract.errors import CacheSignalError, CacheUpdateError, ConfigError, SignalWaitError
from fd_platforms.fastdeploy import cache_status, drive_kv_cache_clear, drive_kv_cache_restore
from fd_platforms.fastdeploy.cache_status import drive_kv_cache_update
from fd_platforms.fastdeploy.protocol import FASTDEPLOY
from fd_platforms.fastdeploy.signals import CACHE_READY, KV_CACHE_STATUS, FastDeploySignal, KVCacheStatus

DRIVE_FAILED = -30000  # fd-platforms' failure word: a drive failed after a rank let go (cache_status.FaultKind)


@pytest.fixture
def suffix() -> Iterator[str]:
    """A run's signals for one local rank; its slot is 0 (nobody attached), the status NORMAL."""
    name, made = FASTDEPLOY.create_signals(1, device_type="cpu", block_count_suffix=None)
    with made:
        yield name


@pytest.mark.slow
def test_two_drivers_started_together_one_drives_and_the_other_is_told_at_once_who_holds_it(suffix: str) -> None:
    """No creator answers, so the driver that got the word waits its whole timeout; the other is refused at once."""
    links = [warm.Pipe(duplex=False) for _ in range(2)]
    start = time.time() + 2.0  # both import first, then call together
    drivers = [warm.Process(target=drive_and_report, args=(suffix, 1.5, start, sender)) for _, sender in links]
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
    assert (
        f"kv_cache_status.{suffix} (/dev/shm/kv_cache_status.{suffix}) is being driven by another "
        f"drive_kv_cache_update, pid {winner_pid} (as this PID namespace sees it)"
    ) in loser_says


@pytest.mark.slow
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
        assert status.get(0) == DRIVE_FAILED, "rank 0 let go and no creator answered: its cache may be freed"
        ready.close()


# -- the two halves: clear and restore, callable separately --


def test_a_restore_without_a_clear_done_is_refused_before_writing_anything(suffix: str) -> None:
    with pytest.raises(ConfigError, match=r"kv_cache_status='NORMAL' is not valid; allowed: CLEARED \(a clear done\)"):
        drive_kv_cache_restore(suffix, timeout=0.5)
    with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
        assert status.get(0) == KVCacheStatus.NORMAL


def test_a_clear_that_fails_before_any_rank_let_go_writes_normal_back_and_says_so(suffix: str) -> None:
    with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
        ready = FastDeploySignal.attach(CACHE_READY, suffix)
        ready.set(0, 1)  # rank 0 attached, and never lets go: nothing is freed
        with pytest.raises(SignalWaitError, match="rank 0 letting go of its KV cache") as caught:
            drive_kv_cache_clear(suffix, timeout=0.1)
        assert "was written back to NORMAL (it said CLEARING): every rank's cache is there" in str(caught.value)
        assert status.get(0) == KVCacheStatus.NORMAL
        ready.set(0, 0)
        ready.close()


class _NoNotes(OSError):
    """An error as Python 3.10 (which fd-platforms supports) makes them: without ``add_note`` (PEP 678, 3.11)."""

    def __getattribute__(self, name: str) -> object:
        if name == "add_note":
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_a_drive_failing_on_python_3_10_raises_its_own_error_and_logs_what_the_word_was_left_at(
    suffix: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failure = _NoNotes(5, "Input/output error")

    def clear_fails(*_: object) -> tuple[float, float]:
        raise failure

    monkeypatch.setattr(cache_status, "_clear", clear_fails)
    with caplog.at_level(logging.WARNING), pytest.raises(_NoNotes) as caught:  # not an AttributeError for add_note
        drive_kv_cache_clear(suffix, timeout=0.3)
    assert caught.value is failure
    assert f"drive_kv_cache_update failed (_NoNotes): kv_cache_status.{suffix} was left at" in caplog.text


@pytest.mark.slow
def test_a_failed_restore_leaves_a_word_saying_the_caches_are_freed_and_the_next_drive_names_it(suffix: str) -> None:
    """With the caches freed and no creator left to make them again, NORMAL would say they are there: the word
    says they may be freed, and the next clear is refused naming it."""
    with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
        status.set(0, KVCacheStatus.CLEARED)  # as a creator answers a clear; the slot 0: the cache freed
        with pytest.raises(SignalWaitError, match="the cache creator creating the caches") as caught:
            drive_kv_cache_restore(suffix, timeout=0.3)
        assert status.get(0) == DRIVE_FAILED, "not NORMAL: the caches are freed"
        assert f"was left at {DRIVE_FAILED} (fd-platforms' failure word" in str(caught.value)
        assert "(it said UPDATING), not NORMAL" in str(caught.value)
        with pytest.raises(CacheUpdateError) as refused:
            drive_kv_cache_clear(suffix, timeout=0.3)
        said = str(refused.value)
        assert refused.value.word == DRIVE_FAILED and "the last clear/update failed after the caches were freed" in said
        assert "the caches may be freed" in said and "Fix: run drive_kv_cache_restore" in said
        assert status.get(0) == DRIVE_FAILED, "nothing written"
        with pytest.raises(SignalWaitError, match="the cache creator creating the caches"):
            drive_kv_cache_restore(suffix, timeout=0.3)  # a restore starts from it (no creator answers here)


def test_a_second_restore_while_one_runs_is_told_who_holds_the_word(suffix: str) -> None:
    """Each half claims kv_cache_status while it runs; the word's value between halves says which may come next."""
    with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
        assert status.claim() is None  # another driver holds it (this process, through another descriptor)
        status.set(0, KVCacheStatus.CLEARED)
        with pytest.raises(CacheSignalError, match="is being driven by another drive_kv_cache_update"):
            drive_kv_cache_restore(suffix, timeout=0.3)
        assert status.get(0) == KVCacheStatus.CLEARED, "nothing written"
        status.set(0, KVCacheStatus.NORMAL)


# -- every argument checked before any word is written --


def test_the_drive_checks_its_arguments_before_touching_a_signal() -> None:
    """No signal of suffix 9923 exists here: a check that came after the attach would be a CacheSignalError."""
    with pytest.raises(ConfigError) as caught:
        drive_kv_cache_update("9923", update="reload", timeout=1)
    assert caught.value.field == "update"
    with pytest.raises(ConfigError, match="creator_pid"):
        drive_kv_cache_update("9923", creator_pid=-1, timeout=1)
    with pytest.raises(ConfigError, match="attacher_pids"):
        drive_kv_cache_update("9923", attacher_pids={0: "x"}, timeout=1)


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Every signal word written in this process from now on: (signal, index, value)."""
    written: list[tuple[str, int, int]] = []
    original = FastDeploySignal.set

    def recorded(self: FastDeploySignal, index: int, value: int) -> None:
        written.append((self.name, index, value))
        original(self, index, value)

    monkeypatch.setattr(FastDeploySignal, "set", recorded)
    return written


def pid_max() -> int:
    with open("/proc/sys/kernel/pid_max") as limit:
        return int(limit.read())


@pytest.mark.parametrize("creator_pid", [2**70, "pid_max + 1"])
def test_a_creator_pid_beyond_the_kernels_pid_range_is_refused_before_clearing_is_written(
    suffix: str, writes: list[tuple[str, int, int]], creator_pid: object
) -> None:
    pid = pid_max() + 1 if creator_pid == "pid_max + 1" else creator_pid
    with pytest.raises(ConfigError) as caught:
        drive_kv_cache_update(suffix, creator_pid=pid, timeout=0.3)  # type: ignore[arg-type]
    said = str(caught.value)
    assert caught.value.field == "creator_pid" and f"from 1 to {pid_max()} (/proc/sys/kernel/pid_max)" in said, said
    assert "Fix: pass the cache manager's pid" in said and writes == []


@pytest.mark.parametrize(
    ("pids", "tp", "allowed"),
    [
        ({-1: 1}, None, "local ranks from 0 to 1023 (the most local ranks)"),
        ({99: 1}, 1, "local ranks from 0 to 0 (tp 1)"),
        ({0: 2**70}, None, "each to a process id from 1 to"),
        ({1: 1}, None, "local ranks from 0 to 0 (cache_ready_signal."),  # tp unknown: the signal's one word
    ],
    ids=["rank-minus-1", "rank-99-of-tp-1", "pid-2**70", "rank-1-of-a-one-word-signal"],
)
def test_attacher_pids_outside_the_local_ranks_are_refused_before_any_word_is_written(
    suffix: str, writes: list[tuple[str, int, int]], pids: dict[int, int], tp: int | None, allowed: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        drive_kv_cache_update(suffix, attacher_pids=pids, tp=tp, timeout=0.3)
    said = str(caught.value)
    assert caught.value.field == "attacher_pids" and allowed in said and "Fix: pass {local rank:" in said, said
    assert writes == []
    with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
        assert status.get(0) == KVCacheStatus.NORMAL
