"""drive_kv_cache_update on hostile ground: one driver at a time, and a failed drive leaves the word
where the next one can start (issue 34), or saying the caches are freed where they may be (issue 41);
its arguments are checked before any word is written; serve_kv_cache_status survives a failed rank."""

from __future__ import annotations

import logging
import multiprocessing
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from fd_platforms.contract.errors import SignalWaitError
from fd_platforms.fastdeploy.cache_status import drive_kv_cache_update
from fd_platforms.fastdeploy.protocol import FASTDEPLOY
from fd_platforms.fastdeploy.signals import CACHE_READY, KV_CACHE_STATUS, FastDeploySignal, KVCacheStatus
from signal_processes import drive_and_report

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
        assert status.get(0) == DRIVE_FAILED, "rank 0 let go and no creator answered: its cache may be freed"
        ready.close()


# -- the two events (issue 35, item 7): clear and restore callable separately --


def test_a_restore_without_a_clear_done_is_refused_before_writing_anything(suffix: str) -> None:
    from fd_platforms.contract.errors import ConfigError
    from fd_platforms.fastdeploy import drive_kv_cache_restore

    with pytest.raises(ConfigError, match=r"kv_cache_status='NORMAL' is not valid; allowed: CLEARED \(a clear done\)"):
        drive_kv_cache_restore(suffix, timeout=0.5)
    with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
        assert status.get(0) == KVCacheStatus.NORMAL


def test_a_clear_that_fails_before_any_rank_let_go_writes_normal_back_and_says_so(suffix: str) -> None:
    from fd_platforms.fastdeploy import drive_kv_cache_clear

    with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
        ready = FastDeploySignal.attach(CACHE_READY, suffix)
        ready.set(0, 1)  # rank 0 attached, and never lets go: nothing is freed
        with pytest.raises(SignalWaitError, match="rank 0 letting go of its KV cache") as caught:
            drive_kv_cache_clear(suffix, timeout=0.3)
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
    from fd_platforms.fastdeploy import cache_status, drive_kv_cache_clear

    failure = _NoNotes(5, "Input/output error")

    def clear_fails(*_: object) -> tuple[float, float]:
        raise failure

    monkeypatch.setattr(cache_status, "_clear", clear_fails)
    with caplog.at_level(logging.WARNING), pytest.raises(_NoNotes) as caught:  # not an AttributeError for add_note
        drive_kv_cache_clear(suffix, timeout=0.3)
    assert caught.value is failure
    assert f"drive_kv_cache_update failed (_NoNotes): kv_cache_status.{suffix} was left at" in caplog.text


def test_a_failed_restore_leaves_a_word_saying_the_caches_are_freed_and_the_next_drive_names_it(suffix: str) -> None:
    """Finding 5a (issue 41): with the caches freed and no creator left, a failed restore wrote NORMAL back."""
    from fd_platforms.contract.errors import CacheUpdateError
    from fd_platforms.fastdeploy import drive_kv_cache_clear, drive_kv_cache_restore

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
    from fd_platforms.contract.errors import CacheSignalError
    from fd_platforms.fastdeploy import drive_kv_cache_restore

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

    from fd_platforms.engine import manage_kv_cache

    from fd_platforms.fastdeploy import serve_kv_cache_status
    from fd_platforms.loading.selection import select_platform

    cpu = select_platform({"FD_PLATFORM": "cpu"}).platform
    managed = manage_kv_cache(cpu, qwen_layout(0, 1, 6), 4, num_cpu_blocks=2, instance=suffix,
                              protocol="fastdeploy", rule="2026-01")  # fmt: skip
    stop = threading.Event()
    served: list[object] = []
    server = threading.Thread(target=lambda: served.extend(
        serve_kv_cache_status([managed], lambda rank: managed, instance=suffix, until=stop.is_set, timeout=5)))
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


# -- a drive's process ids and ranks checked before any word is written (issue 41, finding 8) --


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
    from fd_platforms.contract.errors import ConfigError

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
    from fd_platforms.contract.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        drive_kv_cache_update(suffix, attacher_pids=pids, tp=tp, timeout=0.3)
    said = str(caught.value)
    assert caught.value.field == "attacher_pids" and allowed in said and "Fix: pass {local rank:" in said, said
    assert writes == []
    with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
        assert status.get(0) == KVCacheStatus.NORMAL


# -- serve_kv_cache_status survives a failed rank (issue 41, finding 4) --


@pytest.fixture
def two_ranks() -> Iterator[str]:
    """A run's signals for two local ranks; the status NORMAL."""
    name, made = FASTDEPLOY.create_signals(2, device_type="cpu", block_count_suffix=None)
    with made:
        yield name


class Served:
    """Both ranks' caches made by our cache manager, served in a thread of this process; attachers played by
    a thread that resets the slots of ``letting_go`` (as KVCache.clear does) at the first CLEARING after each
    :meth:`drive` starts."""

    def __init__(self, suffix: str, recreate_fails: dict[int, BaseException], timeout: float) -> None:
        from fd_platforms.engine import manage_kv_cache
        from fd_platforms.fastdeploy import serve_kv_cache_status
        from fd_platforms.loading.selection import select_platform
        from engine_processes import qwen_layout

        self.suffix, self.letting_go, self.failures = suffix, {0, 1}, []  # type: ignore[var-annotated]
        cpu = select_platform({"FD_PLATFORM": "cpu"}).platform
        self.made: dict[int, object] = {}

        def make(rank: int) -> object:
            if rank in self.made and rank in recreate_fails:
                raise recreate_fails.pop(rank)
            kept = self.made[rank].host_cache if rank in self.made else None  # type: ignore[attr-defined]
            self.made[rank] = manage_kv_cache(cpu, qwen_layout(rank, 2), 4, num_cpu_blocks=2, instance=suffix,
                                              protocol="fastdeploy", rule="2026-01", host_cache=kept)  # fmt: skip
            return self.made[rank]

        first = [make(rank) for rank in range(2)]
        self.stop, self.armed = threading.Event(), threading.Event()
        self.held: list[object] = []
        self.server = threading.Thread(target=lambda: self.held.extend(serve_kv_cache_status(
            first, make, instance=suffix, until=self.stop.is_set, timeout=timeout, failures=self.failures)))  # type: ignore[arg-type]
        self.attachers = threading.Thread(target=self.attach, daemon=True)
        self.server.start()
        self.attachers.start()

    def attach(self) -> None:
        with FastDeploySignal.attach(KV_CACHE_STATUS, self.suffix) as status:
            with FastDeploySignal.attach(CACHE_READY, self.suffix) as ready:
                while not self.stop.is_set():
                    if not self.armed.is_set() or status.get(0) != KVCacheStatus.CLEARING:
                        time.sleep(0.005)
                        continue
                    self.armed.clear()
                    for rank in sorted(self.letting_go):
                        ready.set(rank, 0)

    def drive(self, letting_go: set[int]) -> object:
        """drive_kv_cache_update, the ranks in ``letting_go`` letting go at its CLEARING."""
        self.letting_go = letting_go
        self.armed.set()
        try:
            return drive_kv_cache_update(self.suffix, timeout=20)
        finally:
            self.armed.clear()

    def close(self) -> list[object]:
        self.stop.set()
        self.server.join(30)
        self.attachers.join(5)
        assert not self.server.is_alive()
        with FastDeploySignal.attach(CACHE_READY, self.suffix) as ready:
            ready.write_all(0)
        for cache in self.held:
            cache.clear(5, clear_host=True)  # type: ignore[attr-defined]
        return self.held


@pytest.fixture
def served(two_ranks: str, fastdeploy_record_names: None) -> Iterator[Callable[..., Served]]:
    made: list[Served] = []

    def start(recreate_fails: dict[int, BaseException] | None = None, timeout: float = 0.5) -> Served:
        made.append(Served(two_ranks, recreate_fails or {}, timeout))
        return made[-1]

    yield start
    for serving in made:
        serving.close()


@pytest.mark.slow
def test_serve_keeps_serving_after_a_rank_fails_to_clear(
    served: Callable[..., Served], caplog: pytest.LogCaptureFixture
) -> None:
    """Rank 1's attacher never lets go: its clear is a CacheInUseError; rank 0, freed, is created again; the
    drive ends at once with a CacheUpdateError naming rank 1, and the next drive clears and updates both."""
    from fd_platforms.contract.errors import CacheInUseError, CacheUpdateError

    serving = served()
    with caplog.at_level(logging.ERROR), pytest.raises(CacheUpdateError) as caught:
        serving.drive({0})
    said = str(caught.value)
    assert caught.value.rank == 1 and "could not clear rank 1's KV cache; it kept the others" in said, said
    assert "was written back to NORMAL" in said, "every rank's cache is there again"
    assert [(f.rank, f.step, type(f.error)) for f in serving.failures] == [(1, "clear", CacheInUseError)]
    errors = [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR]
    assert any(line.startswith("rank 1: the cache manager could not clear") and "CacheInUseError" in line
               for line in errors), errors  # fmt: skip
    assert serving.drive({0, 1}).ranks == 2, "still served"  # type: ignore[attr-defined]
    assert len(serving.close()) == 2


@pytest.mark.slow
def test_serve_keeps_serving_when_dev_shm_is_full_at_recreate(served: Callable[..., Served]) -> None:
    """Rank 1 cannot be created again (ShmSpaceError): rank 0 is; the drive ends with a CacheUpdateError naming
    rank 1, the word says so, the next update is refused naming it, and a restore creates rank 1."""
    from fd_platforms.contract.errors import CacheUpdateError
    from fd_platforms.fastdeploy import drive_kv_cache_restore
    from fd_platforms.ipc.shm import ShmSpaceError

    serving = served({1: ShmSpaceError("/dev/shm has 0 bytes free (simulated)")})
    with pytest.raises(CacheUpdateError) as caught:
        serving.drive({0, 1})
    said = str(caught.value)
    assert caught.value.rank == 1 and "could not create rank 1's KV cache again: that rank has none" in said, said
    assert "was left at -20001" in said and "not NORMAL" in said
    assert [(f.rank, f.step, type(f.error)) for f in serving.failures] == [(1, "create", ShmSpaceError)]
    with pytest.raises(CacheUpdateError, match="the last clear/update failed after the caches were freed"):
        serving.drive({0, 1})
    assert drive_kv_cache_restore(serving.suffix, timeout=20).ranks == 2, "the restore creates what is missing"
    with FastDeploySignal.attach(CACHE_READY, serving.suffix) as ready:
        assert ready.values() == (1, 1)
    assert len(serving.close()) == 2


@pytest.mark.slow
def test_serve_keeps_serving_when_fd_enable_swap_space_clearing_turns_bad(
    served: Callable[..., Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    """FD_ENABLE_SWAP_SPACE_CLEARING is read when a cache is managed, so the clear frees as it was read then, and
    the re-create (manage_kv_cache again) refuses the bad value (a ConfigError): serve goes on, the drive ends with
    a CacheUpdateError naming the rank, and once the value is fixed the next restore creates what is missing."""
    from fd_platforms.contract.errors import CacheUpdateError, ConfigError
    from fd_platforms.fastdeploy import drive_kv_cache_restore

    serving = served()
    monkeypatch.setenv("FD_ENABLE_SWAP_SPACE_CLEARING", "true")
    with pytest.raises(CacheUpdateError) as caught:
        serving.drive({0, 1})
    assert "could not create rank" in str(caught.value)
    failed = serving.failures  # type: ignore[attr-defined]
    assert failed and {(f.step, f.error.field) for f in failed} == {("create", "FD_ENABLE_SWAP_SPACE_CLEARING")}
    assert all(isinstance(f.error, ConfigError) for f in failed)
    monkeypatch.setenv("FD_ENABLE_SWAP_SPACE_CLEARING", "0")
    drive_kv_cache_restore(serving.suffix, timeout=10)  # type: ignore[attr-defined]
    assert len(serving.close()) == 2
