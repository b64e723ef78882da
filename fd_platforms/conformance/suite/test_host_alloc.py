"""The ``host_alloc`` contract: size, alignment, zero-copy views (numpy's and paddle's where they are here),
release, the unpinned path."""

from __future__ import annotations

import ctypes
from types import ModuleType
from typing import Any

import pytest

from ...contract.errors import BufferInUseError, ConfigError, HostAllocError
from ...loading.platform import Platform
from . import hooks

SIZES = (1, 4096, (1 << 20) + 3)
ALIGNMENT = 64  # every allocator returns at least cache-line-aligned memory; pageable memory is page-aligned


@hooks("host_alloc")
@pytest.mark.parametrize("nbytes", SIZES)
def test_size_alignment_and_the_memory_is_the_callers(fd_platform: Platform, nbytes: int) -> None:
    """The buffer is ``nbytes`` of aligned memory the caller can write and read back (no numpy needed)."""
    with fd_platform.host_alloc(nbytes, require_pinned=False) as buffer:
        assert buffer.nbytes == nbytes
        assert buffer.address % ALIGNMENT == 0, f"address {buffer.address:#x} is not {ALIGNMENT}-byte aligned"
        assert isinstance(buffer.pinned, bool) and buffer.kind.strip()
        raw = (ctypes.c_uint8 * nbytes).from_address(buffer.address)
        raw[0] = 0xA5
        raw[nbytes - 1] = 0x5A
        assert raw[nbytes - 1] == 0x5A and (nbytes == 1 or raw[0] == 0xA5)
        del raw


@hooks("host_alloc")
@pytest.mark.parametrize("nbytes", SIZES)
def test_the_numpy_view_is_zero_copy(fd_platform: Platform, fd_numpy: ModuleType, nbytes: int) -> None:
    with fd_platform.host_alloc(nbytes, require_pinned=False) as buffer:
        array = buffer.numpy()
        assert array.size == nbytes and array.ctypes.data == buffer.address
        del array


@hooks("host_alloc")
@pytest.mark.parametrize("nbytes", SIZES)
def test_the_paddle_view_is_zero_copy(fd_platform: Platform, fd_paddle: ModuleType, nbytes: int) -> None:
    with fd_platform.host_alloc(nbytes, require_pinned=False) as buffer:
        array = buffer.numpy()
        array[-1] = 0x5A
        tensor = buffer.paddle()
        assert tensor.data_ptr() == buffer.address, "the paddle view must not copy"
        assert int(tensor[-1]) == 0x5A
        del array, tensor


@hooks("host_alloc")
def test_release_refuses_while_a_view_lives_and_is_idempotent(fd_platform: Platform, fd_numpy: ModuleType) -> None:
    buffer = fd_platform.host_alloc(8192, require_pinned=False)
    view = buffer.numpy()
    with pytest.raises(BufferInUseError, match="Fix:"):
        buffer.release()
    del view
    buffer.release()
    buffer.release()
    assert buffer.released
    with pytest.raises(BufferInUseError):
        buffer.numpy()


@hooks("host_alloc")
def test_pinned_or_the_documented_unpinned_path(fd_platform: Platform) -> None:
    """Demanding pinned memory gives pinned memory, or HostAllocError naming the size and the fix."""
    nbytes = 12288
    try:
        buffer = fd_platform.host_alloc(nbytes, require_pinned=True)
    except HostAllocError as exc:
        assert str(nbytes) in str(exc) and "Fix:" in str(exc)
        with fd_platform.host_alloc(nbytes, require_pinned=False) as fallback:
            assert fallback.pinned is False and fallback.nbytes == nbytes
    else:
        with buffer:
            assert buffer.pinned is True and buffer.nbytes == nbytes


@hooks("host_alloc")
@pytest.mark.parametrize("nbytes", [0, -1, 1.5])
def test_bad_sizes_are_config_errors(fd_platform: Platform, nbytes: Any) -> None:
    with pytest.raises(ConfigError, match="nbytes"):
        fd_platform.host_alloc(nbytes, require_pinned=False)
