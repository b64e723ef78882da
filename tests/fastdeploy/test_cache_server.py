"""The creator's side of FastDeploy's clear/update (``fd_platforms.fastdeploy.cache_server.serve_kv_cache_status``):
it answers FastDeploy's words, refuses and logs a word outside FastDeploy's set, frees nothing while an attacher
still holds its slot, answers a late UPDATING again, checks its arguments first, and goes on serving when a rank
fails to clear or to be created again.

In-process, on cpu, our cache manager's caches served in a thread (FastDeploy's record names are the machine's:
taken in turns)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from engine_processes import qwen_layout
from kv_requests import kv_request

from fd_platforms.contract.errors import CacheInUseError, CacheUpdateError, ConfigError
from fd_platforms.engine import ManagedCache, manage_kv_cache
from fd_platforms.fastdeploy import drive_kv_cache_restore
from fd_platforms.fastdeploy.cache_server import serve_kv_cache_status
from fd_platforms.fastdeploy.cache_status import drive_kv_cache_update
from fd_platforms.fastdeploy.protocol import FASTDEPLOY
from fd_platforms.fastdeploy.signals import CACHE_READY, KV_CACHE_STATUS, FastDeploySignal, KVCacheStatus
from fd_platforms.ipc.shm import ShmSpaceError
from fd_platforms.loading.platform import Platform

pytestmark = pytest.mark.usefixtures("fastdeploy_record_names")
BLOCKS = 4


@pytest.fixture
def one_rank() -> Iterator[str]:
    """A run's signals for one local rank, as our engine creates them; its slot is 0, the status NORMAL."""
    name, made = FASTDEPLOY.create_signals(1, device_type="cpu", block_count_suffix=None)
    with made:
        yield name


@pytest.fixture
def two_ranks() -> Iterator[str]:
    """A run's signals for two local ranks, as our engine creates them; the status NORMAL."""
    name, made = FASTDEPLOY.create_signals(2, device_type="cpu", block_count_suffix=None)
    with made:
        yield name


def test_the_server_checks_its_arguments_before_touching_a_signal() -> None:
    """No signal of suffix 9923 exists here: a check that came after the attach would be a CacheSignalError."""
    with pytest.raises(ConfigError) as caught:
        serve_kv_cache_status(["cache"], lambda rank: None, instance="9923", until=lambda: True)
    assert caught.value.field == "managed" and "manage_kv_cache" in str(caught.value)
    with pytest.raises(ConfigError, match="until"):
        serve_kv_cache_status([], lambda rank: None, instance="9923", until=True)


# -- FastDeploy's words are hostile ground: what the server refuses in them --------------------------------------


@pytest.fixture
def managed(cpu: Platform, two_ranks: str) -> Iterator[list[ManagedCache]]:
    """Both ranks' caches, published with an attacher expected (host swap space): every slot set."""
    caches = [
        manage_kv_cache(
            cpu,
            kv_request(
                qwen_layout(rank, 2),
                BLOCKS,
                num_cpu_blocks=4,
                instance=two_ranks,
                protocol="fastdeploy",
                rule="2026-01",
            ),
        )
        for rank in range(2)
    ]
    yield caches
    with FastDeploySignal.attach(CACHE_READY, two_ranks) as ready:
        ready.write_all(0)
    for cache in caches:
        cache.clear(1)


@contextmanager
def signals(suffix: str) -> Iterator[tuple[FastDeploySignal, FastDeploySignal]]:
    """``kv_cache_status`` and ``cache_ready_signal`` of the run, attached."""
    with (
        FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status,
        FastDeploySignal.attach(CACHE_READY, suffix) as ready,
    ):
        yield status, ready


def serve_for(seconds: float, managed: list[ManagedCache], suffix: str) -> list[ManagedCache]:
    """The creator's side for ``seconds`` (a recreate hands back what it held: nothing is made again here)."""
    end = time.monotonic() + seconds
    return serve_kv_cache_status(
        managed, lambda rank: managed[rank], instance=suffix, until=lambda: time.monotonic() > end, timeout=1
    )


@pytest.mark.slow
@pytest.mark.parametrize("forged", [7, -99])
def test_a_status_outside_fastdeploys_set_is_refused_logged_and_never_acted_on(
    forged: int, managed: list[ManagedCache], two_ranks: str, caplog: pytest.LogCaptureFixture
) -> None:
    with signals(two_ranks) as (status, ready):
        status.set(0, forged)
        ready.set(0, 0)  # rank 0's attacher let go: only the word says whether to clear
        with caplog.at_level(logging.WARNING):
            held = serve_for(0.5, managed, two_ranks)
        assert held == managed and not any(cache.kv_cache.cleared for cache in held), "nothing freed"
        assert status.get(0) == forged, "nothing answered"
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert (
        f"'kv_cache_status.{two_ranks}'" in warned[0] and f"holds {forged}" in warned[0] and "0, 1, -1, -2" in warned[0]
    )


@pytest.mark.slow
def test_a_slot_that_flickers_through_0_while_its_attacher_holds_it_frees_nothing(
    managed: list[ManagedCache], two_ranks: str
) -> None:
    with signals(two_ranks) as (status, ready):
        status.set(0, KVCacheStatus.CLEARING)

        def flicker() -> None:
            time.sleep(0.1)
            ready.set(0, 0)
            time.sleep(0.05)
            ready.set(0, 1)  # the attacher still maps the cache

        forger = threading.Thread(target=flicker)
        forger.start()
        held = serve_for(0.6, managed, two_ranks)
        forger.join()
        assert held == managed and not any(cache.kv_cache.cleared for cache in held), "nothing freed under the runner"
        status.set(0, KVCacheStatus.NORMAL)


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_late_updating_over_the_managers_normal_is_answered_normal_again(cpu: Platform, one_rank: str) -> None:
    """FastDeploy's workers each write kv_cache_status UPDATING on an update request
    (check_model_weights_status, fastdeploy/rl/dynamic_weight_manager.py); a slower rank's can land after the
    NORMAL our cache manager wrote. Holding every cache with every slot set, it answers NORMAL again instead of
    leaving FastDeploy's engine waiting for NORMAL."""
    managed = manage_kv_cache(
        cpu,
        kv_request(qwen_layout(0, 1, 6), 4, num_cpu_blocks=2, instance=one_rank, protocol="fastdeploy", rule="2026-01"),
    )
    stop = threading.Event()
    served: list[object] = []
    server = threading.Thread(
        target=lambda: served.extend(
            serve_kv_cache_status([managed], lambda rank: managed, instance=one_rank, until=stop.is_set, timeout=5)
        )
    )
    server.start()
    try:
        with FastDeploySignal.attach(KV_CACHE_STATUS, one_rank) as status:
            status.set(0, KVCacheStatus.UPDATING)  # the late worker's word, every slot set, every cache held
            deadline = time.monotonic() + 3
            while status.get(0) != KVCacheStatus.NORMAL and time.monotonic() < deadline:
                time.sleep(0.01)
            assert status.get(0) == KVCacheStatus.NORMAL
    finally:
        stop.set()
        server.join(10)
    assert served == [managed], "nothing cleared or created again"
    with FastDeploySignal.attach(CACHE_READY, one_rank) as ready:
        ready.set(0, 0)  # its attacher lets go
    managed.clear(5, clear_host=True)


# -- serving goes on after a rank fails to clear or to be created again --


class Served:
    """Both ranks' caches made by our cache manager, served in a thread of this process; attachers played by
    a thread that resets the slots of ``letting_go`` (as KVCache.clear does) at the first CLEARING after each
    :meth:`drive` starts."""

    def __init__(self, cpu: Platform, suffix: str, recreate_fails: dict[int, object], timeout: float) -> None:
        self.suffix, self.letting_go, self.failures = suffix, {0, 1}, []  # type: ignore[var-annotated]
        self.made: dict[int, object] = {}

        def make(rank: int) -> object:
            if rank in self.made and rank in recreate_fails:  # an exception raised, else what it picks returned
                wrong = recreate_fails.pop(rank)
                if isinstance(wrong, BaseException):
                    raise wrong
                return wrong(self.made)  # type: ignore[operator]
            kept = self.made[rank].host_cache if rank in self.made else None  # type: ignore[attr-defined]
            self.made[rank] = manage_kv_cache(
                cpu,
                kv_request(
                    qwen_layout(rank, 2),
                    4,
                    num_cpu_blocks=2,
                    instance=suffix,
                    protocol="fastdeploy",
                    rule="2026-01",
                    host_cache=kept,
                ),
            )
            return self.made[rank]

        first = [make(rank) for rank in range(2)]
        self.stop, self.armed = threading.Event(), threading.Event()
        self.held: list[object] = []
        self.server = threading.Thread(
            target=lambda: self.held.extend(
                serve_kv_cache_status(
                    first, make, instance=suffix, until=self.stop.is_set, timeout=timeout, failures=self.failures
                )
            )
        )  # type: ignore[arg-type]
        self.attachers = threading.Thread(target=self.attach, daemon=True)
        self.server.start()
        self.attachers.start()

    def attach(self) -> None:
        with (
            FastDeploySignal.attach(KV_CACHE_STATUS, self.suffix) as status,
            FastDeploySignal.attach(CACHE_READY, self.suffix) as ready,
        ):
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
def served(cpu: Platform, two_ranks: str) -> Iterator[Callable[..., Served]]:
    made: list[Served] = []

    def start(recreate_fails: dict[int, object] | None = None, timeout: float = 0.5) -> Served:
        made.append(Served(cpu, two_ranks, recreate_fails or {}, timeout))
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
    serving = served()
    with caplog.at_level(logging.ERROR), pytest.raises(CacheUpdateError) as caught:
        serving.drive({0})
    said = str(caught.value)
    assert caught.value.rank == 1 and "could not clear rank 1's KV cache; it kept the others" in said, said
    assert "was written back to NORMAL" in said, "every rank's cache is there again"
    assert [(f.rank, f.step, type(f.error)) for f in serving.failures] == [(1, "clear", CacheInUseError)]
    errors = [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR]
    assert any(
        line.startswith("rank 1: the cache manager could not clear") and "CacheInUseError" in line for line in errors
    ), errors
    assert serving.drive({0, 1}).ranks == 2, "still served"  # type: ignore[attr-defined]
    assert len(serving.close()) == 2


@pytest.mark.slow
def test_serve_keeps_serving_when_dev_shm_is_full_at_recreate(served: Callable[..., Served]) -> None:
    """Rank 1 cannot be created again (ShmSpaceError): rank 0 is; the drive ends with a CacheUpdateError naming
    rank 1, the word says so, the next update is refused naming it, and a restore creates rank 1."""
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


@pytest.mark.slow
@pytest.mark.parametrize("returned", [lambda made: None, lambda made: made[0]], ids=["nothing", "another rank's cache"])
def test_what_recreate_returns_is_checked_and_a_wrong_answer_is_that_ranks_failure(
    served: Callable[..., Served], returned: Callable[[dict[int, object]], object]
) -> None:
    serving = served({1: returned})
    with pytest.raises(CacheUpdateError, match="could not create rank 1's KV cache again"):
        serving.drive({0, 1})
    [failure] = serving.failures
    assert (failure.rank, failure.step, type(failure.error)) == (1, "create", ConfigError)
    said = str(failure.error)
    assert said.startswith("recreate(1)'s return value") and "allowed: the ManagedCache of rank 1" in said, said
