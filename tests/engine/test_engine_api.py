"""The engine API on the cpu platform: one call creates or attaches zero-copy by name; the cache
manager's side; clear and re-create; memory that comes back when every holder is gone, SIGKILL included."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import time
from collections.abc import Iterator

import engine_processes
import pytest
from conftest import SHM_DIR, shm_entries
from engine_processes import qwen_layout
from kv_requests import kv_request
from warm_processes import warm

from fd_platforms.contract.errors import BufferInUseError, CacheNotReadyError, CacheSharingError
from fd_platforms.engine import initialize_kv_cache
from fd_platforms.ipc.cache_signal import CacheReadySignal
from fd_platforms.kit.host_memory import resident_bytes
from fd_platforms.loading.selection import select_platform

paddle = pytest.importorskip("paddle")
DECODE = {"profile": False, "num_cpu_blocks": 0, "storage_backend": None, "splitwise_role": "decode"}
MIXED = {**DECODE, "splitwise_role": "mixed"}
BLOCKS = 4


@pytest.fixture
def signal_owner(signal_name: str) -> Iterator[CacheReadySignal]:
    with CacheReadySignal.create(2, signal_name) as owner:
        yield owner


def cache_manager(signal_name: str, num_cpu_blocks: int = 0, **cache: object):
    """A spawned cache manager that published rank 0's cache: yields (its end of the pipe, its pid)."""
    return engine_processes.spawned_manager(engine_processes.manage, signal_name, BLOCKS, num_cpu_blocks, cache)


def test_a_worker_that_creates_zero_fills_publishes_and_sets_its_slot(cpu, signal_owner) -> None:
    layout = qwen_layout()
    cache = initialize_kv_cache(cpu, kv_request(layout, BLOCKS, instance=signal_owner.name, **MIXED))
    assert cache.created and cache.shared and cache.decision.deciding_term == "none"
    assert cache.names == layout.names() and len(cache.tensors) == 96
    assert [tuple(t.shape) for t in cache.tensors] == [spec.shape(BLOCKS) for spec in layout.tensors]
    assert all(not t.view(paddle.uint8).numpy().any() for t in cache.tensors[:4]), "zero-filled"
    assert signal_owner.slots() == (1, 0)
    publication = f"fd_kv_cache.{signal_owner.name.removeprefix('fd_cache_ready.')}.rank0"
    assert (SHM_DIR / publication).exists()
    cache.clear()
    assert signal_owner.slots() == (0, 0) and not (SHM_DIR / publication).exists() and cache.tensors == []
    cache.clear()  # idempotent


@pytest.mark.slow
def test_a_worker_attaches_zero_copy_to_the_cache_managers_tensors(cpu, signal_owner) -> None:
    layout = qwen_layout()
    with cache_manager(signal_owner.name) as (manager, pid):
        cache = initialize_kv_cache(
            cpu, kv_request(layout, BLOCKS, instance=signal_owner.name, creator_pid=pid, timeout=30, **DECODE)
        )
        assert not cache.created and cache.shared
        assert cache.decision.deciding_term == "splitwise_role"
        assert cache.names == layout.names() and len(cache.tensors) == 96
        assert cache.wait_seconds is not None and cache.attach_seconds is not None
        assert cache.tensors[0][0, 0, 0, 0].item() == 5.0, "the manager's write is seen here"
        cache.tensors[-1][-1, -1, -1, -1] = 7.0
        manager.send(("read", None))
        assert manager.recv() == 7.0, "this process's write is seen by the manager"
        cache.clear()
        assert signal_owner.slots()[0] == 0, "an attacher's clear resets its slot"


@pytest.mark.slow
def test_a_published_tensor_differing_from_the_attachers_layout_is_refused(cpu, signal_owner) -> None:
    with cache_manager(signal_owner.name, block_size=32) as (_, pid), pytest.raises(CacheSharingError) as info:
        initialize_kv_cache(
            cpu, kv_request(qwen_layout(), BLOCKS, instance=signal_owner.name, creator_pid=pid, timeout=30, **DECODE)
        )
    message = str(info.value)
    assert (
        "KV cache tensor key_caches_0_rank0.device0: published as key_caches_0_rank0.device0 [4, 4, 32, 128]" in message
    )
    assert "this process's layout expects key_caches_0_rank0.device0 [4, 4, 64, 128] bfloat16" in message
    assert "Fix: start every process of the engine with the same model" in message


@pytest.mark.slow
def test_the_manager_frees_only_after_the_attacher_let_go(cpu, signal_owner) -> None:
    with cache_manager(signal_owner.name) as (manager, pid):
        cache = initialize_kv_cache(
            cpu, kv_request(qwen_layout(), BLOCKS, instance=signal_owner.name, creator_pid=pid, timeout=30, **DECODE)
        )
        started = time.monotonic()
        manager.send(("clear", 0.3))
        kind, message, ranks = manager.recv()
        assert time.monotonic() - started < 5
        assert kind == "CacheInUseError" and ranks == (0,)
        assert "rank 0's KV cache is still held by its attaching process after 0.3 s, so it was not freed" in message
        assert cache.tensors[0][0, 0, 0, 0].item() == 5.0, "nothing was freed"
        cache.clear()
        manager.send(("clear", 5.0))
        assert manager.recv() == ("cleared", None, None)
        assert signal_owner.slots()[0] == 0


def test_clear_refuses_while_a_tensor_is_still_referenced(cpu, signal_owner) -> None:
    cache = initialize_kv_cache(cpu, kv_request(qwen_layout(), BLOCKS, instance=signal_owner.name, **MIXED))
    kept = cache.tensors[3]
    with pytest.raises(
        BufferInUseError, match=r"KV cache tensor fd_kv\..*value_caches_1_rank0.device0 is still referenced"
    ):
        cache.clear()
    del kept
    cache.clear()
    assert cache.cleared and signal_owner.slots()[0] == 0


def test_a_platform_that_cannot_share_is_refused_when_it_decides(make_plugin, signal_owner) -> None:
    source = (
        "from fd_platforms import hookimpl\nfrom fd_platforms.contract.types import Detection, PlatformIdentity\n"
        "@hookimpl\ndef platform_identity():\n    return PlatformIdentity('noshare', 'cpu', None)\n"
        "@hookimpl\ndef detect_platform():\n    return Detection(True, 'here', 1)\n"
        "@hookimpl\ndef supported_api_versions():\n    return '>=1.0,<2'\n"
    )
    make_plugin("noshare", source=source)
    platform = select_platform({"FD_PLATFORM": "noshare"}).platform
    assert platform.cache_sharing() is None
    started = time.monotonic()
    with pytest.raises(CacheSharingError) as info:
        initialize_kv_cache(
            platform, kv_request(qwen_layout(), BLOCKS, instance=signal_owner.name, timeout=60, **DECODE)
        )
    assert time.monotonic() - started < 5, "refused when deciding, not after waiting"
    message = str(info.value)
    assert (
        "rank 0: the rule decided the workers attach to the cache manager's KV cache (deciding term splitwise_role"
        in message
    )
    assert "platform noshare cannot share KV cache tensors between processes" in message and "Fix: " in message
    created = initialize_kv_cache(platform, kv_request(qwen_layout(), BLOCKS, instance=signal_owner.name, **MIXED))
    assert created.created and not created.shared, "a creator still works: plain tensors, nothing published"
    created.clear()


def test_a_creators_clear_returns_the_cached_memory_to_the_device(make_plugin, signal_owner, tmp_path) -> None:
    """Paddle's allocator keeps freed blocks; FastDeploy's clear calls empty_cache, and so must ours."""
    calls = tmp_path / "released"
    source = (
        "from fd_platforms import hookimpl\nfrom fd_platforms.contract.types import Detection, PlatformIdentity\n"
        "@hookimpl\ndef platform_identity():\n    return PlatformIdentity('keeper', 'cpu', None)\n"
        "@hookimpl\ndef detect_platform():\n    return Detection(True, 'here', 1)\n"
        "@hookimpl\ndef supported_api_versions():\n    return '>=1.0,<2'\n"
        "@hookimpl\ndef release_device_memory(device):\n"
        f"    open({str(calls)!r}, 'a').write(device + '\\n')\n    return 'allocator.empty_cache()'\n"
    )
    make_plugin("keeper", source=source)
    platform = select_platform({"FD_PLATFORM": "keeper"}).platform
    created = initialize_kv_cache(platform, kv_request(qwen_layout(), BLOCKS, instance=signal_owner.name, **MIXED))
    assert not calls.exists(), "nothing released while the cache lives"
    created.clear()
    assert calls.read_text() == "cpu\n", "released once, after the clear"
    created.clear()
    assert calls.read_text() == "cpu\n", "a second clear releases nothing more"
    assert platform.release_device_memory("cpu") == "allocator.empty_cache()"


@pytest.mark.slow
def test_a_profiling_run_makes_its_own_cache_beside_a_published_one(cpu, signal_owner) -> None:
    """FastDeploy's profile run creates a temporary cache: never published, the slot untouched."""
    with cache_manager(signal_owner.name):
        before = signal_owner.slots()
        profiled = initialize_kv_cache(
            cpu, kv_request(qwen_layout(), BLOCKS, instance=signal_owner.name, **{**DECODE, "profile": True})
        )
        assert profiled.created and not profiled.shared and profiled.decision.deciding_term == "profile"
        assert signal_owner.slots() == before
        profiled.clear()
        assert signal_owner.slots() == before, "clearing the profiling cache leaves the manager's slot alone"


@pytest.mark.slow
def test_an_attacher_resets_its_slot_before_it_lets_go(cpu, signal_owner, monkeypatch) -> None:
    """Otherwise a manager waiting to free could publish again in between, and the reset would erase that."""
    from fd_platforms.engine import publication

    with cache_manager(signal_owner.name) as (_, pid):
        cache = initialize_kv_cache(
            cpu, kv_request(qwen_layout(), BLOCKS, instance=signal_owner.name, creator_pid=pid, timeout=30, **DECODE)
        )
        seen: list[tuple[int, ...]] = []
        let_go = publication.Publication.let_go
        monkeypatch.setattr(
            publication.Publication, "let_go", lambda self: (seen.append(signal_owner.slots()), let_go(self))
        )
        cache.clear()
        assert seen and seen[0][0] == 0, "the slot was already reset when the publication was let go"


@pytest.mark.slow
def test_a_dead_cache_manager_ends_the_wait(cpu, signal_owner) -> None:
    ours, theirs = warm.Pipe()
    process = warm.Process(target=time.sleep, args=(60,))
    process.start()
    try:
        threading_kill = time.monotonic()
        os.kill(process.pid, signal.SIGKILL)
        with pytest.raises(CacheNotReadyError, match="exited without setting it"):
            initialize_kv_cache(
                cpu,
                kv_request(
                    qwen_layout(), BLOCKS, instance=signal_owner.name, creator_pid=process.pid, timeout=30, **DECODE
                ),
            )
        assert time.monotonic() - threading_kill < 5
    finally:
        process.join(10)
        ours.close()
        theirs.close()


def memfd_holds(pid: int, name: str) -> list[str]:
    """What process ``pid`` holds of the memfd ``name``: its descriptors and its mappings (a memfd's pages
    are the kernel's to free once no process holds either). Read from that process's /proc, not from a
    host-wide counter that every other test process moves too."""
    marker, held = f"/memfd:{name} ", []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # a descriptor closed while listing
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(marker):
                held.append(f"descriptor {fd}")
    with open(f"/proc/{pid}/maps", encoding="utf-8") as maps:
        held += [f"mapping {line.split()[0]}" for line in maps if marker in line]
    return held


@pytest.mark.slow
def test_memory_comes_back_when_every_holder_is_gone_sigkill_included(cpu) -> None:
    size, name = 256 << 20, "fd_kv.test-hold.blob"
    ours, theirs = warm.Pipe()
    holder = warm.Process(target=engine_processes.export_and_hold, args=(size, theirs))
    holder.start()
    try:
        assert ours.poll(60)
        handle = ours.recv()
        exporter, fd = (int(part) for part in handle.split(":")[1:])
        assert os.stat(f"/proc/{exporter}/fd/{fd}").st_blocks * 512 >= size, "the exported tensor's pages are reserved"
        assert memfd_holds(os.getpid(), name) == []
        opened = cpu.open_cache_tensor(name, handle, (size,), "uint8", "cpu")
        assert opened.tensor[0].item() == 42 and memfd_holds(os.getpid(), name)
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(10)
        assert opened.tensor[0].item() == 42, "this process's mapping keeps the memory alive"
        opened.close()
        assert memfd_holds(os.getpid(), name) == [], "closed: nothing of it is left here, so the kernel frees it"
    finally:
        if holder.is_alive():
            holder.kill()
            holder.join(10)


def open_fds() -> int:
    """This process's descriptors, less those a background thread holds for a moment to look around
    (a /proc file, a directory being listed: the suite's leftover guard does both)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor among them)
        count += not (target.startswith("/proc/") or os.path.isdir(target))
    return count


@pytest.mark.slow
def test_100_clear_and_recreate_cycles_leave_shm_fds_and_rss_flat(cpu, signal_owner) -> None:
    layout = qwen_layout()
    for _ in range(3):  # warm Paddle's and Python's caches before measuring
        creator = initialize_kv_cache(cpu, kv_request(layout, BLOCKS, instance=signal_owner.name, **MIXED))
        creator.clear()
    ours = signal_owner.instance  # other processes on the machine may make entries of their own meanwhile
    gc.collect()  # pipes of earlier tests' processes, closed now rather than in the middle of the count
    entries, fds, rss = {e for e in shm_entries() if ours in e}, open_fds(), resident_bytes()
    for _ in range(100):
        creator = initialize_kv_cache(cpu, kv_request(layout, BLOCKS, instance=signal_owner.name, **MIXED))
        creator.clear()
    assert {e for e in shm_entries() if ours in e} == entries and open_fds() == fds
    assert resident_bytes() - rss <= rss // 100, f"RSS grew {resident_bytes() - rss} bytes over 100 cycles"


def test_an_exporter_holds_one_descriptor_per_tensor_and_an_attacher_none(cpu, signal_owner) -> None:
    layout = qwen_layout()
    gc.collect()
    before = open_fds()
    creator = initialize_kv_cache(cpu, kv_request(layout, BLOCKS, instance=signal_owner.name, **MIXED))
    assert open_fds() - before == len(layout.tensors) + 1, "one memfd per exported tensor, and the publication"
    opened = [
        cpu.open_cache_tensor(
            f"fd_kv.{signal_owner.instance}.{spec.name}", shared.handle, spec.shape(BLOCKS), spec.dtype, "cpu"
        )
        for spec, shared in zip(layout.tensors, creator._shared, strict=True)
    ]
    assert open_fds() - before == len(layout.tensors) + 1, "opening maps without keeping a descriptor"
    for tensor in opened:
        tensor.close()
    creator.clear()
    assert open_fds() == before


@pytest.mark.slow
def test_running_out_of_descriptors_says_how_to_raise_the_limit(tmp_path) -> None:
    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))\n"
        "import fd_platforms\n"
        "platform = fd_platforms.current_platform()\n"
        "held = [platform.export_cache_tensor(f'fd_kv.test-nofile.t{i}', (64,), 'uint8', 'cpu') for i in range(60)]\n"
    )
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "CacheSharingError: KV cache tensor fd_kv.test-nofile.t" in done.stderr
    assert "needs a file descriptor, but this process has used all 40 it may open" in done.stderr
    assert "Fix: raise the limit (ulimit -n" in done.stderr
