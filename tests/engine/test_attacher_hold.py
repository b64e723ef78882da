"""An attacher's hold on a creator's cache lasts as long as the attacher may still use the memory: until its
``clear()`` or its process's end, never until its ``KVCache`` is garbage-collected (the engine may still hold its
tensors: FastDeploy keeps them in ``share_inputs`` and ``forward_meta``). Both protocols, one process per role."""

from __future__ import annotations

import pytest
from engine_processes import dropping_worker, first_bytes, qwen_layout
from kv_requests import kv_request
from warm_processes import warm

from fd_platforms.contract.errors import CacheInUseError
from fd_platforms.engine import manage_kv_cache
from fd_platforms.fastdeploy import FASTDEPLOY
from fd_platforms.loading.platform import Platform

pytestmark = pytest.mark.slow  # multi-process: left out of -m "not slow"


@pytest.fixture(params=["ours", "fastdeploy"])
def wire(request: pytest.FixtureRequest) -> tuple[str, str]:
    """The protocol and the instance the creator and its attacher meet under."""
    fixture = "fastdeploy_suffix" if request.param == "fastdeploy" else "ours"
    return request.param, request.getfixturevalue(fixture)


def test_an_attacher_dropped_without_clear_keeps_its_hold_while_it_lives_and_says_so(
    cpu: Platform, cpu_for_children: None, wire: tuple[str, str]
) -> None:
    protocol, name = wire
    extra = {"protocol": FASTDEPLOY, "tp": 1, "rule": "2026-01"} if protocol == "fastdeploy" else {}
    managed = manage_kv_cache(cpu, kv_request(qwen_layout(), 4, num_cpu_blocks=4, instance=name, **extra))
    ours, theirs = warm.Pipe()
    worker = warm.Process(target=dropping_worker, args=(protocol, name, theirs), daemon=True)
    worker.start()
    theirs.close()
    try:
        assert ours.poll(60) and ours.recv() == ("attached", False)
        ours.send("drop")
        assert ours.poll(30)
        kind, warned = ours.recv()
        assert kind == "dropped"
        assert any(line.startswith("rank 0's attached KV cache was dropped without clear()") for line in warned), warned
        assert any("Fix: call KVCache.clear()" in line for line in warned)
        with pytest.raises(CacheInUseError, match="rank 0's KV cache"):
            managed.clear(0.6)
        ours.send("write")
        assert ours.poll(30) and ours.recv() == "written"
        assert 0x6B in {int(b) for b in first_bytes(managed.kv_cache, 2)}, "the kept tensor still writes the cache"
        ours.send("stop")
        worker.join(30)
        assert worker.exitcode == 0
        managed.clear(5)  # its process gone, the kernel dropped its hold
    finally:
        if worker.is_alive():
            worker.kill()
            worker.join()
