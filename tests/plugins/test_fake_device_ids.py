"""Two device ids end to end on the fake Paddle custom device (Iluvatar, MetaX): an engine whose visible devices
are ``4,5`` names its tensors ``.device4``/``.device5`` and places them on its local devices 0 and 1; a cache
manager that sees every device attaches to them on devices 4 and 5, by their physical ids.

That is FastDeploy's arrangement: its worker names with ``device_ids[local_rank]`` (the visible-devices
variable's entry) and places on ``<type>:{local_rank}`` (``fastdeploy/worker/gpu_worker.py``,
``fastdeploy/worker/metax_worker.py`` ``init_device``; ``fastdeploy/config.py`` ``FDConfig.__init__``), while
its cache transfer manager, started without the variable, works on ``gpu:{device_id}``
(``fastdeploy/cache_manager/cache_transfer_manager.py`` ``_init_gpu_cache``). The fake runtime does not read
the visible-devices variable, so each process is given as many devices as it would see
(``FAKE_DEVICE_COUNT``: 2 for the worker, 6 for the manager); ``fake_device_of`` of the fake vendor runtime
says which device each tensor's memory really is on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from run_helpers import ROOT, clean_env

from fd_platforms.ipc.cache_signal import CacheReadySignal

pytestmark = pytest.mark.slow  # multi-process: left out of -m "not slow"

CASES = {
    "iluvatar": ("iluvatar_gpu", "CUDA_VISIBLE_DEVICES", "libcudart.so"),
    "metax": ("metax_gpu", "MACA_VISIBLE_DEVICES", "libmcruntime.so"),
}

# Both processes: argv = role, signal name, vendor library, then the worker's pid (the manager only).
SCRIPT = textwrap.dedent(
    """
    import ctypes, json, sys
    import fd_platforms
    from fd_platforms.conformance.suite import SMALL_MODEL
    from fd_platforms.engine import CacheRequest, initialize_kv_cache, manage_kv_cache
    from fd_platforms.lifecycle.tokens import read_tokens, write_tokens
    from fd_platforms.rules.config import CacheConfig, ParallelConfig
    from fd_platforms.rules.devices import physical_device_id
    from fd_platforms.rules.layout import build_layout

    role, signal_name, library = sys.argv[1:4]
    platform = fd_platforms.current_platform()
    vendor = ctypes.CDLL(library)
    vendor.fake_device_of.argtypes = [ctypes.c_void_p]
    SWAP = dict(num_cpu_blocks=2, storage_backend=None, splitwise_role="mixed", rule="2026-04")

    def facts(cache):
        return {"names": list(cache.names[:2]), "device": cache.device,
                "places": sorted({str(tensor.place) for tensor in cache.tensors}),
                "memory_on": sorted({vendor.fake_device_of(tensor.data_ptr()) for tensor in cache.tensors})}

    caches, out = [], {}
    for rank in (0, 1):
        if role == "worker":  # names with the visible entry, lives on the local device
            local = rank
            layout = build_layout(SMALL_MODEL, CacheConfig(block_size=16), ParallelConfig(2, rank),
                                  device_id=physical_device_id(platform.identity, local), local_device=local)
            request = CacheRequest(layout=layout, num_blocks=2, instance=signal_name, **SWAP)
            cache = initialize_kv_cache(platform, request)
            write_tokens(cache.tensors, 7, last=False)
            out[rank] = {**facts(cache), "created": cache.created}
        else:  # sees every device: attaches on the physical one the names carry
            physical = int(sys.argv[5 + rank])
            layout = build_layout(SMALL_MODEL, CacheConfig(block_size=16), ParallelConfig(2, rank),
                                  device_id=physical, local_device=physical_device_id(platform.identity, physical))
            cache = manage_kv_cache(platform, CacheRequest(layout=layout, num_blocks=2, instance=signal_name,
                                                           creator_pid=int(sys.argv[4]), timeout=30, **SWAP))
            out[rank] = {**facts(cache.kv_cache), "created": cache.created,
                         "tokens": read_tokens(cache.kv_cache.tensors, 7)}
        caches.append(cache)
    print("RESULT " + json.dumps(out), flush=True)
    if role == "worker":
        sys.stdin.readline()  # the manager let go
    for cache in caches:
        cache.clear(30)
    """
)


def result(process: subprocess.Popen[str], what: str) -> dict[str, object]:
    """The RESULT line ``process`` prints (its output shown if it fails first)."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    process.wait(30)
    errors = process.stderr.read() if process.stderr is not None else ""
    pytest.fail(f"the {what} ended without a result (rc={process.returncode}):\n{errors}")


@pytest.mark.parametrize("name", CASES)
def test_tensors_are_named_by_the_visible_device_and_live_on_the_local_one(
    name: str, fake_device_root, fake_vendor_runtime: Path, signal_name: str
) -> None:
    device_type, visible, library = CASES[name]
    base = clean_env(
        FD_PLATFORM=name,
        CUSTOM_DEVICE_ROOT=str(fake_device_root(device_type)),
        FLAGS_allocator_strategy="auto_growth",
        FAKE_DEVICE_TOTAL_MEMORY=str(2**30),
        LD_LIBRARY_PATH=str(fake_vendor_runtime),
    )
    base = {key: value for key, value in base.items() if key != visible}
    command = [sys.executable, "-c", SCRIPT]
    with CacheReadySignal.create(2, signal_name):
        worker = subprocess.Popen(
            [*command, "worker", signal_name, library],
            env={**base, visible: "4,5", "FAKE_DEVICE_COUNT": "2"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            created = result(worker, "worker")
            manager = subprocess.run(
                [*command, "manager", signal_name, library, str(worker.pid), "4", "5"],
                env={**base, "FAKE_DEVICE_COUNT": "6"},
                capture_output=True,
                text=True,
                cwd=ROOT,
                timeout=120,
            )
            assert manager.returncode == 0, manager.stderr
            held = json.loads(manager.stdout.split("RESULT ", 1)[1])
            worker.communicate("\n", timeout=60)
            assert worker.returncode == 0, worker.stderr
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    for rank, physical in ((0, 4), (1, 5)):
        names = [f"key_caches_0_rank{rank}.device{physical}", f"value_caches_0_rank{rank}.device{physical}"]
        assert created[str(rank)] == {
            "names": names,
            "device": f"{device_type}:{rank}",
            "created": True,
            "places": [f"Place({device_type}:{rank})"],
            "memory_on": [rank],
        }
        assert held[str(rank)] == {
            "names": names,
            "device": f"{device_type}:{physical}",
            "created": False,
            "places": [f"Place({device_type}:{physical})"],
            "memory_on": [physical],
            "tokens": True,
        }
    assert not os.path.exists(f"/dev/shm/{signal_name}")
