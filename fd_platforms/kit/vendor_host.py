"""Pinned host memory from a vendor runtime's own allocator, called through ``ctypes``."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from ..contract.errors import HostAllocError
from ..contract.types import HostBuffer
from .host_memory import PinningUnavailable

OUT_OF_MEMORY = 2  # cudaErrorMemoryAllocation (CoreX keeps CUDA's codes; MACA's value is assumed to match, unverified)


@dataclass(frozen=True)
class VendorHostRuntime:
    """A vendor runtime's pinned host allocator: ``alloc(void **ptr, size_t size, unsigned flags)``
    and ``free(void *ptr)``, both returning 0 on success (the CUDA ``cudaHostAlloc`` shape).

    Status 2 (out of memory) is an allocation failure; any other non-zero status means the
    runtime cannot pin here (no driver, no device) and leads to the documented fallback.
    """

    library: str
    alloc: str
    free: str

    def allocate(self, nbytes: int) -> HostBuffer:
        """Pinned memory from the vendor runtime; PinningUnavailable when its library is absent."""
        try:
            runtime = ctypes.CDLL(self.library)
            alloc, free = getattr(runtime, self.alloc), getattr(runtime, self.free)
        except (OSError, AttributeError) as exc:
            raise PinningUnavailable(f"{self.library} ({self.alloc}/{self.free}) cannot be loaded: {exc}") from exc
        alloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
        alloc.restype = ctypes.c_int
        free.argtypes = [ctypes.c_void_p]
        free.restype = ctypes.c_int
        pointer = ctypes.c_void_p()
        status = alloc(ctypes.byref(pointer), nbytes, 0)
        if status not in (0, OUT_OF_MEMORY):
            raise PinningUnavailable(
                f"{self.alloc} in {self.library} returned status {status} (no usable device or driver?)"
            )
        if status == OUT_OF_MEMORY or not pointer.value:
            raise HostAllocError(
                f"{self.alloc} could not allocate {nbytes} bytes of pinned host memory (status {status}). "
                "Fix: ask for less (smaller swap_space) or free host memory"
            )
        address = pointer.value

        def release() -> None:
            status = free(address)
            if status != 0:
                raise HostAllocError(
                    f"{self.free} could not free {nbytes} bytes of pinned host memory at {address:#x} (status {status})"
                )

        return HostBuffer(address=address, nbytes=nbytes, pinned=True, kind=self.alloc, _free=release)
