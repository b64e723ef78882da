"""Names that mean one thing in the engine API: FastDeploy's signal suffix is ``suffix=``, the manager's one
call decides create or attach from the rule, and ``ManagedCache`` reads like ``KVCache`` (``kv_cache``,
``host_cache``). The old spellings keep working for one minor version, with a DeprecationWarning that
points at the caller's line."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine_processes import qwen_layout
from fd_platforms.contract.errors import ConfigError
from fd_platforms.engine import KVCache, ManagedCache, hold_kv_cache, initialize_kv_cache, manage_kv_cache
from fd_platforms.fastdeploy import FASTDEPLOY
from fd_platforms.ipc.cache_signal import CacheReadySignal
from fd_platforms.loading.platform import Platform
from fd_platforms.loading.selection import select_platform

pytest.importorskip("paddle")
BLOCKS = 2
SWAP = {"profile": False, "num_cpu_blocks": 2, "storage_backend": None, "splitwise_role": "mixed"}


@pytest.fixture(scope="module")
def cpu() -> Platform:
    return select_platform({"FD_PLATFORM": "cpu"}).platform


@pytest.fixture
def ours(signal_name: str) -> Iterator[str]:
    """Our engine's cache-ready signal for one rank."""
    with CacheReadySignal.create(1, signal_name) as signal:
        yield signal.name


@pytest.fixture
def suffix(fastdeploy_record_names: None) -> Iterator[str]:
    """FastDeploy's signals for one rank, under a suffix of this test's (its records are named as FastDeploy's)."""
    name, held = FASTDEPLOY.create_signals(1, device_type="cpu", block_count_suffix=None)
    with held:
        yield name


def test_fastdeploys_suffix_is_its_own_argument(cpu: Platform, suffix: str) -> None:
    managed = manage_kv_cache(cpu, qwen_layout(), BLOCKS, num_cpu_blocks=2, suffix=suffix, protocol="fastdeploy",
                              rule="2026-01")  # fmt: skip
    runner = initialize_kv_cache(cpu, qwen_layout(), BLOCKS, suffix=suffix, protocol="fastdeploy", rule="2026-01",
                                 timeout=5, **SWAP)  # fmt: skip
    try:
        assert managed.created and not runner.created
    finally:
        runner.clear(5)
        managed.clear(5)


def test_signal_name_beside_fastdeploy_still_works_with_a_deprecation_warning(cpu: Platform, suffix: str) -> None:
    with pytest.warns(DeprecationWarning, match="signal_name= with protocol='fastdeploy' is deprecated") as caught:
        managed = manage_kv_cache(cpu, qwen_layout(), BLOCKS, num_cpu_blocks=2, signal_name=suffix,
                                  protocol="fastdeploy", rule="2026-01")  # fmt: skip
        runner = initialize_kv_cache(cpu, qwen_layout(), BLOCKS, signal_name=suffix, protocol="fastdeploy",
                                     rule="2026-01", timeout=5, **SWAP)  # fmt: skip
    try:
        assert managed.created and not runner.created
        assert [warning.filename for warning in caught] == [__file__, __file__], "the warning names the caller's line"
        assert "pass suffix=" in str(caught[0].message)
    finally:
        runner.clear(5)
        managed.clear(5)


@pytest.mark.parametrize(
    ("protocol", "names", "field"),
    [("fastdeploy", {"signal_name": "9923", "suffix": "9923"}, "signal_name"), ("fastdeploy", {}, "suffix"),
     ("fd-platforms", {"suffix": "9923"}, "suffix"), ("fd-platforms", {}, "signal_name")],
)  # fmt: skip
def test_a_missing_doubled_or_foreign_name_is_a_config_error(
    cpu: Platform, protocol: str, names: dict[str, str], field: str
) -> None:
    for call in (
        lambda: initialize_kv_cache(cpu, qwen_layout(), BLOCKS, protocol=protocol, rule="2026-01", **SWAP, **names),
        lambda: manage_kv_cache(cpu, qwen_layout(), BLOCKS, num_cpu_blocks=2, protocol=protocol, rule="2026-01",
                                **names),  # type: ignore[arg-type]
    ):  # fmt: skip
        with pytest.raises(ConfigError) as caught:
            call()
        assert caught.value.field == field and "Fix: " in str(caught.value)


def test_manage_kv_cache_attaches_where_the_rule_lets_the_workers_create(cpu: Platform, ours: str) -> None:
    """Rule 2026-04 with swap space: the worker creates, and the one manager call attaches (FastDeploy's transfer
    manager since PR #7471, cache_transfer_manager.py: "Waiting for runners ... to create kv cache")."""
    worker = initialize_kv_cache(cpu, qwen_layout(), BLOCKS, signal_name=ours, rule="2026-04", **SWAP)
    managed = manage_kv_cache(cpu, qwen_layout(), BLOCKS, num_cpu_blocks=2, signal_name=ours, rule="2026-04",
                              setter_pid=None, timeout=5)  # fmt: skip
    try:
        assert worker.created and not managed.created and not managed.kv_cache.created
        worker.tensors[0][0, 0, 0, 0] = 3.5
        assert managed.kv_cache.tensors[0][0, 0, 0, 0].item() == 3.5
        assert managed.host_cache is not None and managed.host_cache.num_blocks == 2
    finally:
        managed.clear(5)
        worker.clear(5)


def test_manage_kv_cache_creates_where_the_rule_sends_the_workers_to_attach(cpu: Platform, ours: str) -> None:
    managed = manage_kv_cache(cpu, qwen_layout(), BLOCKS, num_cpu_blocks=2, signal_name=ours, rule="2026-01")
    try:
        assert managed.created and managed.kv_cache.created
    finally:
        managed.clear(5)


def test_hold_kv_cache_still_attaches_with_a_deprecation_warning(cpu: Platform, ours: str) -> None:
    worker = initialize_kv_cache(cpu, qwen_layout(), BLOCKS, signal_name=ours, rule="2026-04", **SWAP)
    try:
        with pytest.warns(DeprecationWarning, match="hold_kv_cache is deprecated .* use manage_kv_cache") as caught:
            managed = hold_kv_cache(cpu, qwen_layout(), BLOCKS, num_cpu_blocks=2, signal_name=ours, rule="2026-04")
        assert caught[0].filename == __file__ and not managed.created
        managed.clear(5)
    finally:
        worker.clear(5)


def test_managed_cache_fields_read_as_kv_caches_with_deprecated_aliases(cpu: Platform, ours: str) -> None:
    managed = manage_kv_cache(cpu, qwen_layout(), BLOCKS, num_cpu_blocks=2, signal_name=ours, rule="2026-01")
    try:
        assert isinstance(managed, ManagedCache) and isinstance(managed.kv_cache, KVCache)
        assert managed.kv_cache.device == "cpu"  # the device string, as on a runner's KVCache
        with pytest.warns(DeprecationWarning, match=r"ManagedCache.device is deprecated .* ManagedCache.kv_cache"):
            assert managed.device is managed.kv_cache
        host_alias = r"ManagedCache.host is deprecated .*ManagedCache.host_cache"
        with pytest.warns(DeprecationWarning, match=host_alias) as caught:
            assert managed.host is managed.host_cache is not None
        assert caught[0].filename == __file__
    finally:
        managed.clear(5)
