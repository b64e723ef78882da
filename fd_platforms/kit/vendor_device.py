"""A vendor runtime's device memory and its IPC, called through ``ctypes`` (the CUDA runtime's shape).

Paddle has no IPC for custom devices, but the vendors' runtimes do, with CUDA's calls under their
own prefix: MetaX's ``libmcruntime.so`` has ``mcMalloc``, ``mcIpcGetMemHandle``,
``mcIpcOpenMemHandle``, ...; Iluvatar CoreX's ``libcudart.so`` has ``cudaMalloc``, ... . FastDeploy's
MetaX build shares its cache through the same calls. A cache tensor to be shared is allocated with
the runtime's ``Malloc`` (so it is the base of its own allocation, which is what an IPC handle
names), zeroed with its ``Memset``, and its 64-byte handle (``cudaIpcMemHandle_t``'s size) is
another process's way in. Each call runs with the tensor's device current (the runtime's
``GetDevice``/``SetDevice``) and restores the previous one.
"""

from __future__ import annotations

import base64
import ctypes
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

from ..contract.errors import CacheSharingError, DeviceAllocError

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)
HANDLE_PREFIX = "ipc64:"
"""A platform handle that *is* a raw 64-byte IPC handle: this prefix, then the bytes in base64.
FastDeploy's per-tensor records hold such a handle as its raw bytes."""
OUT_OF_MEMORY = 2  # cudaErrorMemoryAllocation (CoreX keeps CUDA's codes; MACA's value is assumed to match, unverified)


class IpcHandle(ctypes.Structure):
    """``cudaIpcMemHandle_t``: 64 opaque bytes, passed by value to the open call."""

    _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]


def handle_text(raw: bytes) -> str:
    """A raw 64-byte IPC handle as a platform handle (text)."""
    return HANDLE_PREFIX + base64.b64encode(raw).decode("ascii")


def handle_bytes(text: str) -> bytes | None:
    """The raw 64-byte IPC handle in ``text``, or None where ``text`` is not one."""
    if not text.startswith(HANDLE_PREFIX):
        return None
    try:
        raw = base64.b64decode(text[len(HANDLE_PREFIX) :], validate=True)
    except ValueError:
        return None
    return raw if len(raw) == HANDLE_BYTES else None


@dataclass(frozen=True)
class VendorDeviceRuntime:
    """The device calls of a CUDA-shaped vendor runtime: ``library`` (``libmcruntime.so``) and the
    ``prefix`` of its call names (``mc``: ``mcMalloc``, ``mcIpcOpenMemHandle``, ...)."""

    library: str
    prefix: str

    def sharing(self) -> str | None:
        """How a cache tensor crosses processes through this runtime, or None where it cannot be loaded."""
        if self.missing() is not None:
            return None
        return (
            f"{self.prefix}IpcGetMemHandle / {self.prefix}IpcOpenMemHandle of {self.library} through ctypes, "
            "the opened memory wrapped as a Paddle tensor by fd-platforms' foreign-tensor operator"
        )

    def missing(self) -> str | None:
        """Why this runtime's device and IPC calls cannot be used here, or None where they can: its library
        and calls load, and it answers which device is current (it has a device and a driver)."""
        try:
            calls = _functions(self.library, self.prefix)
        except (OSError, AttributeError) as exc:
            return f"{self.library} (the {self.prefix}Ipc* calls) cannot be loaded: {exc}"
        device = ctypes.c_int()
        status = calls["GetDevice"](ctypes.byref(device))
        if status != 0:  # e.g. a CUDA toolkit's libcudart.so on a machine without its driver: 35
            return f"{self.prefix}GetDevice of {self.library} returned status {status}: no usable device or driver"
        return None

    def share(self, nbytes: int, device_id: int, name: str) -> tuple[int, bytes]:
        """``nbytes`` of zeroed device memory on ``device_id``, its own allocation: its address and IPC handle."""
        calls = self._calls(name)
        pointer, handle = ctypes.c_void_p(), IpcHandle()
        with self._on_device(device_id, name):
            status = calls["Malloc"](ctypes.byref(pointer), nbytes)
            if status == OUT_OF_MEMORY:
                raise DeviceAllocError(
                    f"{self.prefix}Malloc could not allocate {nbytes} bytes on device {device_id} for KV cache tensor "
                    f"{name} (status {status}). Fix: plan fewer blocks (lower memory_utilization) or free device memory"
                )
            self._check(status, "Malloc", name)
            try:
                self._check(calls["Memset"](pointer, 0, nbytes), "Memset", name)
                self._check(calls["IpcGetMemHandle"](ctypes.byref(handle), pointer), "IpcGetMemHandle", name)
            except BaseException:
                calls["Free"](pointer)
                raise
        return int(pointer.value or 0), bytes(handle)  # the whole struct: .reserved would stop at a NUL

    def open(self, raw: bytes, device_id: int, name: str) -> int:
        """Map another process's allocation by its IPC handle on ``device_id``; its address here."""
        handle = IpcHandle.from_buffer_copy(raw)
        pointer = ctypes.c_void_p()
        with self._on_device(device_id, name):
            status = self._calls(name)["IpcOpenMemHandle"](ctypes.byref(pointer), handle, 1)  # LazyEnablePeerAccess
        if status != 0:
            raise CacheSharingError(
                f"{self.prefix}IpcOpenMemHandle could not open KV cache tensor {name} (status {status}): its creator "
                "freed it or exited, or the handle is not from this machine. Fix: attach while the cache manager "
                "holds the cache, on the same machine"
            )
        return int(pointer.value or 0)

    def release(self, call: str, address: int, name: str) -> None:
        """Give back memory no tensor took over: ``Free`` an allocation, ``IpcCloseMemHandle`` a mapping."""
        self._calls(name)[call](ctypes.c_void_p(address))

    def release_address(self, call: str, name: str) -> int:
        """The C address of ``Free`` or ``IpcCloseMemHandle`` (both ``int f(void *)``), for the tensor's release."""
        return ctypes.cast(self._calls(name)[call], ctypes.c_void_p).value or 0

    def _calls(self, name: str) -> dict[str, Any]:
        try:
            return _functions(self.library, self.prefix)
        except (OSError, AttributeError) as exc:
            raise CacheSharingError(
                f"KV cache tensor {name} cannot be shared: {self.library} (the {self.prefix}Ipc* calls) cannot be "
                f"loaded: {exc}. Fix: install the vendor runtime and put its folder on LD_LIBRARY_PATH, or let the "
                "workers create their own caches"
            ) from None

    def _check(self, status: int, call: str, name: str) -> None:
        if status != 0:
            raise CacheSharingError(
                f"{self.prefix}{call} of {self.library} failed for KV cache tensor {name} (status {status}). "
                "Fix: check the device and driver, or let the workers create their own caches"
            )

    @contextmanager
    def _on_device(self, device_id: int, name: str) -> Iterator[None]:
        """Run the block with ``device_id`` current in the runtime, restoring the previous device."""
        calls = self._calls(name)
        previous = ctypes.c_int()
        self._check(calls["GetDevice"](ctypes.byref(previous)), "GetDevice", name)
        if previous.value != device_id:
            self._check(calls["SetDevice"](device_id), "SetDevice", name)
        try:
            yield
        finally:
            if previous.value != device_id:
                calls["SetDevice"](previous.value)


_VOID_P, _INT, _SIZE = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
_SIGNATURES: dict[str, list[Any]] = {
    "Malloc": [ctypes.POINTER(_VOID_P), _SIZE],
    "Free": [_VOID_P],
    "Memset": [_VOID_P, _INT, _SIZE],
    "IpcGetMemHandle": [ctypes.POINTER(IpcHandle), _VOID_P],
    "IpcOpenMemHandle": [ctypes.POINTER(_VOID_P), IpcHandle, ctypes.c_uint],
    "IpcCloseMemHandle": [_VOID_P],
    "GetDevice": [ctypes.POINTER(_INT)],
    "SetDevice": [_INT],
}


@cache
def _functions(library: str, prefix: str) -> dict[str, Callable[..., int]]:
    """The runtime's calls, typed (loaded once per process)."""
    runtime = ctypes.CDLL(library)
    calls: dict[str, Any] = {}
    for call, argtypes in _SIGNATURES.items():
        function = getattr(runtime, prefix + call)
        function.argtypes, function.restype = argtypes, ctypes.c_int
        calls[call] = function
    return calls
