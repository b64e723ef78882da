"""KV cache tensors in host memory that other processes open zero-copy: one memfd per tensor.

How the cpu platform's ``export_cache_tensor`` and ``open_cache_tensor`` work, for any platform
whose cache lives in host memory:

- **Export**: ``memfd_create`` (anonymous shared memory named after the tensor), its pages reserved
  and zeroed by the kernel with ``posix_fallocate`` (so a shortage is an error naming the sizes
  here, never a SIGBUS later), mapped shared and wrapped as a Paddle tensor without a copy
  (``numpy`` view → ``paddle.from_dlpack`` → ``view(dtype)``). The handle is
  ``memfd:<pid>:<fd>``: the exporter keeps the descriptor open while the tensor is published.
- **Open**: ``/proc/<pid>/fd/<fd>`` of the exporter (same user, same PID namespace: the engine's own
  processes), checked to be that very memfd and large enough before it is mapped.
- **Lifetime**: the kernel frees the memory when the last descriptor and mapping are gone — when
  every process holding it has closed it or exited, SIGKILL included. Nothing of it lives in
  ``/dev/shm``, so a small ``/dev/shm`` (Docker's default is 64 MiB) does not limit the cache;
  the host's available memory is checked before anything is allocated instead.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
from collections.abc import Callable
from typing import Any

from .device_facts import import_paddle
from .errors import BufferInUseError, CacheSharingError, DeviceAllocError
from .host_memory import available_host_bytes
from .layout import DTYPE_BYTES
from .sizes import format_size
from .types import SharedTensor

MEMFD_NAME_MAX = 249  # bytes of a memfd name (Linux limit; /proc shows it as "/memfd:<name>")
_HANDLE = re.compile(r"memfd:(\d+):(\d+)")


def tensor_bytes(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of a tensor of ``shape`` and ``dtype``."""
    count = 1
    for extent in shape:
        count *= extent
    return count * DTYPE_BYTES[dtype]


def export_host_tensor(name: str, shape: tuple[int, ...], dtype: str) -> SharedTensor:
    """A zero-filled tensor in a fresh memfd that other processes of this user can open by its handle."""
    nbytes = tensor_bytes(shape, dtype)
    available = available_host_bytes()
    if available is not None and nbytes > available:
        raise DeviceAllocError(
            f"KV cache tensor {name} {list(shape)} {dtype} needs {format_size(nbytes)} of host memory, but only "
            f"{format_size(available)} is available. Fix: plan fewer blocks (lower memory_utilization or "
            "--device-memory) or free host memory"
        )
    fd = os.memfd_create(name[:MEMFD_NAME_MAX], os.MFD_CLOEXEC)
    try:
        os.posix_fallocate(fd, 0, nbytes)
        region = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise
        raise DeviceAllocError(
            f"could not reserve {format_size(nbytes)} of host memory for KV cache tensor {name}: {exc.strerror}. "
            "Fix: plan fewer blocks or free host memory"
        ) from None
    return SharedTensor(
        name=name,
        tensor=_wrap(region, shape, dtype),
        handle=f"memfd:{os.getpid()}:{fd}",
        nbytes=nbytes,
        exported=True,
        _close=_closer(name, region, fd),
    )


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
        raise CacheSharingError(f"{stale} ({exc.strerror})") from None
    try:
        size = os.fstat(fd).st_size
        if size < nbytes:
            raise CacheSharingError(
                f"KV cache tensor {name} is published with {size} bytes, but {list(shape)} {dtype} needs {nbytes}. "
                "Fix: attach with the same layout and number of blocks as the creator"
            )
        region = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)  # the mapping holds the memory; the exporter's descriptor keeps the name
    return SharedTensor(
        name=name, tensor=_wrap(region, shape, dtype), handle=handle, nbytes=nbytes, exported=False,
        _close=_closer(name, region, None),
    )  # fmt: skip


def _wrap(region: mmap.mmap, shape: tuple[int, ...], dtype: str) -> Any:
    """A Paddle tensor of ``shape`` and ``dtype`` over ``region``, zero-copy (raw uint8 viewed as the dtype)."""
    import numpy as np

    paddle = import_paddle()
    raw = np.frombuffer(region, dtype=np.uint8).reshape(*shape[:-1], shape[-1] * DTYPE_BYTES[dtype])
    tensor = paddle.from_dlpack(raw)
    return tensor if dtype == "uint8" else tensor.view(dtype)


def _closer(name: str, region: mmap.mmap, fd: int | None) -> Callable[[], None]:
    def close() -> None:
        try:
            region.close()
        except BufferError:
            raise BufferInUseError(
                f"KV cache tensor {name} is still referenced in this process (the tensor or a view of it). "
                "Fix: drop every reference to the cache's tensors before clearing it"
            ) from None
        if fd is not None:
            os.close(fd)

    return close
