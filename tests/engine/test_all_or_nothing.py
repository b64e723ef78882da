"""A creation that fails leaves nothing behind: no slot set, no record or manifest published, no host cache
held, before the error reaches the caller (not at garbage collection: the caller may keep the error, and
with it every frame of the call).

In-process, on cpu, rank 0 on device 9 (FastDeploy's record names are the machine's: taken in turns).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from engine_processes import qwen_layout
from kv_requests import kv_request

from fd_platforms.contract.errors import CacheSignalError
from fd_platforms.engine import initialize_kv_cache, manage_kv_cache
from fd_platforms.engine.protocols.ours import FdPlatformsProtocol
from fd_platforms.engine.publication import publication_name
from fd_platforms.fastdeploy.protocol import FastDeployProtocol
from fd_platforms.fastdeploy.signals import CACHE_READY, KV_CACHE_STATUS, SWAP_SPACE_READY, FastDeploySignal
from fd_platforms.ipc.cache_signal import CacheReadySignal
from fd_platforms.loading.platform import Platform

pytestmark = pytest.mark.usefixtures("fastdeploy_record_names")

BLOCKS = 4
DEVICE = 9  # FastDeploy's names of no other test's tensors
RULE = "2026-01"  # the manager creates where the rule's versions disagree (swap space, mixed role)


def records() -> set[str]:
    """Rank 0's FastDeploy records on DEVICE now in /dev/shm."""
    names = set(qwen_layout(0, 1, DEVICE).names())
    return names & set(os.listdir("/dev/shm"))


@pytest.fixture
def engine_without_swap_signal() -> Iterator[tuple[str, FastDeploySignal]]:
    """A FastDeploy engine's signals for one rank, but for ``swap_space_ready_signal``: (suffix, cache_ready)."""
    suffix = f"taon{os.getpid()}"
    ready = FastDeploySignal.create(CACHE_READY, suffix, 1)
    status = FastDeploySignal.create(KV_CACHE_STATUS, suffix, 1)
    with ready, status:
        yield suffix, ready


def fail(*_: object, **__: object) -> None:
    raise CacheSignalError("the engine removed its signal meanwhile (made to fail by the test)")


def test_a_manager_whose_swap_signal_is_missing_publishes_nothing_and_sets_no_slot(
    cpu: Platform, engine_without_swap_signal: tuple[str, FastDeploySignal]
) -> None:
    suffix, ready = engine_without_swap_signal
    with pytest.raises(CacheSignalError, match=f"'{SWAP_SPACE_READY}.{suffix}' does not exist") as kept:
        manage_kv_cache(
            cpu,
            kv_request(
                qwen_layout(0, 1, DEVICE), BLOCKS, num_cpu_blocks=4, instance=suffix, protocol="fastdeploy", rule=RULE
            ),
        )
    assert kept.value is not None  # the error and its frames are still held here
    assert ready.values() == (0,) and records() == set()


@pytest.mark.parametrize("step", ["manager_up", "set_ready"])
@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_manager_failing_after_it_published_withdraws_before_the_error_returns(
    cpu: Platform,
    engine_without_swap_signal: tuple[str, FastDeploySignal],
    monkeypatch: pytest.MonkeyPatch,
    step: str,
) -> None:
    suffix, ready = engine_without_swap_signal
    real_set_ready = FastDeployProtocol.set_ready

    def set_then_fail(self: FastDeployProtocol, signal_name: str, rank: int) -> None:
        real_set_ready(self, signal_name, rank)  # the slot was written, then something failed
        fail()

    monkeypatch.setattr(FastDeployProtocol, "check_signals", lambda *_, **__: None, raising=False)  # a race
    monkeypatch.setattr(FastDeployProtocol, step, fail if step == "manager_up" else set_then_fail)
    freed: list[object] = []
    from fd_platforms.engine import host_cache

    def clear(cache: object) -> None:  # stands in for the method: the cache comes as self
        freed.append(cache)

    monkeypatch.setattr(host_cache.HostCache, "clear", clear)
    with pytest.raises(CacheSignalError, match="made to fail by the test") as kept:
        manage_kv_cache(
            cpu,
            kv_request(
                qwen_layout(0, 1, DEVICE), BLOCKS, num_cpu_blocks=4, instance=suffix, protocol="fastdeploy", rule=RULE
            ),
        )
    assert kept.value is not None
    assert ready.values() == (0,) and records() == set()
    assert len(freed) == 1, "the host swap cache carved for it is freed too"


def test_a_runner_whose_ready_write_fails_withdraws_its_records(
    cpu: Platform, engine_without_swap_signal: tuple[str, FastDeploySignal], monkeypatch: pytest.MonkeyPatch
) -> None:
    suffix, ready = engine_without_swap_signal
    real_set_ready = FastDeployProtocol.set_ready

    def set_then_fail(self: FastDeployProtocol, signal_name: str, rank: int) -> None:
        real_set_ready(self, signal_name, rank)
        fail()

    monkeypatch.setattr(FastDeployProtocol, "set_ready", set_then_fail)
    with pytest.raises(CacheSignalError, match="made to fail by the test") as kept:
        initialize_kv_cache(
            cpu,
            kv_request(
                qwen_layout(0, 1, DEVICE),
                BLOCKS,
                profile=False,
                num_cpu_blocks=0,
                storage_backend=None,
                splitwise_role="mixed",
                instance=suffix,
                protocol="fastdeploy",
            ),
        )
    assert kept.value is not None
    assert ready.values() == (0,) and records() == set()


def test_under_our_protocol_a_missing_signal_publishes_no_manifest(cpu: Platform) -> None:
    signal = CacheReadySignal.create(1)
    name = signal.name
    signal.close()  # the engine is gone: its signal with it
    with pytest.raises(CacheSignalError) as kept:
        manage_kv_cache(cpu, kv_request(qwen_layout(0, 1, DEVICE), BLOCKS, num_cpu_blocks=0, instance=name))
    assert kept.value is not None
    assert not os.path.exists(f"/dev/shm/{publication_name(name, 0)}")


def test_under_our_protocol_a_failed_manager_leaves_its_slot_unset(
    cpu: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FdPlatformsProtocol, "manager_up", fail)
    with CacheReadySignal.create(1) as signal:
        with pytest.raises(CacheSignalError, match="made to fail by the test") as kept:
            manage_kv_cache(cpu, kv_request(qwen_layout(0, 1, DEVICE), BLOCKS, num_cpu_blocks=0, instance=signal.name))
        assert kept.value is not None
        assert not signal.is_set(0)
        assert not os.path.exists(f"/dev/shm/{publication_name(signal.name, 0)}")


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_cache_an_attacher_came_to_before_the_failure_is_logged_not_freed_under_it(
    cpu: Platform,
    engine_without_swap_signal: tuple[str, FastDeploySignal],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An attacher of ours opened the records between the slot and the failure: the withdrawal waits
    WITHDRAW_SECONDS for it, frees nothing under it and says so, the error still reaching the caller."""
    from fd_platforms.engine import initialize
    from fd_platforms.engine.publication import PublishedTensor
    from fd_platforms.fastdeploy.handles import FastDeployHandles

    suffix, _ = engine_without_swap_signal
    came: list[FastDeployHandles] = []
    names = qwen_layout(0, 1, DEVICE).names()

    def attach_then_fail(*_: object, **__: object) -> None:
        expected = [PublishedTensor(name, (1,), "uint8", "") for name in names]
        came.append(FastDeployHandles.open(suffix, 0, expected, "cpu"))
        fail()

    monkeypatch.setattr(FastDeployProtocol, "check_signals", lambda *_, **__: None)
    monkeypatch.setattr(FastDeployProtocol, "manager_up", attach_then_fail)
    monkeypatch.setattr(initialize, "WITHDRAW_SECONDS", 0.1)
    try:
        with pytest.raises(CacheSignalError, match="made to fail by the test"):
            manage_kv_cache(
                cpu,
                kv_request(
                    qwen_layout(0, 1, DEVICE),
                    BLOCKS,
                    num_cpu_blocks=0,
                    instance=suffix,
                    protocol="fastdeploy",
                    rule=RULE,
                ),
            )
        assert records(), "still published: its attacher holds it"
        [line] = [r.getMessage() for r in caplog.records if "could not be withdrawn" in r.getMessage()]
        assert line.startswith(
            "rank 0: the KV cache of a call that failed could not be withdrawn, it is freed when this process exits: "
        ), line
        assert "still attached by a process of fd-platforms" in line, line
    finally:
        for handles in came:
            handles.let_go()
        for name in records():  # the creator's, which this process would free at its exit: the test's own names
            os.unlink(f"/dev/shm/{name}")
