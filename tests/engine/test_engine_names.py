"""Names that mean one thing in the engine API: the engine instance is ``instance=`` (our signal's name, FastDeploy's
suffix), the creator's pid ``creator_pid=``, the manager's one
call decides create or attach from the rule, and ``ManagedCache`` reads like ``KVCache`` (``kv_cache``,
``host_cache``). The old spellings keep working for one minor version, with a DeprecationWarning that
points at the caller's line."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator

import pytest
from engine_processes import qwen_layout

from fd_platforms.contract.errors import ConfigError
from fd_platforms.engine import KVCache, ManagedCache, hold_kv_cache, initialize_kv_cache, manage_kv_cache
from fd_platforms.fastdeploy import FASTDEPLOY
from fd_platforms.ipc.cache_signal import CacheReadySignal
from fd_platforms.loading.platform import Platform

pytest.importorskip("paddle")
BLOCKS = 2
SWAP = {"profile": False, "num_cpu_blocks": 2, "storage_backend": None, "splitwise_role": "mixed"}


@pytest.fixture
def suffix(fastdeploy_record_names: None) -> Iterator[str]:
    """FastDeploy's signals for one rank, under a suffix of this test's (its records are named as FastDeploy's)."""
    name, held = FASTDEPLOY.create_signals(1, device_type="cpu", block_count_suffix=None)
    with held:
        yield name


@pytest.mark.parametrize("protocol", ["fastdeploy", "fd-platforms"])
def test_the_engine_instance_is_instance_under_either_protocol(cpu: Platform, protocol: str, request) -> None:
    name = request.getfixturevalue("suffix" if protocol == "fastdeploy" else "ours")
    managed = manage_kv_cache(
        cpu, qwen_layout(), BLOCKS, num_cpu_blocks=2, instance=name, protocol=protocol, rule="2026-01"
    )
    runner = initialize_kv_cache(
        cpu,
        qwen_layout(),
        BLOCKS,
        instance=name,
        protocol=protocol,
        rule="2026-01",
        timeout=5,
        creator_pid=os.getpid(),
        **SWAP,
    )
    try:
        assert managed.created and not runner.created
    finally:
        runner.clear(5)
        managed.clear(5)


@pytest.mark.parametrize(
    ("protocol", "keyword"), [("fastdeploy", "suffix"), ("fastdeploy", "signal_name"), ("fd-platforms", "signal_name")]
)
def test_an_old_instance_keyword_still_works_with_a_deprecation_warning(
    cpu: Platform, protocol: str, keyword: str, request
) -> None:
    """``suffix=`` and ``signal_name=`` (FastDeploy's protocol took both, ours its signal's name) are ``instance=``."""
    name = request.getfixturevalue("suffix" if protocol == "fastdeploy" else "ours")
    with pytest.warns(DeprecationWarning, match=f"^{keyword}= is deprecated .* pass instance=") as caught:
        managed = manage_kv_cache(
            cpu, qwen_layout(), BLOCKS, num_cpu_blocks=2, protocol=protocol, rule="2026-01", **{keyword: name}
        )
        runner = initialize_kv_cache(
            cpu, qwen_layout(), BLOCKS, protocol=protocol, rule="2026-01", timeout=5, **SWAP, **{keyword: name}
        )
    try:
        assert managed.created and not runner.created
        assert [warning.filename for warning in caught] == [__file__] * 2, "the warning names the caller's line"
    finally:
        runner.clear(5)
        managed.clear(5)


def test_setter_pid_is_creator_pid_with_a_deprecation_warning(cpu: Platform, ours: str) -> None:
    """The creator's pid is ``creator_pid=`` in every call; ``setter_pid=`` warns at the caller's line."""
    managed = manage_kv_cache(cpu, qwen_layout(), BLOCKS, num_cpu_blocks=2, instance=ours, rule="2026-01")
    try:
        with pytest.warns(DeprecationWarning, match="^setter_pid= is deprecated .* pass creator_pid=") as caught:
            runner = initialize_kv_cache(
                cpu, qwen_layout(), BLOCKS, instance=ours, rule="2026-01", timeout=5, setter_pid=os.getpid(), **SWAP
            )
            cpu.wait_cache_ready(ours, 0, timeout=5, setter_pid=os.getpid())
            with CacheReadySignal.attach(ours) as signal:
                signal.wait(0, 5, setter_pid=os.getpid())
        runner.clear(5)
        assert [warning.filename for warning in caught] == [__file__] * 3, "the warning names the caller's line"
        with pytest.raises(ConfigError) as both:
            initialize_kv_cache(
                cpu,
                qwen_layout(),
                BLOCKS,
                instance=ours,
                rule="2026-01",
                timeout=5,
                setter_pid=os.getpid(),
                creator_pid=os.getpid(),
                **SWAP,
            )
        assert both.value.field == "setter_pid" and "Fix: drop setter_pid=" in str(both.value)
    finally:
        managed.clear(5)


@pytest.mark.parametrize(
    ("protocol", "names", "field"),
    [
        ("fastdeploy", {"signal_name": "9923", "suffix": "9923"}, "suffix"),
        ("fastdeploy", {}, "instance"),
        ("fastdeploy", {"instance": "9923", "signal_name": "9923"}, "signal_name"),
        ("fd-platforms", {"suffix": "9923"}, "suffix"),
        ("fd-platforms", {}, "instance"),
    ],
)
def test_a_missing_doubled_or_foreign_name_is_a_config_error(
    cpu: Platform, protocol: str, names: dict[str, str], field: str
) -> None:
    for call in (
        lambda: initialize_kv_cache(cpu, qwen_layout(), BLOCKS, protocol=protocol, rule="2026-01", **SWAP, **names),
        lambda: manage_kv_cache(
            cpu, qwen_layout(), BLOCKS, num_cpu_blocks=2, protocol=protocol, rule="2026-01", **names
        ),  # type: ignore[arg-type]
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # refused before any deprecation warning
            with pytest.raises(ConfigError) as caught:
                call()
        assert caught.value.field == field and "Fix: " in str(caught.value)


def test_manage_kv_cache_attaches_where_the_rule_lets_the_workers_create(cpu: Platform, ours: str) -> None:
    """Rule 2026-04 with swap space: the worker creates, and the one manager call attaches (FastDeploy's transfer
    manager since PR #7471, cache_transfer_manager.py: "Waiting for runners ... to create kv cache")."""
    worker = initialize_kv_cache(cpu, qwen_layout(), BLOCKS, instance=ours, rule="2026-04", **SWAP)
    managed = manage_kv_cache(
        cpu, qwen_layout(), BLOCKS, num_cpu_blocks=2, instance=ours, rule="2026-04", creator_pid=None, timeout=5
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
    managed = manage_kv_cache(cpu, qwen_layout(), BLOCKS, num_cpu_blocks=2, instance=ours, rule="2026-01")
    try:
        assert managed.created and managed.kv_cache.created
    finally:
        managed.clear(5)


def test_hold_kv_cache_still_attaches_with_a_deprecation_warning(cpu: Platform, ours: str) -> None:
    worker = initialize_kv_cache(cpu, qwen_layout(), BLOCKS, instance=ours, rule="2026-04", **SWAP)
    try:
        with pytest.warns(DeprecationWarning, match="hold_kv_cache is deprecated .* use manage_kv_cache") as caught:
            managed = hold_kv_cache(cpu, qwen_layout(), BLOCKS, num_cpu_blocks=2, instance=ours, rule="2026-04")
        assert caught[0].filename == __file__ and not managed.created
        managed.clear(5)
    finally:
        worker.clear(5)


def test_managed_cache_fields_read_as_kv_caches_with_deprecated_aliases(cpu: Platform, ours: str) -> None:
    managed = manage_kv_cache(cpu, qwen_layout(), BLOCKS, num_cpu_blocks=2, instance=ours, rule="2026-01")
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


def test_every_call_that_named_the_instance_by_an_old_keyword_still_takes_it_with_a_warning_at_the_callers_line() -> (
    None
):
    """``signal_name=`` (our manifests' and tensors' names) and ``suffix=`` (FastDeploy's calls) are ``instance=``:
    the same answer, or the same refusal of a bad name, with a DeprecationWarning pointing here."""
    from fd_platforms.engine import publication_name, published_tensor_name
    from fd_platforms.fastdeploy import (
        drive_kv_cache_clear,
        drive_kv_cache_restore,
        drive_kv_cache_update,
        follow_model_weights_status,
        hand_off_block_count,
    )

    with pytest.warns(DeprecationWarning, match="^signal_name= is deprecated .* pass instance=") as caught:
        assert publication_name(signal_name="fd_cache_ready.e1", rank=0) == publication_name("fd_cache_ready.e1", 0)
        assert published_tensor_name(signal_name="fd_cache_ready.e1", layout_name="k") == published_tensor_name(
            "fd_cache_ready.e1", "k"
        )
    assert [warning.filename for warning in caught] == [__file__] * 2
    refused = [
        lambda: drive_kv_cache_clear(suffix="a/b"),
        lambda: drive_kv_cache_restore(suffix="a/b"),
        lambda: drive_kv_cache_update(suffix="a/b"),
        lambda: follow_model_weights_status(suffix="a/b", rank=0, clear=print, restore=print, until=lambda: True),
        lambda: hand_off_block_count(suffix="a/b", num_blocks=8),
    ]
    for call in refused:
        with (
            pytest.warns(DeprecationWarning, match="^suffix= is deprecated .* pass instance=") as caught,
            pytest.raises(ConfigError) as refusal,
        ):
            call()
        assert refusal.value.field == "instance" and [warning.filename for warning in caught] == [__file__]
    with pytest.raises(ConfigError) as both:
        publication_name("fd_cache_ready.e1", 0, signal_name="fd_cache_ready.e1")  # type: ignore[call-arg]
    assert both.value.field == "signal_name" and "Fix: drop signal_name=" in str(both.value)


def test_the_protocols_old_check_signal_name_is_check_instance_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="check_signal_name is deprecated .* use check_instance") as caught:
        FASTDEPLOY.check_signal_name("9923")
    assert caught[0].filename == __file__
    with pytest.raises(ConfigError) as refusal, pytest.warns(DeprecationWarning):
        FASTDEPLOY.check_signal_name("a/b")
    assert refusal.value.field == "instance"
