"""Clear as FastDeploy clears (issue 35, item 6): the host swap space survives a clear unless
``FD_ENABLE_SWAP_SPACE_CLEARING`` asks (``fastdeploy/envs.py``; ``CacheTransferManager.check_cache_status``
in ``fastdeploy/cache_manager/cache_transfer_manager.py``, f658b74), and the re-creation reuses it.

In-process, on cpu, rank 0 on device 7 (FastDeploy's record names are the machine's: taken in turns).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from engine_processes import qwen_layout

from fd_platforms.contract.errors import ConfigError
from fd_platforms.engine import ManagedCache, manage_kv_cache
from fd_platforms.ipc.fastdeploy_signals import (
    CACHE_READY,
    CACHE_TRANSFER_INITED,
    KV_CACHE_STATUS,
    SWAP_SPACE_READY,
    FastDeploySignal,
)
from fd_platforms.loading.platform import Platform
from fd_platforms.loading.selection import select_platform

pytestmark = pytest.mark.usefixtures("fastdeploy_record_names")

BLOCKS = 4
CPU_BLOCKS = 3
DEVICE = 7  # FastDeploy's names of no other test's tensors
RULE = "2026-01"  # the manager creates


@pytest.fixture(scope="module")
def cpu() -> Platform:
    return select_platform({"FD_PLATFORM": "cpu"}).platform


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, FastDeploySignal, FastDeploySignal]]:
    """FastDeploy's engine signals for one rank: (suffix, cache_ready_signal, swap_space_ready_signal)."""
    monkeypatch.delenv("FD_ENABLE_SWAP_SPACE_CLEARING", raising=False)
    suffix = f"tclr{os.getpid()}"
    made = [FastDeploySignal.create(name, suffix, 1) for name in (CACHE_READY, SWAP_SPACE_READY,
                                                                 CACHE_TRANSFER_INITED, KV_CACHE_STATUS)]  # fmt: skip
    try:
        yield suffix, made[0], made[1]
    finally:
        for signal in made:
            signal.close()


def manage(cpu: Platform, suffix: str, **kwargs: object) -> ManagedCache:
    return manage_kv_cache(cpu, qwen_layout(0, 1, DEVICE), BLOCKS, num_cpu_blocks=CPU_BLOCKS, signal_name=suffix,
                           protocol="fastdeploy", rule=RULE, **kwargs)  # type: ignore[arg-type]  # fmt: skip


def let_go_and_clear(managed: ManagedCache, ready: FastDeploySignal, **kwargs: object) -> None:
    ready.set(0, 0)  # the rank's attacher let go
    managed.clear(5, **kwargs)  # type: ignore[arg-type]


def records() -> set[str]:
    return set(qwen_layout(0, 1, DEVICE).names()) & set(os.listdir("/dev/shm"))


def test_a_managers_clear_keeps_the_host_swap_space_and_the_next_creation_reuses_it(cpu: Platform, engine) -> None:
    suffix, ready, swap = engine
    managed = manage(cpu, suffix)
    host = managed.host
    assert host is not None and swap.values() == (1,)
    host.tensors[0][0, 0, 0, 0] = 7  # what was swapped out before the clear
    let_go_and_clear(managed, ready)
    assert not managed.device.shared and records() == set(), "the device cache is freed"
    assert managed.host is host and swap.values() == (1,), "the swap space kept, its word still 1, as FastDeploy's"
    again = manage(cpu, suffix, host_cache=host)
    assert again.host is host and int(again.host.tensors[0][0, 0, 0, 0]) == 7 and swap.values() == (1,)
    let_go_and_clear(again, ready, clear_host=True)
    assert again.host is None and swap.values() == (0,)


def test_fd_enable_swap_space_clearing_frees_it_and_an_explicit_argument_overrides_it(
    cpu: Platform, engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    suffix, ready, swap = engine
    monkeypatch.setenv("FD_ENABLE_SWAP_SPACE_CLEARING", "1")
    managed = manage(cpu, suffix)
    let_go_and_clear(managed, ready)
    assert managed.host is None and swap.values() == (0,), "freed and said so, as FastDeploy's transfer manager"
    managed = manage(cpu, suffix)
    let_go_and_clear(managed, ready, clear_host=False)
    assert managed.host is not None and swap.values() == (1,)
    managed.host.clear()


def test_an_invalid_fd_enable_swap_space_clearing_is_a_config_error_before_anything_is_freed(
    cpu: Platform, engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    suffix, ready, _ = engine
    managed = manage(cpu, suffix)
    monkeypatch.setenv("FD_ENABLE_SWAP_SPACE_CLEARING", "yes")
    with pytest.raises(ConfigError) as caught:
        let_go_and_clear(managed, ready)
    assert caught.value.field == "FD_ENABLE_SWAP_SPACE_CLEARING" and "Fix:" in str(caught.value)
    assert managed.device.shared and managed.host is not None, "nothing freed"
    let_go_and_clear(managed, ready, clear_host=True)


def test_a_kept_host_cache_that_does_not_fit_is_refused_before_anything_is_published(cpu: Platform, engine) -> None:
    suffix, ready, _ = engine
    managed = manage(cpu, suffix)
    let_go_and_clear(managed, ready)
    with pytest.raises(ConfigError, match=f"{CPU_BLOCKS + 1} blocks") as caught:
        manage_kv_cache(cpu, qwen_layout(0, 1, DEVICE), BLOCKS, num_cpu_blocks=CPU_BLOCKS + 1, signal_name=suffix,
                        protocol="fastdeploy", rule=RULE, host_cache=managed.host)  # fmt: skip
    assert caught.value.field == "host_cache" and records() == set() and ready.values() == (0,)
    managed.host.clear()  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="freed"):
        manage(cpu, suffix, host_cache=managed.host)
    assert records() == set()


# -- host-cache allocation public: fd_platforms.engine.allocate_host_cache, its arguments checked first --


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        (("cpu", "layout", CPU_BLOCKS), "platform"),
        ((None, "not a layout", CPU_BLOCKS), "layout"),
        ((None, None, 0), "num_cpu_blocks"),
        ((None, None, True), "num_cpu_blocks"),
    ],
)
def test_allocate_host_cache_is_public_and_checks_its_arguments_before_any_hook(
    cpu: Platform, monkeypatch: pytest.MonkeyPatch, arguments: tuple[object, object, object], field: str
) -> None:
    from fd_platforms import engine

    calls: list[int] = []
    monkeypatch.setattr(Platform, "host_alloc", lambda self, nbytes: calls.append(nbytes))
    platform, layout, blocks = arguments
    with pytest.raises(ConfigError) as caught:
        engine.allocate_host_cache(cpu if platform is None else platform,  # type: ignore[arg-type]
                                   qwen_layout(0, 1, DEVICE) if layout is None else layout, blocks)  # type: ignore[arg-type]  # fmt: skip
    assert field in str(caught.value) and "Fix:" in str(caught.value) and calls == []


def test_allocate_host_cache_carves_the_layouts_host_tensors(cpu: Platform) -> None:
    from fd_platforms.engine import HostCache, allocate_host_cache

    host = allocate_host_cache(cpu, qwen_layout(0, 1, DEVICE), CPU_BLOCKS)
    assert isinstance(host, HostCache) and host.names == qwen_layout(0, 1, DEVICE).host_names()
    assert host.num_blocks == CPU_BLOCKS and tuple(host.tensors[0].shape)[0] == CPU_BLOCKS
    host.clear()
