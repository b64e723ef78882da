"""The wait contract: returns when set, times out, notices a dead creator."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from ...contract.errors import CacheNotReadyError, CacheSignalError
from ...ipc.cache_signal import CacheReadySignal, new_signal_name
from ...loading.platform import Platform
from . import hooks


@pytest.fixture
def signal() -> Iterator[CacheReadySignal]:
    with CacheReadySignal.create(2, new_signal_name()) as created:
        yield created


@hooks("wait_cache_ready")
def test_returns_at_once_when_already_set(fd_platform: Platform, signal: CacheReadySignal) -> None:
    signal.set(1)
    waited = fd_platform.wait_cache_ready(signal.name, 1, timeout=5)
    assert isinstance(waited, float) and 0 <= waited < 1


@hooks("wait_cache_ready")
def test_returns_when_set_by_another_thread(fd_platform: Platform, signal: CacheReadySignal) -> None:
    timer = threading.Timer(0.2, signal.set, args=(0,))
    timer.start()
    try:
        waited = fd_platform.wait_cache_ready(signal.name, 0, timeout=10)
    finally:
        timer.cancel()
    assert 0.1 <= waited < 5
    assert not signal.is_set(1), "setting one rank's slot must not release another"


@hooks("wait_cache_ready")
def test_times_out_with_the_slots_named(fd_platform: Platform, signal: CacheReadySignal) -> None:
    started = time.monotonic()
    with pytest.raises(CacheNotReadyError) as info:
        fd_platform.wait_cache_ready(signal.name, 0, timeout=0.3)
    assert info.value.cause == "timeout" and signal.name in str(info.value)
    assert 0.25 <= time.monotonic() - started < 5


@hooks("wait_cache_ready")
def test_notices_a_dead_creator(fd_platform: Platform, signal: CacheReadySignal) -> None:
    creator = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    killer = threading.Timer(0.3, creator.kill)
    killer.start()
    started = time.monotonic()
    try:
        with pytest.raises(CacheNotReadyError) as info:
            fd_platform.wait_cache_ready(signal.name, 0, timeout=30, creator_pid=creator.pid)
    finally:
        killer.cancel()
        creator.kill()
        creator.wait(timeout=10)
    assert info.value.cause == "creator_exited" and str(creator.pid) in str(info.value)
    assert time.monotonic() - started < 5, "a dead creator must end the wait long before the timeout"


@hooks("wait_cache_ready")
def test_a_missing_signal_is_an_error(fd_platform: Platform) -> None:
    with pytest.raises(CacheSignalError):
        fd_platform.wait_cache_ready(new_signal_name(), 0, timeout=1)
