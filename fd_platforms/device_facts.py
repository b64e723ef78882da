"""The seam between the core and Paddle: what a device platform learns from Paddle, nothing else.

A :class:`DeviceFacts` subclass answers four questions for one kind of device — is the Paddle
build able to drive it (and how many devices does it see), how much memory does a device have,
and can host memory be pinned for it — using only the Paddle
calls it lists in ``paddle_calls``. Tests hand it a fake ``paddle`` holding exactly those names;
a test against the installed Paddle checks that each name exists there, so a renamed API is
caught without hardware. Every rule (the decision, the planner, the host-memory contract) stays
in the core and is never written in a subclass.
"""

from __future__ import annotations

import importlib
import os
import warnings
from abc import ABC, abstractmethod
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

from .errors import HostAllocError
from .types import Detection, DeviceMemory, HostBuffer

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .vendor_host import VendorHostRuntime


class PinningUnavailable(Exception):
    """Pinned host memory cannot be had on this machine (the reason is the message).

    Raised by :meth:`DeviceFacts.pin`; the core's host-memory contract turns it into pageable
    memory with a warning, or into :class:`~fd_platforms.errors.HostAllocError` when the caller
    demanded pinned memory. It never leaves the core.
    """


def import_paddle() -> ModuleType:
    """``import paddle``, done only once a device platform needs it.

    Paddle's C++ INFO log lines (custom-device loading, ...) are hidden unless the user set
    ``GLOG_minloglevel``, and the Python warnings its import prints ("No ccache found", ...) are
    silenced, so a command's stderr stays one line on error; Paddle's errors still show.
    """
    os.environ.setdefault("GLOG_minloglevel", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return importlib.import_module("paddle")


class DeviceFacts(ABC):
    """Device facts of one platform, read through ``paddle`` (the real module, or a test's fake).

    ``device_type`` is Paddle's device type (``gpu``, ``xpu``, ``iluvatar_gpu``, ...),
    ``visible_devices_env`` the variable that limits visible devices, ``host_runtime`` the vendor
    runtime's pinned host allocator where Paddle has none for the device.
    """

    #: Dotted names under ``paddle`` this class calls (``"device.cuda.device_count"``).
    paddle_calls: ClassVar[tuple[str, ...]]

    def __init__(
        self,
        paddle: Any,
        device_type: str,
        visible_devices_env: str,
        host_runtime: VendorHostRuntime | None = None,
    ) -> None:
        self.paddle = paddle
        self.device_type = device_type
        self.visible_devices_env = visible_devices_env
        self.host_runtime = host_runtime

    @abstractmethod
    def confirm(self) -> Detection:
        """Whether this Paddle build drives the device, with the number of devices it sees."""

    @abstractmethod
    def memory(self, device_id: int) -> DeviceMemory:
        """Total, free (``None`` where unknown) and this process's peak bytes of one device."""

    @abstractmethod
    def pin(self, nbytes: int) -> HostBuffer:
        """``nbytes`` of pinned host memory; :class:`PinningUnavailable` where that cannot be had.

        Any other failure (the allocation itself) is raised as
        :class:`~fd_platforms.errors.HostAllocError` naming the size.
        """


def pinned_tensor_buffer(paddle: Any, nbytes: int, place_name: str, kind: str) -> HostBuffer:
    """``nbytes`` of pinned host memory held by a ``uint8`` Paddle tensor on ``paddle.<place_name>()``.

    A Paddle build that cannot make the place (``CUDAPinnedPlace`` on the CPU build) raises
    :class:`PinningUnavailable`; a failed allocation raises ``HostAllocError`` naming the size.
    Releasing the buffer drops the tensor, which returns the memory to Paddle's allocator.
    """
    try:
        place = getattr(paddle, place_name)()
    except RuntimeError as exc:
        raise PinningUnavailable(f"paddle.{place_name}() is not available in this paddle build: {exc}") from exc
    try:
        tensor = paddle.empty([nbytes], dtype="uint8", device=place)
    except (RuntimeError, MemoryError, OSError) as exc:
        raise HostAllocError(
            f"paddle could not allocate {nbytes} bytes of pinned host memory on {place_name}: {exc}. "
            "Fix: ask for less (smaller swap_space) or free host memory"
        ) from exc
    holder = [tensor]
    return HostBuffer(address=int(tensor.data_ptr()), nbytes=nbytes, pinned=True, kind=kind, _free=holder.clear)
