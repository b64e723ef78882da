"""Clear as FastDeploy clears: the host swap space survives a clear unless
``FD_ENABLE_SWAP_SPACE_CLEARING`` asks (``fastdeploy/envs.py``; ``CacheTransferManager.check_cache_status``
in ``fastdeploy/cache_manager/cache_transfer_manager.py``, f658b74), and the re-creation reuses it; host-cache
allocation is public; a lenient clear drops our references and leaves the engine's.

In-process, on cpu, rank 0 on device 7 (FastDeploy's record names are the machine's: taken in turns).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest
from engine_processes import qwen_layout
from kv_requests import kv_request

from fd_platforms.contract.errors import BufferInUseError, CacheInUseError, ConfigError
from fd_platforms.engine import KVCache, ManagedCache, initialize_kv_cache, manage_kv_cache
from fd_platforms.engine.publication import publication_name
from fd_platforms.fastdeploy.signals import (
    CACHE_READY,
    CACHE_TRANSFER_INITED,
    KV_CACHE_STATUS,
    SWAP_SPACE_READY,
    FastDeploySignal,
)
from fd_platforms.ipc.cache_signal import CacheReadySignal
from fd_platforms.loading.platform import Platform

pytestmark = pytest.mark.usefixtures("fastdeploy_record_names")

BLOCKS = 4
CPU_BLOCKS = 3
DEVICE = 7  # FastDeploy's names of no other test's tensors
RULE = "2026-01"  # the manager creates


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, FastDeploySignal, FastDeploySignal]]:
    """FastDeploy's engine signals for one rank: (suffix, cache_ready_signal, swap_space_ready_signal)."""
    monkeypatch.delenv("FD_ENABLE_SWAP_SPACE_CLEARING", raising=False)
    suffix = f"tclr{os.getpid()}"
    made = [
        FastDeploySignal.create(name, suffix, 1)
        for name in (CACHE_READY, SWAP_SPACE_READY, CACHE_TRANSFER_INITED, KV_CACHE_STATUS)
    ]
    try:
        yield suffix, made[0], made[1]
    finally:
        for signal in made:
            signal.close()


def manage(cpu: Platform, suffix: str, **kwargs: object) -> ManagedCache:
    return manage_kv_cache(
        cpu,
        kv_request(
            qwen_layout(0, 1, DEVICE),
            BLOCKS,
            num_cpu_blocks=CPU_BLOCKS,
            instance=suffix,
            protocol="fastdeploy",
            rule=RULE,
            **kwargs,
        ),
    )  # type: ignore[arg-type]


def let_go_and_clear(managed: ManagedCache, ready: FastDeploySignal, **kwargs: object) -> None:
    ready.set(0, 0)  # the rank's attacher let go
    managed.clear(5, **kwargs)  # type: ignore[arg-type]


def records() -> set[str]:
    return set(qwen_layout(0, 1, DEVICE).names()) & set(os.listdir("/dev/shm"))


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_managers_clear_keeps_the_host_swap_space_and_the_next_creation_reuses_it(cpu: Platform, engine) -> None:
    suffix, ready, swap = engine
    managed = manage(cpu, suffix)
    host = managed.host_cache
    assert host is not None and swap.values() == (1,)
    host.tensors[0][0, 0, 0, 0] = 7  # what was swapped out before the clear
    let_go_and_clear(managed, ready)
    assert not managed.kv_cache.shared and records() == set(), "the device cache is freed"
    assert managed.host_cache is host and swap.values() == (1,), (
        "the swap space kept, its word still 1, as FastDeploy's"
    )
    again = manage(cpu, suffix, host_cache=host)
    assert again.host_cache is host and int(again.host_cache.tensors[0][0, 0, 0, 0]) == 7 and swap.values() == (1,)
    let_go_and_clear(again, ready, clear_host=True)
    assert again.host_cache is None and swap.values() == (0,)


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_fd_enable_swap_space_clearing_frees_it_and_an_explicit_argument_overrides_it(
    cpu: Platform, engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    suffix, ready, swap = engine
    monkeypatch.setenv("FD_ENABLE_SWAP_SPACE_CLEARING", "1")
    managed = manage(cpu, suffix)
    let_go_and_clear(managed, ready)
    assert managed.host_cache is None and swap.values() == (0,), "freed and said so, as FastDeploy's transfer manager"
    managed = manage(cpu, suffix)
    let_go_and_clear(managed, ready, clear_host=False)
    assert managed.host_cache is not None and swap.values() == (1,)
    managed.host_cache.clear()


@pytest.mark.parametrize("value", ["true", "yes", ""])
def test_manage_kv_cache_refuses_an_invalid_fd_enable_swap_space_clearing_before_anything_is_published(
    cpu: Platform, engine, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """Read where it is first read (manage time), not at a serving manager's first clear."""
    suffix, ready, swap = engine
    monkeypatch.setenv("FD_ENABLE_SWAP_SPACE_CLEARING", value)
    with pytest.raises(ConfigError) as caught:
        manage(cpu, suffix)
    assert caught.value.field == "FD_ENABLE_SWAP_SPACE_CLEARING" and f"={value!r} is not valid" in str(caught.value)
    assert "Fix: export FD_ENABLE_SWAP_SPACE_CLEARING=0 or =1" in str(caught.value)
    assert records() == set() and ready.values() == (0,) and swap.values() == (0,), "nothing published"


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_kept_host_cache_that_does_not_fit_is_refused_before_anything_is_published(cpu: Platform, engine) -> None:
    suffix, ready, _ = engine
    managed = manage(cpu, suffix)
    let_go_and_clear(managed, ready)
    with pytest.raises(ConfigError, match=f"{CPU_BLOCKS + 1} blocks") as caught:
        manage_kv_cache(
            cpu,
            kv_request(
                qwen_layout(0, 1, DEVICE),
                BLOCKS,
                num_cpu_blocks=CPU_BLOCKS + 1,
                instance=suffix,
                protocol="fastdeploy",
                rule=RULE,
                host_cache=managed.host_cache,
            ),
        )
    assert caught.value.field == "host_cache" and records() == set() and ready.values() == (0,)
    managed.host_cache.clear()  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="freed"):
        manage(cpu, suffix, host_cache=managed.host_cache)
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
        engine.allocate_host_cache(
            cpu if platform is None else platform,  # type: ignore[arg-type]
            qwen_layout(0, 1, DEVICE) if layout is None else layout,  # type: ignore[arg-type]
            blocks,
        )  # type: ignore[arg-type]
    assert field in str(caught.value) and "Fix:" in str(caught.value) and calls == []


def test_allocate_host_cache_carves_the_layouts_host_tensors(cpu: Platform) -> None:
    from fd_platforms.engine import HostCache, allocate_host_cache

    host = allocate_host_cache(cpu, qwen_layout(0, 1, DEVICE), CPU_BLOCKS)
    assert isinstance(host, HostCache) and host.names == qwen_layout(0, 1, DEVICE).host_names()
    assert host.num_blocks == CPU_BLOCKS and next(iter(host.tensors[0].shape)) == CPU_BLOCKS
    host.clear()


# -- a clear that drops our references and lets the engine drop its own (KVCache.clear(strict=False)) --


def memfd_mappings() -> int:
    """This process's mappings of memfds (the cpu platform's shared cache tensors)."""
    with open("/proc/self/maps") as maps:
        return sum("/memfd:" in line for line in maps)


def create(cpu: Platform, ready_signal: CacheReadySignal) -> KVCache:
    """Rank 0's cache as a runner that creates and publishes it (role mixed, no swap space)."""
    return initialize_kv_cache(
        cpu,
        kv_request(
            qwen_layout(0, 1, DEVICE),
            BLOCKS,
            profile=False,
            num_cpu_blocks=0,
            storage_backend=None,
            splitwise_role="mixed",
            instance=ready_signal.name,
        ),
    )


@pytest.fixture
def ready_signal() -> Iterator[CacheReadySignal]:
    with CacheReadySignal.create(1) as signal:
        yield signal


def test_a_creators_lenient_clear_lets_go_at_once_and_frees_when_the_engines_last_reference_dies(
    cpu: Platform, ready_signal: CacheReadySignal
) -> None:
    """FastDeploy's clear_cache drops its own references and leaves the rest (share_inputs, forward_meta, the
    proposer) to the engine; memory a live tensor points at is never unmapped."""
    before = memfd_mappings()
    cache = create(cpu, ready_signal)
    assert cache.created and cache.shared and ready_signal.slots() == (1,)
    held = cache.tensors[0][1]  # a view the engine keeps (forward_meta's, say)
    cache.clear(strict=False)
    assert cache.cleared and cache.tensors == [] and ready_signal.slots() == (0,)
    assert not os.path.exists(f"/dev/shm/{publication_name(ready_signal.name, 0)}"), "unpublished at once"
    held[0, 0, 0] = 2.5  # still mapped: no segfault
    assert float(held[0, 0, 0]) == 2.5 and memfd_mappings() > before
    del held
    gc.collect()
    assert memfd_mappings() == before, "unmapped once the engine's last reference died"


def test_an_attachers_lenient_clear_lets_go_only_once_the_engines_last_reference_dies(
    cpu: Platform, ready_signal: CacheReadySignal
) -> None:
    """The creator waits for an attacher's let-go before it frees: an attacher that still maps the cache (the
    engine holds a tensor) has not let go, so nothing is freed under it."""
    layout = qwen_layout(0, 1, DEVICE)
    managed = manage_kv_cache(cpu, kv_request(layout, BLOCKS, num_cpu_blocks=CPU_BLOCKS, instance=ready_signal.name))
    cache = initialize_kv_cache(
        cpu,
        kv_request(
            layout,
            BLOCKS,
            profile=False,
            num_cpu_blocks=CPU_BLOCKS,
            storage_backend=None,
            splitwise_role="mixed",
            instance=ready_signal.name,
            timeout=5,
        ),
    )
    assert not cache.created
    held = cache.tensors[-1]
    with pytest.raises(BufferInUseError):
        cache.clear()  # the strict clear refuses while anything references a tensor
    cache.clear(strict=False)
    assert cache.cleared and cache.tensors == [] and ready_signal.slots() == (1,), "not let go while mapped"
    with pytest.raises(CacheInUseError):
        managed.clear(0.1)  # the creator does not free what the attacher still maps
    held[0, 0, 0, 0] = 1.5
    assert float(managed.kv_cache.tensors[-1][0, 0, 0, 0]) == 1.5, "the same memory, still shared"
    del held
    gc.collect()
    assert ready_signal.slots() == (0,), "let go once the engine's last reference died"
    managed.clear(5, clear_host=True)
    assert not managed.kv_cache.shared


def test_a_lenient_clear_with_nothing_referenced_is_the_strict_clear(
    cpu: Platform, ready_signal: CacheReadySignal
) -> None:
    before = memfd_mappings()
    cache = create(cpu, ready_signal)
    cache.clear(strict=False)
    assert memfd_mappings() == before and ready_signal.slots() == (0,)
    cache.clear(strict=False)  # idempotent


def held_by_a_lenient_attacher(cpu: Platform, **names: object) -> tuple[ManagedCache, KVCache, object]:
    """A manager's cache, an attacher of it in this process that cleared with strict=False, and the view
    of one of its tensors that its engine still holds."""
    layout = qwen_layout(0, 1, DEVICE)
    managed = manage_kv_cache(cpu, kv_request(layout, BLOCKS, num_cpu_blocks=CPU_BLOCKS, rule=RULE, **names))  # type: ignore[arg-type]
    cache = initialize_kv_cache(
        cpu,
        kv_request(
            layout,
            BLOCKS,
            profile=False,
            num_cpu_blocks=CPU_BLOCKS,
            storage_backend=None,
            splitwise_role="mixed",
            rule=RULE,
            timeout=5,
            **names,
        ),
    )  # type: ignore[arg-type]
    held = cache.tensors[-1][0]
    cache.clear(strict=False)
    return managed, cache, held


def assert_told_to_drop_the_engines_references(refused: CacheInUseError) -> None:
    said = str(refused)
    fix = "drops its own references to the cache's tensors (and views of them): drop those there, then clear this cache"
    assert "if it cleared with strict=False, it lets go only once its engine " + fix in said, said


def test_a_creator_held_by_a_lenient_attacher_is_told_to_drop_the_engines_references_not_to_clear_it_again(
    cpu: Platform, ready_signal: CacheReadySignal
) -> None:
    managed, _cache, held = held_by_a_lenient_attacher(cpu, instance=ready_signal.name)
    with pytest.raises(CacheInUseError) as refused:
        managed.clear(0.1)
    assert_told_to_drop_the_engines_references(refused.value)
    del held
    gc.collect()
    managed.clear(5, clear_host=True)


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_fastdeploy_creator_held_by_a_lenient_attacher_is_told_to_drop_the_engines_references(
    cpu: Platform, engine
) -> None:
    suffix, _, _ = engine
    managed, _cache, held = held_by_a_lenient_attacher(cpu, instance=suffix, protocol="fastdeploy")
    try:
        with pytest.raises(CacheInUseError) as refused:
            managed.clear(0.1)
    finally:
        del held
        gc.collect()
        managed.clear(5, clear_host=True)
    assert_told_to_drop_the_engines_references(refused.value)
