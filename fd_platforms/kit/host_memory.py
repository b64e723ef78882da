"""Host memory: page-aligned pageable buffers, and the machine's memory facts from the OS."""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from collections.abc import Callable

from ..contract.errors import HostAllocError
from ..contract.integers import check_int, decimal
from ..contract.types import DeviceMemory, HostBuffer

logger = logging.getLogger(__name__)


class PinningUnavailable(Exception):
    """Pinned host memory cannot be had on this machine (the reason is the message).

    Raised by :meth:`DeviceFacts.pin() <fd_platforms.kit.device_facts.DeviceFacts.pin>`; the core's host-memory contract
    turns it into pageable memory with a warning, or into :class:`~fd_platforms.contract.errors.HostAllocError` when the
    caller demanded pinned memory. It never leaves the core.
    """


def check_host_nbytes(nbytes: object) -> None:
    """A host allocation's size: an integer from 1 to ``MAX_COUNT``, else a ConfigError naming ``nbytes``."""
    check_int("nbytes", nbytes, 1, fix="ask for a positive number of bytes")


def allocate_pageable(nbytes: int) -> HostBuffer:
    """Allocate ``nbytes`` of zeroed, page-aligned, pageable host memory (``pinned=False``)."""
    check_host_nbytes(nbytes)
    try:
        region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, OverflowError, MemoryError) as exc:
        raise HostAllocError(
            f"could not allocate {nbytes} bytes of pageable host memory: {exc}. "
            "Fix: ask for less (smaller swap_space) or free host memory"
        ) from exc
    anchor = ctypes.c_char.from_buffer(region)
    address = ctypes.addressof(anchor)
    del anchor  # drop the export so the region can be closed on release
    return HostBuffer(address=address, nbytes=nbytes, pinned=False, kind="pageable", _free=region.close)


def allocate_host(nbytes: int, require_pinned: bool, pin: Callable[[int], HostBuffer], platform: str) -> HostBuffer:
    """The one host-memory contract: pinned when ``pin`` can, else pageable with a warning.

    ``pin`` raising :class:`PinningUnavailable` means pinning cannot be had here: a caller that
    demanded pinned memory gets :class:`~fd_platforms.contract.errors.HostAllocError` with the reason; any other caller
    gets pageable memory marked ``pinned=False`` and one WARNING line. A failed allocation is a
    :class:`~fd_platforms.contract.errors.HostAllocError` naming the size, whichever path failed.
    """
    check_host_nbytes(nbytes)
    try:
        return pin(nbytes)
    except PinningUnavailable as exc:
        if require_pinned:
            raise HostAllocError(
                f"pinned host memory of {nbytes} bytes was required, but platform {platform!r} cannot pin "
                f"here: {exc}. Fix: call host_alloc(require_pinned=False) to accept pageable memory, "
                "or install the device runtime named above"
            ) from None
        logger.warning(
            "platform %r cannot pin host memory (%s); using %d bytes of pageable memory", platform, exc, nbytes
        )
    return allocate_pageable(nbytes)


def system_memory() -> DeviceMemory:
    """Total and available host memory, and this process's resident set, from the OS."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = page * os.sysconf("SC_PHYS_PAGES")
    free: int | None = None
    source = "os.sysconf"
    meminfo = _read_meminfo()
    if meminfo:
        total = meminfo.get("MemTotal", total)
        free = meminfo.get("MemAvailable")
        source = "/proc/meminfo"
    return DeviceMemory(total_bytes=total, free_bytes=free, process_bytes=resident_bytes(), source=source)


def host_bytes_for_swap(host_memory: int | None) -> tuple[int, bool]:
    """The host bytes a swap cache is checked against, and whether they were measured: ``host_memory``
    when the caller gave it, else this machine's total."""
    if host_memory is None:
        return system_memory().total_bytes, True
    return host_memory, False


_CGROUP_FILES = (  # (limit, usage): cgroup v2, then v1
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)


def available_host_bytes() -> int | None:
    """Host memory a new allocation can still take: ``MemAvailable``, and within a container the
    room left under its cgroup's memory limit, whichever is smaller (None where neither is known)."""
    candidates = []
    available = _read_meminfo().get("MemAvailable")
    if available is not None:
        candidates.append(available)
    for limit_file, usage_file in _CGROUP_FILES:
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 2**60:  # "max" or a huge value: no limit
            candidates.append(max(0, limit - usage))
            break
    return min(candidates) if candidates else None


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return decimal(text)


def _read_meminfo() -> dict[str, int]:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return {}
    values: dict[str, int] = {}
    for line in lines:
        key, _, rest = line.partition(":")
        number, _, unit = rest.strip().partition(" ")
        count = decimal(number)
        if count is not None:
            values[key] = count * (1024 if unit == "kB" else 1)
    return values


def resident_bytes() -> int | None:
    """This process's resident set in bytes (``/proc/self/statm``), or None where unreadable."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return None
