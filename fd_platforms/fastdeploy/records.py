"""FastDeploy's ``set_data_ipc`` record of one KV cache tensor, laid out as each FastDeploy build lays it out.

==================== ========================================================== ===== ===============================
platform             FastDeploy's ``shmStruct``                                 bytes declared in
==================== ========================================================== ===== ===============================
``xpu``              ``size_t nprocesses; XPUIpcMemHandle memHandle;``          80    ``custom_ops/xpu_ops/src/ops/
                     ``uint64_t data_ptr_addr`` (handle at 8, address at 72)          xpu_multiprocess.h``
every other one      ``size_t nprocesses; cudaIpcMemHandle_t memHandle``        72    ``custom_ops/gpu_ops/
                     (handle at 8): cuda, metax, iluvatar, cpu                        cuda_multiprocess.h``
==================== ========================================================== ===== ===============================

FastDeploy builds ``gpu_ops/set_data_ipc.cu`` (the 72-byte struct) for CUDA, ROCm, Iluvatar and MetaX
(``custom_ops/setup_ops.py``); its XPU build has its own ops (``xpu_ops/src/ops/set_data_ipc.cc``), which write
the handle of the tensor's data and ``data_ptr_addr``, the tensor's address in the writing process. Its XPU
runner attaches through that address (``share_external_data(..., use_ipc=False)``, ``worker/xpu_model_runner.py``
``initialize_kv_cache``), its transfer manager through the handle (``use_ipc=True``,
``cache_manager/cache_transfer_manager.py`` ``_init_gpu_cache``); the reader (``xpu_ops/src/ops/
share_external_data.cc``) maps ``sizeof(shmStruct)`` bytes and checks no size. ``size_t`` is 8 bytes (LP64);
the handle's 64 bytes need no padding before a ``uint64_t``. ``XPUIpcMemHandle`` is declared in the XPU
runtime's closed ``xpu/runtime.h``: it is taken as 64 bytes, the size of the handle Paddle's XPU build exports
(``DenseTensor._share_xpu``, a ``cudaIpcMemHandle_t`` of the XPU runtime's CUDA layer), which is what our XPU
export writes. A FastDeploy build whose struct differs writes a record of another size, which our attacher
refuses naming both sizes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..kit.vendor_device import HANDLE_BYTES

NPROCESSES_BYTES = 8  # size_t on LP64


@dataclass(frozen=True)
class RecordLayout:
    """One build's ``shmStruct``: ``fields`` packs ``nprocesses`` (always 0), the handle and, where
    ``address_offset`` is set, the tensor's device address; ``source`` is FastDeploy's file declaring it."""

    fields: struct.Struct
    source: str
    address_offset: int | None = None
    handle_offset: int = NPROCESSES_BYTES

    @property
    def size(self) -> int:
        """The record's bytes."""
        return self.fields.size

    def pack(self, handle: bytes, address: int | None) -> bytes:
        """The record of ``handle`` (at most 64 bytes, NUL-padded) and, where this layout has one, ``address``."""
        return self.fields.pack(0, handle) if self.address_offset is None else self.fields.pack(0, handle, address)

    def handle(self, record: bytes) -> bytes:
        """The 64 handle bytes of ``record`` (exactly :attr:`size` bytes)."""
        return self.fields.unpack(record)[1]


#: The record FastDeploy's GPU build writes (and every build but those in :data:`RECORD_LAYOUTS`).
GPU_RECORD = RecordLayout(struct.Struct(f"=Q{HANDLE_BYTES}s"), "custom_ops/gpu_ops/cuda_multiprocess.h")
XPU_RECORD = RecordLayout(
    struct.Struct(f"=Q{HANDLE_BYTES}sQ"),
    "custom_ops/xpu_ops/src/ops/xpu_multiprocess.h",
    address_offset=NPROCESSES_BYTES + HANDLE_BYTES,
)
#: The platforms whose FastDeploy build writes another record than :data:`GPU_RECORD`.
RECORD_LAYOUTS = {"xpu": XPU_RECORD}


def record_layout(platform: str) -> RecordLayout:
    """The record FastDeploy's build for ``platform`` writes and reads (see the module docstring)."""
    return RECORD_LAYOUTS.get(platform, GPU_RECORD)
