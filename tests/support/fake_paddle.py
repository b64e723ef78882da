"""A fake ``paddle`` for device facts: each Paddle build's calls as the facts classes declare them, over fake
device memory with Paddle's device IPC (:class:`FakeIpc`), and the in-repo platforms registered on it."""

from __future__ import annotations

import ctypes
import dataclasses
import math
from collections.abc import Callable
from importlib import metadata
from types import SimpleNamespace
from typing import Any

import fd_platforms_cuda
import fd_platforms_dcu
import fd_platforms_gcu
import fd_platforms_iluvatar
import fd_platforms_intel_hpu
import fd_platforms_metax
import fd_platforms_npu
import fd_platforms_xpu
from fd_platforms.contract.types import DTYPE_BYTES
from fd_platforms.kit.allocator_flags import VMM_V1
from fd_platforms.kit.custom_device import CustomDeviceFacts
from fd_platforms.kit.device_facts import PADDLE_UINT8, DeviceFacts
from fd_platforms.kit.paddle_platform import PaddlePlatform
from fd_platforms.kit.rocm import RocmFacts
from fd_platforms.loading.discovery import Candidate
from fd_platforms.loading.platform import Platform, register_platform

PLATFORMS = {
    "cuda": fd_platforms_cuda.PLATFORM,
    "xpu": fd_platforms_xpu.PLATFORM,
    "iluvatar": fd_platforms_iluvatar.PLATFORM,
    "metax": fd_platforms_metax.PLATFORM,
    "dcu": fd_platforms_dcu.PLATFORM,
    "gcu": fd_platforms_gcu.PLATFORM,
    "intel_hpu": fd_platforms_intel_hpu.PLATFORM,
    "npu": fd_platforms_npu.PLATFORM,
}


CUSTOM = ["iluvatar", "metax", "gcu", "intel_hpu", "npu"]


GiB = 2**30


def fake_paddle(facts: type[DeviceFacts], **calls: Any) -> SimpleNamespace:
    """A ``paddle`` stand-in (of the device's own build) with exactly ``facts.paddle_calls`` and
    ``facts.device_build_calls`` (``device__cuda__device_count=...``)."""
    named = {name.replace("___", "._").replace("__", "."): value for name, value in calls.items()}
    declared = {*facts.paddle_calls, *facts.device_build_calls}
    assert declared <= set(named) <= declared | set(facts.optional_build_calls), "the fake holds the declared calls"
    root = SimpleNamespace()
    for dotted, value in named.items():
        node = root
        *parents, leaf = dotted.split(".")
        for part in parents:
            if not hasattr(node, part):
                setattr(node, part, SimpleNamespace())
            node = getattr(node, part)
        setattr(node, leaf, value)
    return root


class FakeTensor:
    """A uint8 'tensor' over real memory, as paddle.empty would return one."""

    def __init__(self, nbytes: int) -> None:
        self.memory = (ctypes.c_uint8 * nbytes)()

    def data_ptr(self) -> int:
        return ctypes.addressof(self.memory)


def no_pinned_place() -> None:
    raise RuntimeError("(PermissionDenied) Cannot use CUDAPinnedPlace in CPU only version")


class IpcTensor(SimpleNamespace):
    """A tensor over one of :class:`FakeIpc`'s allocations, viewed as ``dtype``."""

    @property
    def shape(self) -> list[int]:
        *outer, inner = self.byte_shape()
        return [*outer, inner // DTYPE_BYTES[self.dtype]]


class FakeIpc:
    """Paddle's device IPC as the CUDA/XPU builds offer it, over one dict of 'device allocations'.

    ``zeros`` allocates (each allocation at a device address of its own, a tensor's ``data_ptr()``); a
    DenseTensor's ``_share_<kind>`` gives the metadata tuple Paddle gives
    (handle bytes, offset, size, dtype index, dims, lod, device) — with ``vmm`` (Paddle's VMM
    allocator on) the 5 fields (blob, dtype index, dims, lod, device) where ``vmm_ipc``, else still
    the legacy 7 — and, as Paddle does, labels it with the *current* device; ``_new_shared_<kind>``
    opens it onto the same allocation, as another process would, recording the current device it
    opened on. ``current`` is the current device, ``switches`` every switch.

    ``flags`` are the build's allocator flags and their values (default: VMM V1's, ``vmm``; a name left out is one
    the build lacks, which ``get_flags`` refuses as Paddle does), ``defaults`` their compiled defaults (default:
    off), as Paddle's flag registry (``base.core.globals()``) gives them.
    """

    def __init__(
        self,
        kind: str,
        *,
        vmm: bool = False,
        vmm_ipc: bool = True,
        offset: int = 0,
        flags: dict[str, bool] | None = None,
        defaults: dict[str, bool] | None = None,
    ) -> None:
        self.kind, self.allocations, self.shapes, self.current, self.switches = kind, {}, {}, 0, []
        self.flags = {VMM_V1.name: vmm} if flags is None else dict(flags)
        self.defaults = {**dict.fromkeys(self.flags, False), **(defaults or {})}
        self.vmm, self.vmm_ipc, self.opened_on, self.exported_on = self.flags.get(VMM_V1.name, False), vmm_ipc, [], []
        self.offset, self.opened_with = offset, []

    @staticmethod
    def key(index: int) -> bytes:
        """Allocation ``index``'s handle: 64 bytes, binary (as a cudaIpcMemHandle_t is)."""
        return (b"\xc7" + f"fake-ipc-{index}".encode()).ljust(64, b"\0")

    def address(self, key: bytes) -> int:
        """The device address of the allocation ``key`` names (a 4 GiB slot of its own)."""
        return 0x7F00_0000_0000 + list(self.allocations).index(key) * 2**32

    def dense(self, key: bytes | None) -> SimpleNamespace:
        dense = SimpleNamespace(key=key)
        dense._share_data_with = lambda other: setattr(dense, "key", other.key)

        def share() -> tuple[Any, ...]:
            self.exported_on.append(self.current)
            size = len(self.allocations[dense.key])
            if self.vmm and self.vmm_ipc:
                return (dense.key, PADDLE_UINT8, [size], [], self.current)
            return (dense.key, self.offset, size, PADDLE_UINT8, [size], [], self.current)

        setattr(dense, f"_share_{self.kind}", share)
        return dense

    def tensor(self, key: bytes | None, dtype: str = "uint8") -> IpcTensor:
        dense = self.dense(key)
        return IpcTensor(
            get_tensor=lambda: dense,
            dtype=dtype,
            memory=lambda: self.allocations[dense.key],
            view=lambda new: self.tensor(dense.key, new),
            data_ptr=lambda: self.address(dense.key),
            byte_shape=lambda: self.shapes[dense.key],
        )

    def zeros(self, shape: list[int], dtype: str, device: str) -> IpcTensor:
        key = self.key(len(self.allocations))
        self.allocations[key], self.shapes[key] = bytearray(math.prod(shape)), list(shape)
        return self.tensor(key)

    def new_shared(self, metadata: tuple[Any, ...]) -> SimpleNamespace:
        self.opened_on.append(self.current)
        self.opened_with.append(metadata)
        return self.dense(metadata[0])

    def get_flags(self, names: list[str]) -> dict[str, Any]:
        for name in names:
            if name not in self.flags:
                raise ValueError(f"Flag {name} cannot get its value through this function.")  # as Paddle's
        return {name: self.flags[name] for name in names}

    def globals(self) -> SimpleNamespace:
        """Paddle's flag registry: ``get_default`` is a flag's compiled default (None for a name it lacks)."""
        return SimpleNamespace(get_default=lambda name: self.defaults.get(name) if name in self.flags else None)

    def empty_cache(self) -> None:
        self.emptied = getattr(self, "emptied", 0) + 1

    def set_current(self, device: int) -> None:
        self.switches.append(device)
        self.current = device


def cuda_paddle(
    compiled: bool = True,
    rocm: bool = False,
    count: int = 8,
    empty: Callable[..., Any] | None = None,
    ipc: FakeIpc | None = None,
) -> SimpleNamespace:
    ipc = ipc or FakeIpc("cuda")
    return fake_paddle(
        fd_platforms_cuda.CudaFacts,
        is_compiled_with_cuda=lambda: compiled,
        is_compiled_with_rocm=lambda: rocm,
        device__cuda__device_count=lambda: count,
        cuda__mem_get_info=lambda device: (70 * GiB + device, 80 * GiB),
        device__cuda__max_memory_allocated=lambda device: 3 * GiB,
        CUDAPinnedPlace=(lambda: "pinned") if compiled else no_pinned_place,
        empty=empty or (lambda shape, dtype, device: FakeTensor(shape[0])),
        zeros=ipc.zeros,
        base__core__eager__Tensor=lambda: ipc.tensor(None),
        base__core__DenseTensor___share_cuda=lambda dense: dense._share_cuda(),
        base__core__DenseTensor___new_shared_cuda=ipc.new_shared,
        base__core__get_cuda_current_device_id=lambda: ipc.current,
        base__core__set_cuda_current_device_id=ipc.set_current,
        get_flags=ipc.get_flags,
        base__core__globals=ipc.globals,
        device__cuda__empty_cache=ipc.empty_cache,
    )


def xpu_paddle(
    compiled: bool = True, count: int = 8, ipc: FakeIpc | None = None, can_switch: bool = True
) -> SimpleNamespace:
    ipc = ipc or FakeIpc("xpu")
    switch = {"base__core__set_xpu_current_device_id": ipc.set_current} if can_switch else {}
    return fake_paddle(
        fd_platforms_xpu.XpuFacts,
        is_compiled_with_xpu=lambda: compiled,
        device__xpu__device_count=lambda: count,
        device__xpu__memory_total=lambda device: 96 * GiB,
        device__xpu__memory_used=lambda device: 10 * GiB,
        device__xpu__max_memory_allocated=lambda device: 2 * GiB,
        XPUPinnedPlace=lambda: "xpu_pinned",
        empty=lambda shape, dtype, device: FakeTensor(shape[0]),
        zeros=ipc.zeros,
        base__core__eager__Tensor=lambda: ipc.tensor(None),
        base__core__DenseTensor___share_xpu=lambda dense: dense._share_xpu(),
        base__core__DenseTensor___new_shared_xpu=ipc.new_shared,
        base__core__get_xpu_current_device_id=lambda: ipc.current,
        device__xpu__empty_cache=ipc.empty_cache,
        **switch,
    )


def rocm_paddle(rocm: bool = True, count: int = 8, empty: Callable[..., Any] | None = None) -> SimpleNamespace:
    """Paddle's ROCm build (``rocm=False``: any other build, whose ``paddle.device.cuda`` calls exist too)."""
    emptied: list[int] = []
    paddle = fake_paddle(
        RocmFacts,
        is_compiled_with_rocm=lambda: rocm,
        device__cuda__device_count=lambda: count,
        device__cuda__get_device_properties=lambda device: SimpleNamespace(total_memory=64 * GiB + device),
        device__cuda__max_memory_allocated=lambda device: 5 * GiB,
        CUDAPinnedPlace=(lambda: "pinned") if rocm else no_pinned_place,
        empty=empty or (lambda shape, dtype, device: FakeTensor(shape[0])),
        device__cuda__empty_cache=lambda: emptied.append(1),
    )
    paddle.emptied = emptied
    return paddle


def custom_paddle(types: list[str], count: int = 2) -> SimpleNamespace:
    return fake_paddle(
        CustomDeviceFacts,
        device__get_all_custom_device_type=lambda: types,
        device__device_count=lambda device_type: count,
        base__core__get_device_properties=lambda device_type, device_id: SimpleNamespace(total_memory=64 * GiB),
        device__max_memory_allocated=lambda place: GiB,
        # sharing goes through the vendor runtime and the foreign-tensor operator (tests/kit/test_vendor_device.py)
        empty=_not_here,
        utils__cpp_extension__load_op_meta_info_and_register_op=_not_here,
        _C_ops___run_custom_op=_not_here,
    )


def _not_here(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("this test does not share a custom device's tensors")


def facts_of(name: str, paddle: SimpleNamespace) -> DeviceFacts:
    platform = PLATFORMS[name]
    return platform.facts(paddle, platform.device_type, platform.visible_devices_env, platform.host_runtime)


def with_paddle(name: str, paddle: SimpleNamespace) -> PaddlePlatform:
    return dataclasses.replace(PLATFORMS[name], load_paddle=lambda: paddle)


def registered(name: str, paddle: SimpleNamespace) -> Platform:
    """The in-repo platform ``name`` on ``paddle``, registered as the engine selects a platform."""
    entry_point = metadata.EntryPoint(name=name, value=f"fd_platforms_{name}:PLATFORM", group="fd_platforms")
    candidate = Candidate(name, entry_point, f"fd-platforms-{name}", "0", False)
    return register_platform(candidate, with_paddle(name, paddle))
