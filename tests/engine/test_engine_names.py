"""Names that mean one thing in the engine API: the engine instance is ``instance`` (our signal's name, FastDeploy's
suffix), the creator's pid ``creator_pid``, the manager's one call decides create or attach from the rule, and
``ManagedCache`` reads like ``KVCache`` (``kv_cache``, ``host_cache``)."""

from __future__ import annotations

import os

import pytest
from engine_processes import qwen_layout
from kv_requests import kv_request

from fd_platforms.contract.errors import ConfigError
from fd_platforms.engine import KVCache, ManagedCache, initialize_kv_cache, manage_kv_cache
from fd_platforms.ipc.cache_signal import CacheReadySignal
from fd_platforms.loading.platform import Platform

pytest.importorskip("paddle")
BLOCKS = 2
SWAP = {"profile": False, "num_cpu_blocks": 2, "storage_backend": None, "splitwise_role": "mixed"}


@pytest.mark.parametrize("protocol", ["fastdeploy", "fd-platforms"])
@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_the_engine_instance_is_instance_under_either_protocol(cpu: Platform, protocol: str, request) -> None:
    name = request.getfixturevalue("fastdeploy_suffix" if protocol == "fastdeploy" else "ours")
    managed = manage_kv_cache(
        cpu, kv_request(qwen_layout(), BLOCKS, num_cpu_blocks=2, instance=name, protocol=protocol, rule="2026-01")
    )
    runner = initialize_kv_cache(
        cpu,
        kv_request(
            qwen_layout(),
            BLOCKS,
            instance=name,
            protocol=protocol,
            rule="2026-01",
            timeout=5,
            creator_pid=os.getpid(),
            **SWAP,
        ),
    )
    try:
        assert managed.created and not runner.created
    finally:
        runner.clear(5)
        managed.clear(5)


def test_the_creator_is_creator_pid_in_every_wait(cpu: Platform, ours: str) -> None:
    """The engine call's record, the platform's wait and the signal's own wait all take ``creator_pid``."""
    managed = manage_kv_cache(cpu, kv_request(qwen_layout(), BLOCKS, num_cpu_blocks=2, instance=ours, rule="2026-01"))
    try:
        runner = initialize_kv_cache(
            cpu,
            kv_request(
                qwen_layout(), BLOCKS, instance=ours, rule="2026-01", timeout=5, creator_pid=os.getpid(), **SWAP
            ),
        )
        assert cpu.wait_cache_ready(ours, 0, timeout=5, creator_pid=os.getpid()) >= 0
        with CacheReadySignal.attach(ours) as signal:
            assert signal.wait(0, 5, creator_pid=os.getpid()) >= 0
        runner.clear(5)
    finally:
        managed.clear(5)


@pytest.mark.parametrize(
    ("protocol", "names", "field"),
    [
        ("fastdeploy", {"instance": None}, "instance"),
        ("fastdeploy", {"instance": "fd_cache_ready.x"}, "instance"),
        ("fd-platforms", {"instance": "a/b"}, "instance"),
        ("fd-platforms", {"instance": None}, "instance"),
    ],
)
def test_a_missing_or_foreign_name_is_a_config_error(
    cpu: Platform, protocol: str, names: dict[str, str], field: str
) -> None:
    for call in (
        lambda: initialize_kv_cache(
            cpu, kv_request(qwen_layout(), BLOCKS, protocol=protocol, rule="2026-01", **SWAP, **names)
        ),
        lambda: manage_kv_cache(
            cpu, kv_request(qwen_layout(), BLOCKS, num_cpu_blocks=2, protocol=protocol, rule="2026-01", **names)
        ),  # type: ignore[arg-type]
    ):
        with pytest.raises(ConfigError) as caught:
            call()
        assert caught.value.field == field and "Fix: " in str(caught.value)


def test_manage_kv_cache_attaches_where_the_rule_lets_the_workers_create(cpu: Platform, ours: str) -> None:
    """Rule 2026-04 with swap space: the worker creates, and the one manager call attaches (FastDeploy's transfer
    manager since PR #7471, cache_transfer_manager.py: "Waiting for runners ... to create kv cache")."""
    worker = initialize_kv_cache(cpu, kv_request(qwen_layout(), BLOCKS, instance=ours, rule="2026-04", **SWAP))
    managed = manage_kv_cache(
        cpu,
        kv_request(qwen_layout(), BLOCKS, num_cpu_blocks=2, instance=ours, rule="2026-04", creator_pid=None, timeout=5),
    )
    try:
        assert worker.created and not managed.created and not managed.kv_cache.created
        worker.tensors[0][0, 0, 0, 0] = 3.5
        assert managed.kv_cache.tensors[0][0, 0, 0, 0].item() == 3.5
        assert managed.host_cache is not None and managed.host_cache.num_blocks == 2
    finally:
        managed.clear(5)
        worker.clear(5)


def test_manage_kv_cache_creates_where_the_rule_sends_the_workers_to_attach(cpu: Platform, ours: str) -> None:
    managed = manage_kv_cache(cpu, kv_request(qwen_layout(), BLOCKS, num_cpu_blocks=2, instance=ours, rule="2026-01"))
    try:
        assert managed.created and managed.kv_cache.created
    finally:
        managed.clear(5)


def test_managed_cache_fields_read_as_kv_caches(cpu: Platform, ours: str) -> None:
    managed = manage_kv_cache(cpu, kv_request(qwen_layout(), BLOCKS, num_cpu_blocks=2, instance=ours, rule="2026-01"))
    try:
        assert isinstance(managed, ManagedCache) and isinstance(managed.kv_cache, KVCache)
        assert managed.kv_cache.device == "cpu"  # the device string, as on a runner's KVCache
        assert managed.host_cache is not None and managed.host_cache.num_blocks == 2
        assert not hasattr(managed, "device") and not hasattr(managed, "host"), "one name for each field"
    finally:
        managed.clear(5)
