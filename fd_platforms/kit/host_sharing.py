"""KV cache tensors in host memory that other processes open zero-copy: one memfd per tensor.

How the cpu platform's ``export_cache_tensor`` and ``open_cache_tensor`` work, for any platform
whose cache lives in host memory:

- **Export**: ``memfd_create`` (anonymous shared memory named after the tensor), its pages reserved
  and zeroed by the kernel with ``posix_fallocate`` (so a shortage is an error naming the sizes
  here, never a SIGBUS later; the host's available memory is checked first), sealed against
  shrinking and growing (``F_SEAL_SHRINK | F_SEAL_GROW``, then ``F_SEAL_SEAL``: a foreign
  ``ftruncate`` fails instead of SIGBUSing every process that maps it), mapped shared and
  wrapped as a Paddle tensor without a copy (``numpy`` view → ``paddle.from_dlpack`` →
  ``view(dtype)``). The handle is ``memfd:<pid>:<fd>``: the exporter keeps that one descriptor
  open while the tensor is published (and raises its soft descriptor limit to the hard one).
- **Open**: ``/proc/<pid>/fd/<fd>`` of the exporter (same user, same PID namespace: the engine's own
  processes), checked to be that very memfd, this user's (a root attacher could open anyone's), sealed, and
  large enough before it is mapped; the attacher
  keeps no descriptor, only the mapping (mapped with libc's ``mmap``: Python's keeps a duplicate).
- **Lifetime**: the kernel frees the memory when the last descriptor and mapping are gone — when
  every process holding it has closed it or exited, SIGKILL included. Nothing of it lives in
  ``/dev/shm``, so a small ``/dev/shm`` (Docker's default is 64 MiB) does not limit the cache;
  the host's available memory is checked before anything is allocated instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import math
import os
import re
import resource
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..contract.dlpack import from_dlpack
from ..contract.errors import BufferInUseError, CacheSharingError, DeviceAllocError
from ..contract.paddle_import import import_paddle
from ..contract.types import DTYPE_BYTES, SharedTensor
from ..rules.sizes import format_size
from .host_memory import available_host_bytes

logger = logging.getLogger(__name__)

SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
"""The seals every exported memfd carries: its size is fixed, and no seal can be added (or removed)."""
MEMFD_NAME_MAX = 249  # bytes of a memfd name (Linux limit; /proc shows it as "/memfd:<name>")
ROOM_SECONDS = 0.5  # how long a reading of the host's available memory is trusted
_HANDLE = re.compile(r"memfd:(\d+):(\d+)")
_PROT_READ_WRITE, _MAP_SHARED = 0x1 | 0x2, 0x01
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def tensor_bytes(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of a tensor of ``shape`` and ``dtype``."""
    return math.prod(shape) * DTYPE_BYTES[dtype]


@dataclass
class _HostRoom:
    """The host's available memory, read at most every :data:`ROOM_SECONDS` and counted down as
    tensors are exported (a rank's 96 tensors cost one reading, not 96)."""

    available: int | None = None
    read_at: float = -1.0

    def take(self, name: str, shape: tuple[int, ...], dtype: str, nbytes: int) -> None:
        if self.available is None or self.available < nbytes or time.monotonic() - self.read_at > ROOM_SECONDS:
            self.available, self.read_at = available_host_bytes(), time.monotonic()
        if self.available is not None and nbytes > self.available:
            raise DeviceAllocError(
                f"KV cache tensor {name} {list(shape)} {dtype} needs {format_size(nbytes)} of host memory, but only "
                f"{format_size(self.available)} is available. Fix: plan fewer blocks (lower memory_utilization or "
                "--device-memory) or free host memory"
            )
        if self.available is not None:
            self.available -= nbytes


_room = _HostRoom()


def export_host_tensor(name: str, shape: tuple[int, ...], dtype: str) -> SharedTensor:
    """A zero-filled tensor in a fresh memfd that other processes of this user can open by its handle."""
    nbytes = tensor_bytes(shape, dtype)
    _room.take(name, shape, dtype, nbytes)
    _descriptor_room()
    try:
        fd = os.memfd_create(name[:MEMFD_NAME_MAX], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError as exc:
        if exc.errno == errno.EMFILE:
            raise _descriptor_error(name, exc) from None
        raise
    try:
        os.posix_fallocate(fd, 0, nbytes)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)  # no ftruncate can shrink it under a mapping (SIGBUS)
        mapping = _Mapping.of(fd, nbytes)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise
        raise DeviceAllocError(
            f"could not reserve {format_size(nbytes)} of host memory for KV cache tensor {name}: {exc.strerror}. "
            "Fix: plan fewer blocks or free host memory"
        ) from None
    return mapping.shared(name, shape, dtype, f"memfd:{os.getpid()}:{fd}", fd)


def handle_pid(handle: str) -> int | None:
    """The process a host-sharing handle (``memfd:<pid>:<fd>``) names, or None for another kind of handle."""
    found = _HANDLE.fullmatch(handle)
    return None if found is None else int(found.group(1))


def open_host_tensor(name: str, handle: str, shape: tuple[int, ...], dtype: str) -> SharedTensor:
    """The tensor another process exported with ``handle``: its memory mapped here, not copied."""
    found = _HANDLE.fullmatch(handle)
    if found is None:
        raise CacheSharingError(
            f"handle {handle!r} of KV cache tensor {name} is not a memfd handle (memfd:<pid>:<fd>). "
            "Fix: open tensors exported by the same platform"
        )
    pid, fd_number = int(found.group(1)), int(found.group(2))
    path = f"/proc/{pid}/fd/{fd_number}"
    stale = (
        f"KV cache tensor {name} cannot be opened: its exporter (pid {pid}) has exited or closed it. "
        "Fix: attach while the cache manager holds the cache (wait on the cache-ready signal first)"
    )
    try:
        target = os.readlink(path)
    except OSError:
        raise CacheSharingError(stale) from None
    if target != f"/memfd:{name[:MEMFD_NAME_MAX]} (deleted)":
        raise CacheSharingError(f"{stale} ({path} is now {target})")
    nbytes = tensor_bytes(shape, dtype)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.EMFILE:
            raise _descriptor_error(name, exc) from None
        raise CacheSharingError(f"{stale} ({exc.strerror})") from None
    try:
        owner = os.fstat(fd).st_uid
        if owner != os.geteuid():
            raise CacheSharingError(
                f"KV cache tensor {name} ({path}, handle {handle!r}) is memory of uid {owner}, not of this user (uid "
                f"{os.geteuid()}): the engine's processes run as one user, so it was not exported by one of them. "
                "Fix: find what else writes this engine's handles; run every process of the engine as one user"
            )
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS != SEALS:
            raise CacheSharingError(
                f"KV cache tensor {name} ({path}) is not sealed against shrinking and growing, so it is not one the "
                "core exported: a truncation would kill every process mapping it. Fix: attach only to tensors "
                "exported by export_host_tensor"
            )
        size = os.fstat(fd).st_size
        if size < nbytes:
            raise CacheSharingError(
                f"KV cache tensor {name} is published with {size} bytes, but {list(shape)} {dtype} needs {nbytes}. "
                "Fix: attach with the same layout and number of blocks as the creator"
            )
        mapping = _Mapping.of(fd, nbytes)
    finally:
        os.close(fd)  # the mapping holds the memory; the exporter's descriptor keeps it reachable
    return mapping.shared(name, shape, dtype, handle, None)


@dataclass(eq=False)
class _Mapping:
    """A shared mapping of a memfd made with libc's ``mmap`` (Python's ``mmap`` would keep a duplicate
    descriptor per tensor). It refuses to unmap while a Paddle tensor or view over it is alive: each
    holds the numpy array it was made from, which this mapping watches through a weak reference."""

    address: int
    nbytes: int
    _arrays: list[weakref.ref[Any]] = field(default_factory=list)

    @classmethod
    def of(cls, fd: int, nbytes: int) -> _Mapping:
        address = _libc.mmap(None, nbytes, _PROT_READ_WRITE, _MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            code = ctypes.get_errno()
            raise OSError(code, f"mmap of {nbytes} bytes failed: {os.strerror(code)}")
        return cls(address, nbytes)

    def shared(self, name: str, shape: tuple[int, ...], dtype: str, handle: str, fd: int | None) -> SharedTensor:
        """The tensor over the mapping as a SharedTensor whose close unmaps it; ``fd``: the exporter's descriptor,
        closed with it (None: an attacher's, which keeps none)."""
        return SharedTensor(
            name=name,
            tensor=self.tensor(shape, dtype),
            handle=handle,
            nbytes=self.nbytes,
            exported=fd is not None,
            _close=lambda: self.close(name, fd),
            _close_when_unused=lambda then: self.close_when_unused(name, fd, then),
        )

    def tensor(self, shape: tuple[int, ...], dtype: str) -> Any:
        """A Paddle tensor of ``shape`` and ``dtype`` over the mapping, zero-copy (raw uint8 viewed as the dtype)."""
        import numpy as np

        paddle = import_paddle()
        raw = np.frombuffer(memoryview((ctypes.c_uint8 * self.nbytes).from_address(self.address)), dtype=np.uint8)
        raw = raw.reshape(*shape[:-1], shape[-1] * DTYPE_BYTES[dtype])
        self._arrays.append(weakref.ref(raw))
        tensor = from_dlpack(paddle, raw)
        return tensor if dtype == "uint8" else tensor.view(dtype)

    def close_when_unused(self, name: str, fd: int | None, then: Callable[[], None]) -> None:
        """:meth:`close` once the last tensor or view over the mapping has died (at once where none lives),
        then ``then()``: a finalizer on each live array counts them down (none runs at interpreter exit, where
        the process's end unmaps). An error then is logged: it happens wherever the last reference died."""
        live = [array for array in (ref() for ref in self._arrays) if array is not None]
        if not live:
            self.close(name, fd)
            then()
            return
        remaining = [len(live)]

        def one_died() -> None:
            remaining[0] -= 1
            if remaining[0]:
                return
            try:
                self.close(name, fd)
                then()
            except Exception:  # a finalizer cannot raise to anyone: logged
                logger.exception("KV cache tensor %s: letting go once its last reference died failed", name)

        for array in live:
            weakref.finalize(array, one_died).atexit = False
        del live, array

    def close(self, name: str, fd: int | None) -> None:
        """Unmap (and close the exporter's descriptor); BufferInUseError while a tensor over it lives."""
        if any(array() is not None for array in self._arrays):
            raise BufferInUseError(
                f"KV cache tensor {name} is still referenced in this process (the tensor or a view of it). "
                "Fix: drop every reference to the cache's tensors before clearing it"
            )
        if self.address:
            _libc.munmap(self.address, self.nbytes)
            self.address = 0
        if fd is not None:
            os.close(fd)


def _descriptor_room() -> None:
    """Each exported tensor holds one descriptor: let this process use as many as its hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and (hard == resource.RLIM_INFINITY or soft < hard):
        # where refused, keep the soft limit; running out is reported by _descriptor_error
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _descriptor_error(name: str, exc: OSError) -> CacheSharingError:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return CacheSharingError(
        f"KV cache tensor {name} needs a file descriptor, but this process has used all {soft} it may open "
        f"({exc.strerror}; the hard limit is {hard}). Each exported tensor holds one. Fix: raise the limit "
        "(ulimit -n, or LimitNOFILE / the container's nofile ulimit) or serve fewer ranks per process"
    )
