"""The built-in cpu platform's hooks and the host buffer contract."""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest

from fd_platforms.contract.errors import BufferInUseError, CacheNotReadyError, ConfigError, HostAllocError
from fd_platforms.ipc.cache_signal import CacheReadySignal


def test_identity(cpu) -> None:
    assert cpu.identity.device_type == "cpu" and cpu.identity.visible_devices_env is None
    assert cpu.identity.device_string(0) == "cpu"
    assert cpu.detect().available and cpu.detect().device_count == 1


def test_memory_facts_come_from_the_os(cpu) -> None:
    memory = cpu.device_memory(0)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert abs(memory.total_bytes - physical) <= physical // 20
    assert 0 < memory.free_bytes <= memory.total_bytes
    assert 0 < memory.process_bytes < memory.total_bytes
    with pytest.raises(ConfigError, match="device_id=1"):
        cpu.device_memory(1)


def test_decision_hook_uses_the_core_rule(cpu) -> None:
    decision = cpu.should_create_cache_tensor(
        profile=False, num_cpu_blocks=0, storage_backend="mooncake", splitwise_role="mixed"
    )
    assert not decision.create and decision.deciding_term == "storage_backend"


def test_wait_cache_ready_is_the_cores_signal_wait(cpu, signal_name: str) -> None:
    with CacheReadySignal.create(2, signal_name) as signal:
        threading.Timer(0.1, signal.set, (1,)).start()
        waited = cpu.wait_cache_ready(signal_name, 1, timeout=10)
        assert 0.05 < waited < 5
        with pytest.raises(CacheNotReadyError, match="rank 0 was not set"):
            cpu.wait_cache_ready(signal_name, 0, timeout=0.05)


def test_host_alloc_is_pageable_aligned_and_zero_copy(cpu) -> None:
    with cpu.host_alloc(1 << 20) as buffer:
        assert (buffer.nbytes, buffer.pinned, buffer.kind) == (1 << 20, False, "pageable")
        assert buffer.address % os.sysconf("SC_PAGE_SIZE") == 0
        view = buffer.numpy()
        assert view.dtype == np.uint8 and view.size == 1 << 20 and view.ctypes.data == buffer.address
        assert not view.any()  # zeroed
        tensor = buffer.paddle()
        assert tensor.data_ptr() == buffer.address
        view[:4] = [1, 2, 3, 4]
        assert tensor[:4].numpy().tolist() == [1, 2, 3, 4]
        del view, tensor
        gc.collect()
    assert buffer.released


def test_release_refuses_while_views_live(cpu) -> None:
    buffer = cpu.host_alloc(4096)
    view = buffer.numpy()[:16].view(np.int32)  # derived views keep the buffer's view alive
    with pytest.raises(BufferInUseError, match="1 numpy/paddle view"):
        buffer.release()
    assert not buffer.released
    del view
    gc.collect()
    buffer.release()
    buffer.release()  # a second release does nothing
    with pytest.raises(BufferInUseError, match="already released"):
        buffer.numpy()


def test_paddle_view_keeps_the_buffer_in_use(cpu) -> None:
    buffer = cpu.host_alloc(4096)
    tensor = buffer.paddle()
    gc.collect()
    with pytest.raises(BufferInUseError):
        buffer.release()
    del tensor
    gc.collect()
    buffer.release()


def test_required_pinning_is_an_error_on_cpu(cpu) -> None:
    with pytest.raises(HostAllocError) as info:
        cpu.host_alloc(1 << 20, require_pinned=True)
    assert "1048576 bytes" in str(info.value) and "require_pinned=False" in str(info.value)


@pytest.mark.parametrize("nbytes", [0, -5, 1.5, True])
def test_bad_sizes_name_the_field(cpu, nbytes: object) -> None:
    with pytest.raises(ConfigError, match=r"nbytes="):
        cpu.host_alloc(nbytes)


def test_allocation_failure_names_the_size(cpu) -> None:
    with pytest.raises(HostAllocError, match=str(1 << 62)):
        cpu.host_alloc(1 << 62)
