"""FastDeploy's signal words are hostile ground: what our creator and driver refuse in them (issue 34)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from engine_processes import qwen_layout
from fd_platforms.contract.errors import CacheSharingError, SignalWaitError
from fd_platforms.engine import ManagedCache, manage_kv_cache
from fd_platforms.fastdeploy.cache_server import serve_kv_cache_status
from fd_platforms.fastdeploy.protocol import FASTDEPLOY
from fd_platforms.fastdeploy.signals import CACHE_READY, KV_CACHE_STATUS, FastDeploySignal, KVCacheStatus
from fd_platforms.loading.selection import select_platform

# FastDeploy's record names are the machine's: taken in turns
pytestmark = pytest.mark.usefixtures("fastdeploy_record_names")
BLOCKS = 4


@pytest.fixture
def suffix() -> Iterator[str]:
    """A run's signals for two local ranks, as our engine creates them."""
    name, made = FASTDEPLOY.create_signals(2, device_type="cpu", block_count_suffix=None)
    with made:
        yield name


@pytest.fixture
def managed(suffix: str) -> Iterator[list[ManagedCache]]:
    """Both ranks' caches, published with an attacher expected (host swap space): every slot set."""
    cpu = select_platform({"FD_PLATFORM": "cpu"}).platform
    caches = [
        manage_kv_cache(cpu, qwen_layout(rank, 2), BLOCKS, num_cpu_blocks=4, instance=suffix, protocol="fastdeploy",
                        rule="2026-01")
        for rank in range(2)
    ]  # fmt: skip
    yield caches
    with FastDeploySignal.attach(CACHE_READY, suffix) as ready:
        ready.write_all(0)
    for cache in caches:
        cache.clear(1)


@contextmanager
def signals(suffix: str) -> Iterator[tuple[FastDeploySignal, FastDeploySignal]]:
    """``kv_cache_status`` and ``cache_ready_signal`` of the run, attached."""
    with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
        with FastDeploySignal.attach(CACHE_READY, suffix) as ready:
            yield status, ready


def serve_for(seconds: float, managed: list[ManagedCache], suffix: str) -> list[ManagedCache]:
    """The creator's side for ``seconds`` (a recreate hands back what it held: nothing is made again here)."""
    end = time.monotonic() + seconds
    return serve_kv_cache_status(managed, lambda rank: managed[rank], instance=suffix,
                                 until=lambda: time.monotonic() > end, timeout=1)  # fmt: skip


@pytest.mark.parametrize("forged", [7, -99])
def test_a_status_outside_fastdeploys_set_is_refused_logged_and_never_acted_on(
    forged: int, managed: list[ManagedCache], suffix: str, caplog: pytest.LogCaptureFixture
) -> None:
    with signals(suffix) as (status, ready):
        status.set(0, forged)
        ready.set(0, 0)  # rank 0's attacher let go: only the word says whether to clear
        with caplog.at_level(logging.WARNING):
            held = serve_for(0.5, managed, suffix)
        assert held == managed and not any(cache.kv_cache.cleared for cache in held), "nothing freed"
        assert status.get(0) == forged, "nothing answered"
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert f"'kv_cache_status.{suffix}'" in warned[0] and f"holds {forged}" in warned[0] and "0, 1, -1, -2" in warned[0]


def test_a_slot_outside_0_and_1_is_logged_and_never_taken_for_set(
    managed: list[ManagedCache], suffix: str, caplog: pytest.LogCaptureFixture
) -> None:
    with FastDeploySignal.attach(CACHE_READY, suffix) as ready:
        ready.set(1, 7)
        with caplog.at_level(logging.WARNING), pytest.raises(SignalWaitError) as caught:
            ready.wait_for(1, 1, 0.3)
        assert caught.value.seen == 7
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warned) == 1 and f"'cache_ready_signal.{suffix}' (/dev/shm/cache_ready_signal.{suffix}) word 1 " \
        "holds 7, not one of FastDeploy's values 0, 1" in warned[0], warned


def test_a_slot_that_flickers_through_0_while_its_attacher_holds_it_frees_nothing(
    managed: list[ManagedCache], suffix: str
) -> None:
    with signals(suffix) as (status, ready):
        status.set(0, KVCacheStatus.CLEARING)

        def flicker() -> None:
            time.sleep(0.1)
            ready.set(0, 0)
            time.sleep(0.05)
            ready.set(0, 1)  # the attacher still maps the cache

        forger = threading.Thread(target=flicker)
        forger.start()
        held = serve_for(0.6, managed, suffix)
        forger.join()
        assert held == managed and not any(cache.kv_cache.cleared for cache in held), "nothing freed under the runner"
        status.set(0, KVCacheStatus.NORMAL)


def test_a_neighbour_engine_on_the_same_device_ids_is_named_as_the_cause_when_it_holds_fastdeploys_names(
    managed: list[ManagedCache],
) -> None:
    """FastDeploy's record names carry no instance: a second engine's creator of rank 0 on device 0 collides."""
    cpu = select_platform({"FD_PLATFORM": "cpu"}).platform
    neighbour, made = FASTDEPLOY.create_signals(1, device_type="cpu", block_count_suffix=None)
    with made, pytest.raises(CacheSharingError) as caught:
        manage_kv_cache(cpu, qwen_layout(0, 2), BLOCKS, num_cpu_blocks=0, instance=neighbour, protocol="fastdeploy",
                        rule="2026-01")  # fmt: skip
    assert "another engine on this machine with the same device ids took them" in str(caught.value)
    assert "FastDeploy's own engines collide the same way" in str(caught.value)
    assert "Fix: give each engine distinct device ids, or run one engine per device" in str(caught.value)
