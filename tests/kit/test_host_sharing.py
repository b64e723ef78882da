"""The cpu platform's cache tensors (``fd_platforms.kit.host_sharing``) are memfds sealed against shrinking and
growing: nobody can truncate one under its mappings, and a memfd without the seals is not opened."""

from __future__ import annotations

import os

import pytest

from fd_platforms.contract.errors import CacheSharingError
from fd_platforms.loading.platform import Platform


def test_an_exported_cache_tensor_refuses_truncation_and_its_mappings_stay_readable(cpu: Platform) -> None:
    shared = cpu.export_cache_tensor("fd_kv.test-seal.t", (4, 1024), "uint8", "cpu")
    try:
        pid, fd = map(int, shared.handle.split(":")[1:])
        foreign = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)  # what another process of this user could do
        try:
            for size in (0, 1, 1 << 20):
                with pytest.raises(PermissionError):
                    os.ftruncate(foreign, size)
        finally:
            os.close(foreign)
        shared.tensor[3, 1023] = 7  # still mapped whole: no SIGBUS
        assert int(shared.tensor[3, 1023]) == 7
    finally:
        shared.close()


def test_an_unsealed_memfd_is_not_opened(cpu: Platform) -> None:
    name = "fd_kv.test-unsealed.t"
    fd = os.memfd_create(name, os.MFD_CLOEXEC)  # the name and size of a real one, but no seals
    try:
        os.ftruncate(fd, 4 * 1024)
        with pytest.raises(CacheSharingError, match="is not sealed against shrinking and growing"):
            cpu.open_cache_tensor(name, f"memfd:{os.getpid()}:{fd}", (4, 1024), "uint8", "cpu")
    finally:
        os.close(fd)
