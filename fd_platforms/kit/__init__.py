"""The plugin kit: what a vendor plugin may build on, so it states device facts and nothing else.

Internal to the core: a plugin imports the kit's public names from :mod:`fd_platforms.plugin`, never
from these modules.

- :mod:`.paddle_platform` — ``PaddlePlatform``, a whole Paddle-driven platform from its facts;
- :mod:`.device_facts` — ``DeviceFacts``, the seam between the core and Paddle (memory, pinning, IPC);
- :mod:`.custom_device` — ``CustomDeviceFacts``, for Paddle custom devices;
- :mod:`.rocm` — ``RocmFacts``, for Paddle's ROCm build (a ``gpu`` device that is not CUDA);
- :mod:`.vendor_host` — ``VendorHostRuntime``, a vendor's pinned host allocator through ctypes;
- :mod:`.host_memory` — the host-memory contract (pinned, else pageable) and the host's memory facts;
- :mod:`.host_sharing` — cache tensors in sealed memfds, for platforms whose tensors live in host memory;
- :mod:`.probes` — ``RuntimeFacts``: identity and cheap detection from stated facts;
- :mod:`.placement` — whether this Paddle can place tensors on a device type (checked before the engine allocates).
"""
