"""FastDeploy since PR #8046 (2026-06-15, release/2.6 #8045): a mixed instance's worker creates its cache with a
storage backend too, and the cache transfer manager, launched without ``--create_cache_tensor``
(``prefix_cache_manager.py`` ``launch_cache_manager``), attaches to it, swap space or not. The worker's clear waits
for that attacher, ours (marked) or FastDeploy's (holding nothing, letting go by resetting the slot), each in a
process of its own, and never frees under it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import engine_processes
import pytest
from conftest import SHM_DIR
from engine_processes import qwen_layout, spawned_manager
from kv_requests import kv_request

from fd_platforms.contract.errors import ConfigError
from fd_platforms.engine import KVCache, initialize_kv_cache, manage_kv_cache

pytest.importorskip("paddle")
STANDINS = Path(__file__).resolve().parents[1] / "support" / "fastdeploy_standins.py"
BLOCKS = 4
STORAGE = {"splitwise_role": "mixed", "storage_backend": "file", "rule": "2026-06", "protocol": "fastdeploy"}


def worker_creates(cpu, suffix: str, num_cpu_blocks: int) -> KVCache:
    cache = initialize_kv_cache(
        cpu, kv_request(qwen_layout(), BLOCKS, num_cpu_blocks=num_cpu_blocks, instance=suffix, **STORAGE)
    )
    assert cache.created and cache.decision.deciding_term == "none"
    return cache


def clear_in_a_thread(cache: KVCache) -> threading.Thread:
    clearing = threading.Thread(target=cache.clear, kwargs={"timeout": 30})
    clearing.start()
    return clearing


def assert_waits_and_frees_nothing(cache: KVCache, clearing: threading.Thread) -> None:
    clearing.join(0.6)
    assert clearing.is_alive(), "the creator's clear did not wait for its attacher"
    assert all((SHM_DIR / name).exists() for name in cache.names), "freed under the attacher"


@pytest.mark.slow
@pytest.mark.parametrize("num_cpu_blocks", [0, 2], ids=["no swap", "swap"])
def test_our_transfer_manager_attaches_to_the_workers_cache_and_the_workers_clear_waits_for_it(
    cpu, fastdeploy_suffix: str, num_cpu_blocks: int
) -> None:
    cache = worker_creates(cpu, fastdeploy_suffix, num_cpu_blocks)
    attacher = (engine_processes.attach_beside_worker, fastdeploy_suffix, BLOCKS, num_cpu_blocks, "file")
    with spawned_manager(*attacher) as (conn, _):
        clearing = clear_in_a_thread(cache)
        assert_waits_and_frees_nothing(cache, clearing)
        conn.send(("clear", 10.0))
        assert conn.recv() == ("cleared",)
        clearing.join(30)
        assert not clearing.is_alive()
    assert not any((SHM_DIR / name).exists() for name in cache.names)


@pytest.mark.slow
@pytest.mark.parametrize("num_cpu_blocks", [0, 2], ids=["no swap", "swap"])
def test_fastdeploys_unmarked_transfer_manager_is_waited_for_too(
    cpu, fastdeploy_suffix: str, num_cpu_blocks: int
) -> None:
    cache = worker_creates(cpu, fastdeploy_suffix, num_cpu_blocks)
    specs = json.dumps(
        [
            [name, tensor.numel().item() * tensor.element_size()]
            for name, tensor in zip(cache.names, cache.tensors, strict=True)
        ]
    )
    theirs = subprocess.Popen(
        [sys.executable, str(STANDINS), "attacher", fastdeploy_suffix, "0", "1", specs, "0", "-1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert [theirs.stdout.readline().strip() for _ in range(2)] == ["attached", "done"]  # type: ignore[union-attr]
        clearing = clear_in_a_thread(cache)
        assert_waits_and_frees_nothing(cache, clearing)
        theirs.stdin.close()  # type: ignore[union-attr]  # FastDeploy's let-go: it resets the slot
        assert theirs.wait(10) == 0
        clearing.join(30)
        assert not clearing.is_alive()
    finally:
        theirs.kill()
        theirs.wait()
    assert not any((SHM_DIR / name).exists() for name in cache.names)


def test_a_transfer_manager_may_attach_without_swap_space_only_where_one_is_started(cpu) -> None:
    """B2: with a storage backend FastDeploy starts a transfer manager, swap or not; without either it starts none,
    and attach=True there names num_cpu_blocks before anything waits."""
    neither = {**STORAGE, "storage_backend": None}
    with pytest.raises(ConfigError) as caught:
        manage_kv_cache(cpu, kv_request(qwen_layout(), BLOCKS, instance="9923", **neither), attach=True)
    assert caught.value.field == "num_cpu_blocks" and "or a storage backend" in str(caught.value)
    older = {**STORAGE, "rule": "2026-04"}  # its worker attaches with a storage backend: the manager creates
    with pytest.raises(ConfigError) as caught:
        manage_kv_cache(cpu, kv_request(qwen_layout(), BLOCKS, instance="9923", **older), attach=True)
    assert caught.value.field == "attach" and "under rule 2026-04 the workers of this mixed instance attach" in str(
        caught.value
    )
