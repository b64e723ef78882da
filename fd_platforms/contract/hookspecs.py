"""Hook specifications: the whole contract between the core and a platform plugin.

A platform plugin is a module (or object) exposed in the entry-point group ``fd_platforms`` under
its platform name. It implements some of these hooks with :data:`fd_platforms.plugin.hookimpl`, importing every
name from :mod:`fd_platforms.plugin` (the one module a plugin may import):

.. code-block:: python

    from fd_platforms.plugin import Detection, PlatformIdentity, hookimpl

    @hookimpl
    def platform_identity():
        return PlatformIdentity(name="acme", device_type="acme_npu",
                                visible_devices_env="ACME_VISIBLE_DEVICES")

    @hookimpl
    def detect_platform():
        return Detection(available=False, reason="paddle-acme-npu is not installed")

    @hookimpl
    def supported_api_versions():
        return ">=1.0,<2"

Every hook is ``firstresult``: the plugin's answer wins, and the core's defaults (registered ``trylast``) answer
where it is silent. ``platform_identity``, ``detect_platform`` and ``supported_api_versions`` are required; an
answer that is not the record named in ``Returns`` is a :class:`~fd_platforms.contract.errors.PluginContractError`.
Plugin code runs in the engine's own thread, each call bounded by ``FD_PLATFORM_DETECT_TIMEOUT`` (the allocation
hooks by ``FD_PLATFORM_ALLOC_TIMEOUT``): past its bound the process ends, naming the call
(:mod:`fd_platforms.loading.watchdog`). What a hook raises, ``SystemExit`` included, becomes a
:class:`~fd_platforms.contract.errors.PluginError` naming the plugin and the hook, while ``KeyboardInterrupt`` stays
the user's Ctrl-C (:mod:`fd_platforms.loading.isolation`). The core validates the caller's arguments before a hook
runs and checks every answer on every call, the rule hooks against the rule itself
(:class:`~fd_platforms.contract.errors.PlatformDriftError`).

See docs/writing-a-plugin.md, "3. The hooks", for every rule a hook is held to and why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..rules.config.settings import CacheConfig
    from ..rules.layout import CacheLayout
    from .types import (
        CacheDecision,
        CacheRoleShape,
        CacheShapeRequest,
        Detection,
        DeviceMemory,
        HostBuffer,
        Plan,
        PlatformIdentity,
        PlatformLimit,
        SharedTensor,
    )

PROJECT = "fd_platforms"

hookspec = pluggy.HookspecMarker(PROJECT)
#: The marker of a plugin's hook implementations: ``@hookimpl def platform_identity() -> PlatformIdentity: ...``.
hookimpl = pluggy.HookimplMarker(PROJECT)

REQUIRED_HOOKS = ("platform_identity", "detect_platform", "supported_api_versions")


def hook_names() -> tuple[str, ...]:
    """Every hook specified in this module, in the order they are defined."""
    return tuple(name for name, obj in globals().items() if hasattr(obj, f"{PROJECT}_spec"))


@hookspec(firstresult=True)
def platform_identity() -> PlatformIdentity:
    """Say who the platform is.

    :returns: a :class:`~fd_platforms.contract.types.PlatformIdentity`. ``name`` must equal the name
        the plugin is registered under in the ``fd_platforms`` entry-point group.

    firstresult: yes. Required. Errors: a name that differs from the entry-point name is
    refused with :class:`~fd_platforms.contract.errors.PluginContractError`.

    Example::

        @hookimpl
        def platform_identity():
            return PlatformIdentity("cuda", "gpu", "CUDA_VISIBLE_DEVICES")
    """


@hookspec(firstresult=True)
def detect_platform() -> Detection:
    """Tell whether the platform can run on this machine, cheaply.

    Check installed distributions, device nodes or vendor tools; never import paddle or start a
    device runtime here (``fd-platforms list`` runs this for every installed platform).

    :returns: a :class:`~fd_platforms.contract.types.Detection` with ``available``, a ``reason`` a user
        can act on (always, but especially when unavailable) and ``device_count``.

    firstresult: yes. Required. Errors: an exception raised here marks the platform broken,
    with the exception as its error; it never stops other platforms from being detected.

    Example::

        @hookimpl
        def detect_platform():
            return Detection(True, "paddlepaddle-gpu 3.3.1 installed, 8 devices", 8)
    """


@hookspec(firstresult=True)
def supported_api_versions() -> str:
    """Declare the plugin API versions the plugin was written for.

    The plugin API (these hooks and the records in :mod:`fd_platforms.contract.types`) has the version
    :data:`fd_platforms.API_VERSION` (``MAJOR.MINOR``; MAJOR changes break plugins). The core
    checks the declaration when it loads the plugin.

    :returns: a PEP 440 version specifier string, e.g. ``">=1.0,<2"`` for a plugin written
        against API 1.0 that trusts every 1.x.

    firstresult: yes. Required. Errors: a range that excludes the core's API version is refused
    with :class:`~fd_platforms.contract.errors.PluginVersionError` naming both versions and the fix; a
    value that is not a specifier string with :class:`~fd_platforms.contract.errors.PluginContractError`.

    Example::

        @hookimpl
        def supported_api_versions():
            return ">=1.0,<2"
    """


@hookspec(firstresult=True)
def confirm_platform() -> Detection | None:
    """Confirm detection through Paddle, once, when the platform is about to be selected.

    Here a plugin may import paddle and start its device runtime: check that the Paddle build
    supports the device (``is_compiled_with_cuda()``, a registered custom-device type, ...) and
    count the devices it sees. Unselected platforms are never asked.

    :returns: a :class:`~fd_platforms.contract.types.Detection` that replaces the cheap one (available,
        reason, device count from Paddle), or ``None`` when the cheap detection is all there is.

    firstresult: yes. Optional (the core's default returns ``None``). Errors: an exception
    raised here marks the platform broken; ``available=False`` makes selecting it an error
    carrying ``reason``.

    Example::

        @hookimpl
        def confirm_platform():
            import paddle
            if not paddle.is_compiled_with_cuda():
                return Detection(False, "paddle is not built with CUDA. Fix: pip install paddlepaddle-gpu")
            return Detection(True, "paddle sees 8 CUDA devices", paddle.device.cuda.device_count())
    """


@hookspec(firstresult=True)
def should_create_cache_tensor(
    profile: bool, num_cpu_blocks: int, storage_backend: str | None, splitwise_role: str, rule: str
) -> CacheDecision:
    """Decide whether this worker allocates the KV cache itself or attaches to a cache manager's.

    The core's default is the one rule in the version the engine pinned (``rule``; the default
    ``2026-01`` is ``profile or not (num_cpu_blocks > 0 or storage_backend or splitwise_role !=
    "mixed")``, see :mod:`fd_platforms.rules.decision`); platforms should not implement this hook.
    One that does is checked against the whole truth table under every version when loaded and
    against the pinned version on every call's own inputs.

    :param profile: this is the memory-profiling run, which always creates a temporary cache.
    :param num_cpu_blocks: host swap blocks; > 0 means a cache-transfer process owns the cache.
    :param storage_backend: ``None``, ``"mooncake"``, ``"attention_store"`` or ``"file"``.
    :param splitwise_role: ``"mixed"``, ``"prefill"`` or ``"decode"``.
    :param rule: the rule version the engine pinned (``"2026-01"``, ``"2026-04"``).
    :returns: a :class:`~fd_platforms.contract.types.CacheDecision` (``create``, the deciding term, reason).

    firstresult: yes. Errors: :class:`~fd_platforms.contract.errors.ConfigError` for a value outside the
    allowed ones.

    Example::

        platform.should_create_cache_tensor(profile=False, num_cpu_blocks=0,
                                            storage_backend=None, splitwise_role="mixed")
        # CacheDecision(create=True, deciding_term="none", ...)
    """


@hookspec(firstresult=True)
def device_memory(device_id: int) -> DeviceMemory:
    """Report memory facts of one local device, for the planner.

    :param device_id: local device index (after the visibility variable is applied).
    :returns: a :class:`~fd_platforms.contract.types.DeviceMemory`; ``free_bytes`` is ``None`` where the
        platform cannot tell free memory, ``process_bytes`` what this process already holds.

    firstresult: yes. May import paddle. Errors: :class:`~fd_platforms.contract.errors.ConfigError` for a
    device id the platform does not have.

    Example::

        @hookimpl
        def device_memory(device_id):
            free, total = paddle.cuda.mem_get_info(device_id)
            return DeviceMemory(total, free, paddle.device.memory_reserved(device_id), "cuda")
    """


@hookspec(firstresult=True)
def declared_limits() -> tuple[PlatformLimit, ...]:
    """Declare the platform's limits on the KV cache, each with the reason it exists.

    :returns: a tuple of :class:`~fd_platforms.contract.types.PlatformLimit` (empty: no limit). The core's
        default declares none.

    firstresult: yes. Errors: none expected; the planner explains a binding limit with its reason.

    Example::

        @hookimpl
        def declared_limits():
            return (PlatformLimit("max_tensor_elements", 2**31 - 1,
                                  "attention kernels address one cache tensor with int32 offsets"),)
    """


@hookspec(firstresult=True)
def max_num_blocks(
    layout: CacheLayout,
    memory: DeviceMemory,
    cache: CacheConfig,
    limits: tuple[PlatformLimit, ...],
    non_cache_bytes: int | None,
) -> Plan:
    """Plan how many KV cache blocks one rank gets.

    The core's default (:func:`fd_platforms.rules.planner.plan_blocks`) divides the budget
    ``floor(total * memory_utilization) - non_cache`` (capped by free memory where known) by the
    layout's bytes per block, then applies declared limits and any override; platforms should not
    implement this hook. Any answer is checked on every call against the planner's invariants
    (:func:`fd_platforms.rules.planner.plan_violations`).

    :param layout: the rank's :class:`~fd_platforms.rules.layout.CacheLayout`.
    :param memory: the device's :class:`~fd_platforms.contract.types.DeviceMemory`.
    :param cache: the validated :class:`~fd_platforms.rules.config.settings.CacheConfig`.
    :param limits: the platform's declared :class:`~fd_platforms.contract.types.PlatformLimit` records.
    :param non_cache_bytes: bytes the process holds outside the cache (weights, activation peak);
        ``None``: ``memory.process_bytes``.
    :returns: a :class:`~fd_platforms.contract.types.Plan` (blocks, bytes per block, budget, binding constraint).

    firstresult: yes. Errors: :class:`~fd_platforms.rules.planner.InsufficientMemoryError` (with the
    numbers and what to change) when the budget holds no block;
    :class:`~fd_platforms.contract.errors.ConfigError` for an override above a limit or the budget.

    Example::

        plan = platform.max_num_blocks(layout=layout, cache=cache, memory=memory)
        plan.num_blocks, plan.binding  # (43690, "memory")
    """


@hookspec(firstresult=True)
def kv_cache_shapes(request: CacheShapeRequest) -> tuple[CacheRoleShape, ...]:
    """State one layer's cache tensors as this platform's attention kernels lay them out.

    The core owns the bytes, the platform the axes: ``request.default`` is the core's answer (key
    and value ``[num_blocks, kv_heads, block_size, head_dim]``, block-wise fp8 scales the key's
    first three axes, ...), and the answer must name the same roles in the same order, each with
    the block axis first (``num_blocks``) and the same bytes; the order of the other axes and a
    dtype of the same size (``int8`` for ``uint8``) are the platform's. Checked on every call and at
    load over a table of layer kinds and quantizations; another answer is a
    :class:`~fd_platforms.contract.errors.PlatformDriftError` naming the role, the layer kind and
    both sizes. Allocation, export, attach and the attach-time shape check all use the answer.

    :param request: a :class:`~fd_platforms.contract.types.CacheShapeRequest`.
    :returns: a tuple of :class:`~fd_platforms.contract.types.CacheRoleShape`, one per role of ``request.default``.

    firstresult: yes; the core's default returns ``request.default``. Errors: none of its own; an
    answer of other roles or bytes is the core's :class:`~fd_platforms.contract.errors.PlatformDriftError`.

    Example (tokens before heads, as a flash-attention layout)::

        @hookimpl
        def kv_cache_shapes(request):
            if request.attention not in ("mha", "gqa") or request.quant_type == "int4_zp":
                return None  # the core's order
            return tuple(CacheRoleShape(role.role, (role.shape[0], role.shape[2], role.shape[1], *role.shape[3:]),
                                        role.dtype) for role in request.default)
    """


@hookspec(firstresult=True)
def host_alloc(nbytes: int, require_pinned: bool) -> HostBuffer:
    """Allocate host memory for swap space, pinned where the platform can pin it.

    :param nbytes: size in bytes, > 0.
    :param require_pinned: when true, memory that cannot be pinned is an error instead of a
        pageable buffer with ``pinned=False``.
    :returns: a :class:`~fd_platforms.contract.types.HostBuffer` (address, size, ``pinned``, zero-copy
        numpy and paddle views, explicit ``release()``; usable as a context manager).

    firstresult: yes. The core's default returns page-aligned pageable memory with
    ``pinned=False``. Errors: :class:`~fd_platforms.contract.errors.HostAllocError` naming the requested
    size when allocation fails or pinning was required but is impossible; nothing is leaked.

    Example::

        with platform.host_alloc(nbytes=1 << 30, require_pinned=False) as buf:
            buf.numpy()[:4] = 1
    """


@hookspec(firstresult=True)
def wait_cache_ready(signal_name: str, rank: int, timeout: float | None, creator_pid: int | None) -> float:
    """Block until the cache-ready slot of ``rank`` is set by the process that owns the cache.

    The core's implementation attaches to the signal (:mod:`fd_platforms.ipc.cache_signal`) and
    sleeps on the slot with a futex: no CPU while waiting, woken within microseconds of the set.

    :param signal_name: name of the engine's shared-memory cache-ready signal
        (:func:`fd_platforms.ipc.cache_signal.new_signal_name`).
    :param rank: local rank whose slot to wait on.
    :param timeout: seconds to wait at most (``None``: ``FD_CACHE_READY_TIMEOUT``, default 600;
        ``math.inf``: no limit — the wait then logs what it waits for every few seconds).
    :param creator_pid: pid of the process that creates the cache and sets the slot; its exit ends
        the wait within about a quarter of a second.
    :returns: seconds waited.

    firstresult: yes; platforms should not implement this hook. Errors:
    :class:`~fd_platforms.contract.errors.CacheNotReadyError` (cause ``"timeout"`` or ``"creator_exited"``)
    naming the signal, the rank, the elapsed time and every slot's state;
    :class:`~fd_platforms.contract.errors.CacheSignalError` when no such signal exists;
    :class:`~fd_platforms.contract.errors.ConfigError` for a bad rank, timeout or ``FD_CACHE_READY_TIMEOUT``.

    Example::

        waited = platform.wait_cache_ready("fd_cache_ready.engine-8188", rank=0, creator_pid=manager.pid)
    """


@hookspec(firstresult=True)
def cache_sharing() -> str | None:
    """Say how a KV cache tensor crosses processes on this platform, or that it cannot.

    A worker that does not create its cache attaches to the cache manager's tensors by name, with
    :func:`export_cache_tensor` and :func:`open_cache_tensor`. Where they cannot work, the core
    refuses such a worker when it decides (naming the rule's deciding term and the fix), never
    later with a crash or a hang.

    :returns: one sentence naming the mechanism (``"CUDA IPC handles through Paddle's
        _share_cuda"``), or ``None`` where tensors cannot be shared. Must stay cheap: no paddle.

    firstresult: yes. Optional (the core's default returns ``None``). Errors: none expected; an
    answer that is neither a sentence nor ``None`` is a :class:`~fd_platforms.contract.errors.PluginContractError`.

    Example::

        @hookimpl
        def cache_sharing():
            return "CUDA IPC handles through Paddle's DenseTensor._share_cuda / _new_shared_cuda"
    """


@hookspec(firstresult=True)
def export_cache_tensor(name: str, shape: tuple[int, ...], dtype: str, device: str) -> SharedTensor:
    """Allocate one zero-filled KV cache tensor that other processes can open.

    :param name: the tensor's published name, unique to the engine instance
        (``fd_kv.<instance>.key_caches_0_rank0.device0``); use it to label what the platform creates.
    :param shape: the tensor's shape, blocks first.
    :param dtype: one of ``bfloat16``, ``float16``, ``float8_e4m3fn``, ``int8``, ``uint8``, ``float32``.
    :param device: Paddle's device string (``gpu:0``, ``cpu``).
    :returns: a :class:`~fd_platforms.contract.types.SharedTensor` whose ``tensor`` is zero-filled and whose
        ``handle`` is the text another process passes to :func:`open_cache_tensor`; closing it
        frees the memory once no other process holds it.

    firstresult: yes. Optional; the core's default raises
    :class:`~fd_platforms.contract.errors.CacheSharingError`. Errors:
    :class:`~fd_platforms.contract.errors.DeviceAllocError` naming the tensor and size when it cannot be
    allocated; nothing is kept then.

    Example::

        shared = platform.export_cache_tensor("fd_kv.8188.key_caches_0_rank0.device0", (1024, 4, 64, 128),
                                              "bfloat16", "gpu:0")
        shared.handle  # published by the core; shared.close() when the cache is cleared
    """


@hookspec(firstresult=True)
def open_cache_tensor(name: str, handle: str, shape: tuple[int, ...], dtype: str, device: str) -> SharedTensor:
    """Open a tensor another process exported, zero-copy: the same memory, not a copy.

    :param name: the published name (as exported).
    :param handle: the exporter's ``SharedTensor.handle``.
    :param shape: the shape the caller's layout expects (checked against the publication first).
    :param dtype: the dtype the caller's layout expects.
    :param device: Paddle's device string of this process's device.
    :returns: a :class:`~fd_platforms.contract.types.SharedTensor` (``exported=False``); closing it drops
        this process's mapping and never frees the exporter's memory.

    firstresult: yes. Optional; the core's default raises
    :class:`~fd_platforms.contract.errors.CacheSharingError`. Errors: ``CacheSharingError`` naming the tensor
    when the handle is stale (its exporter is gone) or does not hold ``shape`` and ``dtype``.

    Example::

        shared = platform.open_cache_tensor(name, handle, (1024, 4, 64, 128), "bfloat16", "gpu:0")
    """


@hookspec(firstresult=True)
def release_device_memory(device: str) -> str | None:
    """Return to the device the memory Paddle's allocator keeps cached after a KV cache was freed.

    Paddle's allocators keep freed blocks for reuse, so a cleared cache stays reserved on the
    device and creating it again (sleep mode, RL weight updates) can fail where FastDeploy's
    runners, which call ``paddle.device.cuda.empty_cache()`` after clearing, succeed. The core
    calls this after every creator's clear (a worker's own cache or a cache manager's), once per
    cache, after its tensors are dropped.

    :param device: Paddle's device string of the cleared cache (``gpu:0``).
    :returns: what was called, in words (``"paddle.device.cuda.empty_cache()"``), or ``None`` where
        the platform keeps no such cache (the default).

    firstresult: yes. Optional. Errors: none expected; what it raises is blamed on the plugin by
    name (the cache is already cleared then), and an answer that is neither text nor ``None`` is a
    :class:`~fd_platforms.contract.errors.PluginContractError`.

    Example::

        @hookimpl
        def release_device_memory(device):
            paddle.device.cuda.empty_cache()
            return "paddle.device.cuda.empty_cache()"
    """
