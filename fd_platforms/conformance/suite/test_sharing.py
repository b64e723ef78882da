"""Sharing the KV cache between processes: declared as a fact, real where declared, refused where not.

A platform either says how a cache tensor crosses processes (``cache_sharing``) and then exports
zero-filled tensors that another process opens zero-copy, or declares that it cannot, and then a
worker the rule sends to attach is refused when it decides — never after a wait.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ...contract.errors import CacheSharingError
from ...engine import CacheRequest, initialize_kv_cache
from ...ipc.cache_signal import CacheReadySignal, new_signal_name
from ...kit.device_facts import write_element
from ...loading.platform import Platform
from . import hooks, small_layout

OPEN_IN_ANOTHER_PROCESS = """
import os, sys
from fd_platforms.kit.device_facts import write_element
from fd_platforms.loading.selection import select_platform
platform = select_platform({"FD_PLATFORM": sys.argv[1]}).platform
opened = platform.open_cache_tensor(sys.argv[2], sys.argv[3], (4, 16), "uint8", sys.argv[4])
print(opened.tensor[1, 2].item())
write_element(opened.tensor, (3, 4), 91)
opened.close()
"""
EXPORT_AND_EXIT = """
import sys
from fd_platforms.loading.selection import select_platform
platform = select_platform({"FD_PLATFORM": sys.argv[1]}).platform
print(platform.export_cache_tensor(sys.argv[2], (4, 16), "uint8", sys.argv[3]).handle)
"""


@pytest.fixture
def signal() -> Iterator[CacheReadySignal]:
    with CacheReadySignal.create(1, new_signal_name()) as created:
        yield created


@hooks("cache_sharing")
def test_sharing_is_declared_as_a_sentence_or_none(fd_platform: Platform) -> None:
    sharing = fd_platform.cache_sharing()
    assert sharing is None or (isinstance(sharing, str) and len(sharing.split()) >= 3), (
        f"cache_sharing must name the mechanism in words, or be None: got {sharing!r}"
    )


@hooks("cache_sharing", "should_create_cache_tensor")
def test_a_platform_that_cannot_share_refuses_an_attaching_worker_when_it_decides(
    fd_platform: Platform, signal: CacheReadySignal, request: pytest.FixtureRequest
) -> None:
    if fd_platform.cache_sharing() is not None:
        pytest.skip(f"{fd_platform.name} shares cache tensors between processes")
    request.getfixturevalue("fd_paddle")  # the engine API imports paddle before it decides
    started = time.monotonic()
    with pytest.raises(CacheSharingError, match=r"deciding term splitwise_role.*cannot share KV cache tensors"):
        decode = CacheRequest(
            layout=small_layout(),
            num_blocks=2,
            num_cpu_blocks=0,
            splitwise_role="decode",  # the rule sends a decode worker to attach
            instance=signal.name,
            timeout=60,
        )
        initialize_kv_cache(fd_platform, decode)
    assert time.monotonic() - started < 10, "refused when deciding, not after waiting for the cache"


@pytest.fixture
def shareable(fd_platform: Platform) -> Platform:
    if fd_platform.cache_sharing() is None:
        pytest.skip(f"{fd_platform.name} declares no cache sharing: workers always create their own cache")
    return fd_platform


@pytest.fixture
def device(shareable: Platform, request: pytest.FixtureRequest) -> str:
    """Device 0 of the platform; away from cpu the hardware must be here, and everywhere paddle."""
    if shareable.identity.device_type != "cpu":
        request.getfixturevalue("fd_platform_hardware")
    request.getfixturevalue("fd_paddle")
    return shareable.identity.device_string(0)


@hooks("export_cache_tensor", "open_cache_tensor")
def test_an_exported_tensor_is_zero_filled_and_opened_zero_copy_by_another_process(
    shareable: Platform, device: str
) -> None:
    name = f"fd_kv.conformance-{os.getpid()}.blob"
    shared = shareable.export_cache_tensor(name, (4, 16), "uint8", device)
    try:
        assert shared.exported and shared.nbytes == 64 and list(shared.tensor.shape) == [4, 16]
        assert shared.tensor[2, 3].item() == 0, "exported tensors are zero-filled"
        write_element(shared.tensor, (1, 2), 37)  # into its own memory on every device
        printed = _run(OPEN_IN_ANOTHER_PROCESS, shareable.name, name, shared.handle, device)
        assert printed.split()[-1] == "37", "the other process reads what this one wrote"
        assert shared.tensor[3, 4].item() == 91, "this process reads what the other one wrote"
    finally:
        shared.close()


@hooks("export_cache_tensor", "open_cache_tensor")
def test_a_handle_whose_exporter_is_gone_is_a_sharing_error(shareable: Platform, device: str) -> None:
    name = f"fd_kv.conformance-{os.getpid()}.gone"
    handle = _run(EXPORT_AND_EXIT, shareable.name, name, device).split()[-1]
    with pytest.raises(CacheSharingError, match=name.replace(".", r"\.")):
        shareable.open_cache_tensor(name, handle, (4, 16), "uint8", device)


def _run(script: str, *args: str) -> str:
    """What ``script`` printed, run with ``args`` in another Python process, which must succeed."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
