"""Calls into a platform (``fd_platforms.loading.platform.Platform``): the caller's bad argument is a ConfigError
naming it before any hook runs; what a plugin's hook gets wrong (a bad record, a close that raises) is a
PluginError naming the plugin."""

from __future__ import annotations

import math

import pytest

from fd_platforms.contract.errors import ConfigError, PluginContractError, PluginError
from fd_platforms.loading.platform import WAIT_MARGIN_SECONDS, _bound
from fd_platforms.loading.selection import select_platform
from fd_platforms.rules.config import CacheConfig, ModelConfig, ParallelConfig
from fd_platforms.rules.layout import build_layout

LAYOUT = build_layout(ModelConfig("m", 2, 8, 8, 64), CacheConfig(), ParallelConfig())


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda p: p.wait_cache_ready("fd_cache_ready.x", 0, creator_pid=2**40), "creator_pid"),
        (lambda p: p.wait_cache_ready("fd_cache_ready.x", 0, creator_pid=True), "creator_pid"),
        (lambda p: p.wait_cache_ready("fd_cache_ready.x", -1), "rank"),
        (lambda p: p.wait_cache_ready("../etc/passwd", 0), "signal_name"),
        (lambda p: p.wait_cache_ready("fd_cache_ready.x", 0, timeout=1e9), "timeout"),
        (lambda p: p.max_num_blocks(layout="x", cache=CacheConfig()), "layout"),
        (lambda p: p.max_num_blocks(layout=LAYOUT, cache={"block_size": 64}), "cache"),
        (lambda p: p.max_num_blocks(layout=LAYOUT, cache=CacheConfig(), memory=80), "memory"),
        (lambda p: p.max_num_blocks(layout=LAYOUT, cache=CacheConfig(), non_cache_bytes=-1), "non_cache_bytes"),
        (lambda p: p.max_num_blocks(layout=LAYOUT, cache=CacheConfig(), non_cache_bytes=1.5), "non_cache_bytes"),
        (lambda p: p.max_num_blocks(layout=LAYOUT, cache=CacheConfig(), host_memory="lots"), "host_memory"),
        (lambda p: p.device_memory("0"), "device_id"),
        (lambda p: p.device_memory(-1), "device_id"),
        (lambda p: p.host_alloc(10, require_pinned="no"), "require_pinned"),
        (lambda p: p.host_alloc(10.0), "nbytes"),
        (lambda p: p.host_alloc(2**80), "nbytes"),
        (
            lambda p: p.should_create_cache_tensor(
                profile=False, num_cpu_blocks=10**5000, storage_backend=None, splitwise_role="mixed"
            ),
            "num_cpu_blocks",
        ),
        (
            lambda p: p.should_create_cache_tensor(
                profile="yes", num_cpu_blocks=0, storage_backend=None, splitwise_role="mixed"
            ),
            "profile",
        ),
    ],
)
def test_platform_calls_blame_the_callers_argument(cpu, call, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        call(cpu)
    assert info.value.field == field and not isinstance(info.value, PluginError)
    assert "Fix:" in str(info.value) and len(str(info.value)) < 600


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (
            lambda p: p.export_cache_tensor("fd_kv.x.t", (2, 2), "uint8", "gpu:7"),
            "device='gpu:7' is not valid; allowed: a device of platform cpu (cpu)",
        ),
        (lambda p: p.export_cache_tensor("fd_kv.x.t", (2, 2), "uint8", "cpu:3"), "device='cpu:3' is not valid"),
        (
            lambda p: p.open_cache_tensor("fd_kv.x.t", "memfd:1:1", (2, 2), "uint8", "npu:0"),
            "device='npu:0' is not valid",
        ),
    ],
    ids=["export-gpu:7", "export-cpu:3", "open-npu:0"],
)
def test_a_cache_tensor_on_a_device_of_another_platform_is_refused_naming_it(cpu, call, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        call(cpu)
    assert says in str(info.value) and "Fix:" in str(info.value)


def test_a_plugin_hook_never_runs_on_a_bad_argument(make_plugin) -> None:
    source = (
        "from fd_platforms import hookimpl\nfrom fd_platforms.contract.types import Detection, PlatformIdentity\n"
        "CALLS = []\n"
        "@hookimpl\ndef platform_identity():\n    return PlatformIdentity('spy', 'spy', None)\n"
        "@hookimpl\ndef detect_platform():\n    return Detection(True, 'here', 1)\n"
        "@hookimpl\ndef supported_api_versions():\n    return '>=1.0,<2'\n"
        "@hookimpl\ndef device_memory(device_id):\n"
        "    CALLS.append(device_id)\n    raise RuntimeError('reached')\n"
        "@hookimpl\ndef host_alloc(nbytes, require_pinned):\n"
        "    CALLS.append(nbytes)\n    raise RuntimeError('reached')\n"
    )
    make_plugin("spy", source=source)
    platform = select_platform({"FD_PLATFORM": "spy"}).platform
    for call in (
        lambda: platform.device_memory(-1),
        lambda: platform.host_alloc(0),
        lambda: platform.host_alloc(8, require_pinned=1),
    ):
        with pytest.raises(ConfigError):
            call()
    import fd_test_plugin_fd_test_spy as spy  # type: ignore[import-not-found]

    assert spy.CALLS == []
    with pytest.raises(PluginError, match="hook device_memory raised RuntimeError: reached"):
        platform.device_memory(0)  # a good argument reaches the plugin, whose failure is its own


def test_a_plugin_building_a_bad_record_is_its_contract_error(make_plugin) -> None:
    source = (
        "from fd_platforms import hookimpl\n"
        "from fd_platforms.contract.types import Detection, DeviceMemory, PlatformIdentity\n"
        "@hookimpl\ndef platform_identity():\n    return PlatformIdentity('sloppy', 'sloppy', None)\n"
        "@hookimpl\ndef detect_platform():\n    return Detection(True, 'here', 1)\n"
        "@hookimpl\ndef supported_api_versions():\n    return '>=1.0,<2'\n"
        "@hookimpl\ndef device_memory(device_id):\n    return DeviceMemory('80GiB', None, None, 'sloppy')\n"
    )
    make_plugin("sloppy", source=source)
    platform = select_platform({"FD_PLATFORM": "sloppy"}).platform
    with pytest.raises(PluginError) as info:
        platform.device_memory(0)
    message = str(info.value)
    assert "platform plugin 'sloppy' (distribution fd-test-sloppy): hook device_memory built a bad record" in message
    assert "DeviceMemory.total_bytes='80GiB'" in message


def test_a_shared_tensors_close_that_raises_is_blamed_on_the_plugin(make_plugin) -> None:
    source = """
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, PlatformIdentity, SharedTensor
from fd_platforms.kit.host_sharing import export_host_tensor

@hookimpl
def platform_identity():
    return PlatformIdentity("badclose", "cpu", None)

@hookimpl
def detect_platform():
    return Detection(True, "here", 1)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"

@hookimpl
def cache_sharing():
    return "memfds whose close fails"

@hookimpl
def export_cache_tensor(name, shape, dtype, device):
    shared = export_host_tensor(name, shape, dtype)
    def close():
        shared.close()
        raise RuntimeError("the driver lost the handle")
    return SharedTensor(shared.name, shared.tensor, shared.handle, shared.nbytes, True, close)
"""
    make_plugin("badclose", source=source)
    platform = select_platform({"FD_PLATFORM": "badclose"}).platform
    shared = platform.export_cache_tensor("fd_kv.test-badclose.t", (2, 8), "uint8", "cpu")
    with pytest.raises(PluginError) as info:
        shared.close()
    assert str(info.value).startswith("platform plugin 'badclose' (distribution fd-test-badclose): closing KV cache")
    assert "RuntimeError: the driver lost the handle" in str(info.value)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (("../fd_kv", (2, 2), "uint8", "cpu"), "name"),
        (("x" * 250, (2, 2), "uint8", "cpu"), "name"),
        (("fd_kv.x.t", (2, -2), "uint8", "cpu"), "shape"),
        (("fd_kv.x.t", "2x2", "uint8", "cpu"), "shape"),
        (("fd_kv.x.t", (2, 2), "int3", "cpu"), "dtype"),
        (("fd_kv.x.t", (2, 2), "uint8", ""), "device"),
        (("fd_kv.x.t", (2, 2), "uint8", 0), "device"),
    ],
    ids=["name-path", "name-long", "shape-negative", "shape-text", "dtype", "device-empty", "device-int"],
)
def test_a_bad_cache_tensor_request_is_the_callers_error_naming_the_field(cpu, request_: tuple, field: str) -> None:
    for call in (
        lambda: cpu.export_cache_tensor(*request_),
        lambda: cpu.open_cache_tensor(request_[0], "memfd:1:1", *request_[1:]),
    ):
        with pytest.raises(ConfigError) as info:
            call()
        assert info.value.field == field and not isinstance(info.value, PluginError)
        assert "Fix:" in str(info.value)


@pytest.mark.parametrize("handle", ["", None, 7])
def test_opening_a_cache_tensor_without_a_handle_names_the_handle(cpu, handle: object) -> None:
    with pytest.raises(ConfigError) as info:
        cpu.open_cache_tensor("fd_kv.x.t", handle, (2, 2), "uint8", "cpu")  # type: ignore[arg-type]
    assert info.value.field == "handle" and "pass the published handle" in str(info.value)


def test_a_list_shape_is_taken_as_the_tuple_it_stands_for(cpu) -> None:
    shared = cpu.export_cache_tensor("fd_kv.test-list-shape.t", [2, 3], "uint8", "cpu")  # type: ignore[arg-type]
    try:
        assert tuple(shared.tensor.shape) == (2, 3)
    finally:
        shared.close()


LIAR = """
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, PlatformIdentity, SharedTensor
from fd_platforms.kit.host_memory import allocate_pageable
from fd_platforms.kit.host_sharing import export_host_tensor

CLOSED = []

@hookimpl
def platform_identity():
    return PlatformIdentity("liar", "cpu", None)

@hookimpl
def detect_platform():
    return Detection(True, "here", 1)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"

@hookimpl
def wait_cache_ready(signal_name, rank, timeout, creator_pid):
    return -1.0

@hookimpl
def host_alloc(nbytes, require_pinned):
    return allocate_pageable(nbytes // 2)

@hookimpl
def cache_sharing():
    return "   "

@hookimpl
def export_cache_tensor(name, shape, dtype, device):
    shared = export_host_tensor(name, (shape[0] + 1, *shape[1:]), dtype)
    def close():
        CLOSED.append(name)
        shared.close()
    return SharedTensor(shared.name, shared.tensor, shared.handle, shared.nbytes, True, close)
"""


def test_a_plugin_answering_outside_its_contract_is_refused_naming_plugin_and_hook(make_plugin) -> None:
    """Each answer is checked on every call: a negative wait, fewer bytes than asked, blank text, a tensor of
    another shape (closed before it is refused, so nothing it holds leaks)."""
    make_plugin("liar", source=LIAR)
    platform = select_platform({"FD_PLATFORM": "liar"}).platform
    prefix = "platform plugin 'liar' (distribution fd-test-liar): "
    for call, says in (
        (lambda: platform.wait_cache_ready("fd_cache_ready.x", 0, timeout=1), "hook wait_cache_ready returned -1.0"),
        (lambda: platform.host_alloc(64), "hook host_alloc returned 32 bytes, pinned=False, for a request of 64"),
        (platform.cache_sharing, "hook cache_sharing returned '   '; it must return a sentence or None"),
        (
            lambda: platform.export_cache_tensor("fd_kv.test-liar.t", (2, 8), "uint8", "cpu"),
            "export_cache_tensor returned fd_kv.test-liar.t [3, 8] uint8 (exported=True) for fd_kv.test-liar.t [2, 8]",
        ),
    ):
        with pytest.raises(PluginContractError) as info:
            call()
        assert str(info.value).startswith(prefix) and says in str(info.value), str(info.value)
    import fd_test_plugin_fd_test_liar as liar  # type: ignore[import-not-found]

    assert liar.CLOSED == ["fd_kv.test-liar.t"]


@pytest.mark.parametrize(
    ("alloc_timeout", "wait_timeout", "seconds"),
    [("0", 3.0, None), ("600", math.inf, None), ("600", 3.0, 3.0 + WAIT_MARGIN_SECONDS), (None, 1.5, 6.5)],
    ids=["allocations-unbounded", "wait-without-limit", "wait-and-margin", "default"],
)
def test_a_plugins_own_wait_is_bounded_by_its_timeout_and_a_margin(
    monkeypatch: pytest.MonkeyPatch, alloc_timeout: str | None, wait_timeout: float, seconds: float | None
) -> None:
    if alloc_timeout is None:
        monkeypatch.delenv("FD_PLATFORM_ALLOC_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("FD_PLATFORM_ALLOC_TIMEOUT", alloc_timeout)
    assert _bound("wait_cache_ready", {"timeout": wait_timeout}).seconds == seconds
