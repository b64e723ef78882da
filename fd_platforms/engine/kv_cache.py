"""One rank's KV cache tensors, in the layout's order, however they came to this process.

Three ways in, one record out (:class:`KVCache`):

- :func:`allocate_kv_cache` — plain Paddle tensors on the device, zero-filled, for a platform that
  cannot share (a worker creating its own cache there);
- :func:`export_kv_cache` — every tensor exported through the platform's ``export_cache_tensor``
  and the rank's manifest published (:mod:`.publication`), so other processes can attach;
- :func:`attach_kv_cache` — every tensor of a published cache opened zero-copy, after checking each
  name, shape and dtype against this process's own layout.

Each tensor is raw bytes viewed as its dtype, so every cache dtype, fp8 included, takes one path.
:meth:`KVCache.clear` undoes whichever it was (see there).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..contract.errors import CacheSharingError, ConfigError, DeviceAllocError
from ..contract.paddle_import import import_paddle
from ..contract.types import DTYPE_BYTES, CacheDecision, CacheRoleShape, SharedTensor
from ..kit.device_facts import data_address
from ..kit.host_sharing import handle_pid
from ..kit.placement import check_placeable
from ..loading.platform import Platform
from ..rules.layout import CacheLayout, CacheTensorSpec, Part, check_layout, check_num_blocks
from ..rules.shapes import engine_shaped
from ..rules.sizes import format_size
from . import rank_parts
from .protocols import OURS, Published, WireProtocol
from .publication import PublishedTensor

#: Called after each tensor with (bytes allocated so far, bytes in all).
AllocationProgress = Callable[[int, int], None]


@dataclass(eq=False)
class KVCache:
    """One rank's KV cache: ``tensors[i]`` is named ``names[i]``, in the layout's order.

    ``created`` says whether this process created the memory (``False``: it attached to another
    process's); ``decision`` is the rule's answer that led here (None for a cache manager's own
    cache); ``shared`` whether other processes can attach (the cache is published). Seconds:
    ``create_seconds`` allocating (creators), ``wait_seconds`` waiting for the cache-ready slot and
    ``attach_seconds`` opening the published tensors (attachers); ``import_seconds`` importing paddle
    first (0 once this process has it), counted in none of the others. ``part`` is the layout's part
    (``"all"``; ``"main"`` or ``"draft"``: the runner's or the MTP proposer's,
    :meth:`CacheLayout.draft() <fd_platforms.rules.layout.CacheLayout.draft>`).
    """

    device: str
    num_blocks: int
    names: tuple[str, ...]
    tensors: list[Any] = field(repr=False)
    """The cache's tensors (paddle tensors), ``tensors[i]`` named ``names[i]``."""
    nbytes: int
    rank: int
    created: bool
    decision: CacheDecision | None = None
    create_seconds: float | None = None
    wait_seconds: float | None = None
    attach_seconds: float | None = None
    import_seconds: float | None = None
    _shared: list[SharedTensor] = field(default_factory=list, repr=False)
    _publication: Published | None = field(default=None, repr=False)
    _instance: str | None = field(default=None, repr=False)
    _protocol: WireProtocol = field(default=OURS, repr=False)
    _platform: Platform | None = field(default=None, repr=False)
    cleared: bool = False
    part: Part = "all"

    @property
    def shared(self) -> bool:
        """Whether the tensors are shared with other processes (exported or opened)."""
        return bool(self._shared)

    def by_name(self) -> dict[str, Any]:
        """The tensors keyed by name (for lookups; kernels index :attr:`tensors` by position)."""
        return dict(zip(self.names, self.tensors, strict=True))

    def clear(self, timeout: float | None = None, *, strict: bool = True) -> None:
        """Let go of the cache, so it can be created again (sleep mode, weight updates).

        - An attacher drops its mappings, resets its rank's cache-ready slot to 0 and only then
          lets go of the publication (so a cache manager waiting to free cannot publish again in
          between). Its next :func:`~fd_platforms.engine.initialize_kv_cache` waits until the
          manager has cleared and published again.
        - A creator whose cache is published first waits (at most ``timeout``, default
          ``FD_CACHE_READY_TIMEOUT``) until no attacher holds it —
          :class:`~fd_platforms.contract.errors.CacheInUseError` naming the rank otherwise, with nothing freed — then
          unpublishes it, clears its slot and frees it.
        - A plain cache drops its tensors, returning the memory to Paddle's allocator.

        A creator's clear (either kind) then asks the platform to return the allocator's cached
        memory to the device (``release_device_memory``, e.g. ``paddle.device.cuda.empty_cache()``),
        so the cache can be created again where the device has no room to spare.

        ``tensors`` is emptied in place: drop your own references (and views) first. One still
        alive is a :class:`~fd_platforms.contract.errors.BufferInUseError` naming the tensor, raised before the slot or
        the publication changes for an attacher; call ``clear()`` again once it is gone. Idempotent.

        ``strict=False`` clears as FastDeploy's runner does (``GPUModelRunner.clear_cache``,
        ``fastdeploy/worker/gpu_model_runner.py``, drops its own references and leaves the others, in
        ``share_inputs``, ``forward_meta``, the proposer, to the engine): this record's references are
        dropped at once and this process's hold on the memory when the engine's last reference dies where the
        platform can see it (cpu's memfd views), else at once
        (:meth:`~fd_platforms.contract.types.SharedTensor.release`). A creator waits for its
        attachers and lets go of its slot and publication as above; an attacher resets its slot and lets
        go of the publication only once its hold is dropped, so its creator never frees memory it still
        maps. The strict clear stays the default (fd-platforms' own lifecycle).
        """
        if self.cleared:
            return
        limit = self._protocol.wait_limit(timeout)
        creator = self._publication is not None and self._publication.creator
        if creator and self._publication is not None:
            self._publication.retract(limit)
            self._clear_slot()  # unpublished: an attacher arriving now waits instead of failing to find it
        self.tensors.clear()
        if strict:
            _close_all(self._shared)
            self._let_go()
        elif creator:
            self._let_go()
            self._release_shared(then=lambda: None)  # its memory goes with the engine's last reference
        else:
            self._release_shared(then=self._let_go)  # no creator frees what this process still maps
        self.cleared = True
        if self.created and self._instance is not None:
            rank_parts.cleared(self._protocol.name, self._instance, self.rank, self.part)
        if self.created and self._platform is not None:  # Paddle's allocator keeps what was freed cached
            self._platform.release_device_memory(self.device)

    def released_by_death(self) -> bool:
        """Whether this creator's published cache stands released: every attacher the deployment can have is one of
        ours, gone without letting go (:mod:`fd_platforms.fastdeploy.marks`); never under our protocol, whose
        attachers' locks the kernel drops with them."""
        return self._publication is not None and self._publication.released_by_death()

    def _let_go(self) -> None:
        """The slot reset and the publication let go (an attacher's let-go; a creator's end). Idempotent. An
        attacher's publication that decides the slot itself (:attr:`~.protocols.Published.resets_slot`) resets it."""
        if self.created or self._publication is None or not self._publication.resets_slot:
            self._clear_slot()
        if self._publication is not None:
            self._publication.let_go()
            self._publication = None

    def _release_shared(self, then: Callable[[], None]) -> None:
        """Release every shared tensor (:meth:`SharedTensor.release`); ``then()`` once the last hold is dropped."""
        shared, self._shared = self._shared, []
        pending = [len(shared)]

        def one_dropped() -> None:
            pending[0] -= 1
            if not pending[0]:
                then()

        if not shared:
            then()
        for tensor in shared:
            tensor.release(one_dropped)

    def _clear_slot(self) -> None:
        if self._instance is not None:
            self._protocol.clear_ready(self._instance, self.rank)


def allocate_kv_cache(
    layout: CacheLayout,
    num_blocks: int,
    device: str,
    paddle: Any = None,
    *,
    progress: AllocationProgress | None = None,
    tensor_specs: Sequence[CacheRoleShape] | None = None,
) -> KVCache:
    """Allocate ``layout``'s tensors for ``num_blocks`` blocks on ``device``, zero-filled, unshared.

    The tensors have the layout's shapes as given: pass ``platform.cache_layout(layout, num_blocks)``
    for the platform's axis order and dtypes (:func:`~fd_platforms.engine.initialize.initialize_kv_cache` does), or
    ``tensor_specs``, one layer's tensors as the engine's attention backend states them, checked against the layout
    (:func:`~fd_platforms.rules.shapes.engine_shaped`).

    Raises :class:`~fd_platforms.contract.errors.DevicePlacementError` before any tensor where this Paddle
    cannot place tensors on the device's type at all (:func:`~fd_platforms.kit.placement.check_placeable`:
    what to install, never fewer blocks), and :class:`~fd_platforms.contract.errors.DeviceAllocError` naming the tensor,
    its size and the device when Paddle cannot allocate it; tensors allocated before it are dropped first. ``progress``
    is called after every tensor (throttling is the caller's).
    """
    check_layout(layout)
    check_num_blocks(num_blocks)
    if not isinstance(device, str) or not device:
        raise ConfigError("device", device, "Paddle's device string (gpu:0, cpu)", "pass identity.device_string(id)")
    if tensor_specs is not None:
        layout = engine_shaped(layout, tensor_specs, num_blocks)
    return _zero_filled(layout, num_blocks, device, import_paddle() if paddle is None else paddle, progress)


def allocate_shaped(
    platform: Platform, layout: CacheLayout, num_blocks: int, progress: AllocationProgress | None
) -> KVCache:
    """:func:`allocate_kv_cache` for a layout ``platform.cache_layout`` shaped (and so checked) for ``num_blocks``, on
    the rank's device; its clear returns the memory to the device."""
    device = platform.identity.device_string(layout.local_device)
    cache = _zero_filled(layout, num_blocks, device, import_paddle(), progress)
    cache._platform = platform
    return cache


def _zero_filled(
    layout: CacheLayout, num_blocks: int, device: str, paddle: Any, progress: AllocationProgress | None
) -> KVCache:
    """Every tensor of ``layout``, zero-filled on ``device``: where Paddle can place tensors there at all, one after
    another, dropped again if one fails."""
    check_placeable(paddle, device)
    tensors: list[Any] = []
    done = 0
    for spec in layout.tensors:
        try:
            tensors.append(_zeros(paddle, spec, spec.shape(num_blocks), device))
        except (RuntimeError, MemoryError, OSError, ValueError) as exc:
            count = len(tensors)
            tensors.clear()
            raise _alloc_error(spec, num_blocks, device, count, len(layout.tensors), done, exc) from exc
        done += spec.nbytes(num_blocks)
        if progress is not None:
            progress(done, layout.device_bytes(num_blocks))
    return KVCache(device, num_blocks, layout.names(), tensors, done, layout.rank, created=True, part=layout.part)


def export_kv_cache(
    platform: Platform,
    layout: CacheLayout,
    num_blocks: int,
    instance: str,
    protocol: WireProtocol,
    attachers: int,
    progress: AllocationProgress | None = None,
    *,
    beside_messager: bool = False,
) -> KVCache:
    """Export every tensor of ``layout`` (as ``platform.cache_layout`` shaped it for ``num_blocks``, zero-filled)
    and publish the rank's cache (``protocol``'s way); the platform checks each tensor's name and shape.

    ``attachers``: how many processes are configured to attach each rank (0: none; a protocol whose let-go
    is a slot's value waits for it on clear only where one is, and counts them: :mod:`fd_platforms.fastdeploy.marks`;
    ``beside_messager``: this creator is P/D's cache messager). The
    protocol first refuses memory its records cannot carry
    (:meth:`~fd_platforms.engine.protocols.interface.WireProtocol.check_export`), before any tensor is exported. On any
    failure what was exported is closed again and nothing is published.
    """
    device = platform.identity.device_string(layout.local_device)
    protocol.check_export(platform, device)
    shared: list[SharedTensor] = []
    try:
        done = 0
        for spec in layout.tensors:
            name = protocol.tensor_name(instance, spec.name)
            shared.append(platform.export_cache_tensor(name, spec.shape(num_blocks), spec.dtype, device))
            done += spec.nbytes(num_blocks)
            if progress is not None:
                progress(done, layout.device_bytes(num_blocks))
        entries = [
            PublishedTensor(spec.name, spec.shape(num_blocks), spec.dtype, tensor.handle, data_address(tensor.tensor))
            for spec, tensor in zip(layout.tensors, shared, strict=True)
        ]
        publication = protocol.publish(
            instance,
            layout.rank,
            device,
            entries,
            platform.name,
            attachers=attachers,
            part=layout.part,
            beside_messager=beside_messager,
        )
    except BaseException:
        _close_all(shared)
        raise
    return KVCache(
        device,
        num_blocks,
        layout.names(),
        [tensor.tensor for tensor in shared],
        layout.device_bytes(num_blocks),
        layout.rank,
        created=True,
        _shared=shared,
        _publication=publication,
        _instance=instance,
        _protocol=protocol,
        _platform=platform,
        part=layout.part,
    )


def attach_kv_cache(
    platform: Platform,
    layout: CacheLayout,
    num_blocks: int,
    instance: str,
    creator_pid: int | None,
    protocol: WireProtocol,
    attachers: int,
    *,
    beside_messager: bool = False,
) -> KVCache:
    """Open every tensor of rank ``layout.rank``'s published cache, zero-copy, checked against ``layout``.

    A published tensor whose name, shape or dtype differs from this process's layout is a
    :class:`~fd_platforms.contract.errors.CacheSharingError` naming the tensor and both shapes; so is a publication
    whose creator is not ``creator_pid`` (where the caller knows who sets the slot) or whose handles name another
    process than its creator. Nothing is opened then, and the attach withdraws without a word in the rank's
    slot (it never got the cache; another attacher may hold the slot). ``attachers``: how many processes attach
    each rank in this deployment (:func:`~fd_platforms.rules.roles.cache_roles`), ``beside_messager`` whether the
    rank's creator is P/D's cache messager.
    """
    started = time.monotonic()
    expected = [PublishedTensor(spec.name, spec.shape(num_blocks), spec.dtype, "") for spec in layout.tensors]
    publication = protocol.open_published(
        instance,
        layout.rank,
        expected,
        platform.name,
        layout.part,
        attachers=attachers,
        beside_messager=beside_messager,
    )
    shared: list[SharedTensor] = []
    device = platform.identity.device_string(layout.local_device)
    try:
        check_provenance(publication, creator_pid)
        check_published(publication.tensors, layout, num_blocks)
        for spec, entry in zip(layout.tensors, publication.tensors, strict=True):
            name = protocol.tensor_name(instance, spec.name)
            shared.append(platform.open_cache_tensor(name, entry.handle, entry.shape, entry.dtype, device))
    except BaseException:
        _close_all(shared)
        publication.withdraw()
        raise
    return KVCache(
        device,
        num_blocks,
        layout.names(),
        [tensor.tensor for tensor in shared],
        sum(tensor.nbytes for tensor in shared),
        layout.rank,
        created=False,
        attach_seconds=time.monotonic() - started,
        _shared=shared,
        _publication=publication,
        _platform=platform,
        _instance=instance,
        _protocol=protocol,
        part=layout.part,
    )


def check_provenance(publication: Published, creator_pid: int | None) -> None:
    """A publication is trusted only as far as it is proven: its creator is the process that sets the
    rank's slot (where one is named), and every handle that names a process names that creator."""
    rank, creator = publication.rank, publication.creator_pid
    if creator_pid is not None and creator is not None and creator != creator_pid:
        raise CacheSharingError(
            f"rank {rank}'s KV cache publication /dev/shm/{publication.name} names creator pid {creator}, but pid "
            f"{creator_pid} sets this rank's slot: it was not published by that process. Fix: find what else writes "
            "to /dev/shm under this engine's names; restart the engine with a signal name of its own"
        )
    for tensor in publication.tensors:
        named = handle_pid(tensor.handle)
        if named is not None and named != creator:
            raise CacheSharingError(
                f"rank {rank}'s KV cache publication lists tensor {tensor.name} with a handle of pid {named}, "
                f"{_not_its_creator(publication)}: it would map another process's memory. Fix: restart the engine; "
                "check what else writes to /dev/shm under this engine's names"
            )


def _not_its_creator(publication: Published) -> str:
    """A handle is not of its publication's creator: that creator's pid, or, where none is known (the
    handles name different processes, or some none), what they name: ``1 names pid 12, 1 names no process``."""
    if publication.creator_pid is not None:
        return f"not of its creator (pid {publication.creator_pid})"
    owners = Counter(handle_pid(tensor.handle) for tensor in publication.tensors)
    named = [
        f"{count} name{'s' if count == 1 else ''} {'no process' if pid is None else f'pid {pid}'}"
        for pid, count in sorted(owners.items(), key=lambda item: (item[0] is None, item[0] or 0))
    ]
    return f"but its handles name no one creator ({', '.join(named)})"


def check_published(published: Sequence[PublishedTensor], layout: CacheLayout, num_blocks: int) -> None:
    """Every published tensor must be the layout's, in its order, with its shape and dtype."""
    if len(published) != len(layout.tensors):
        raise CacheSharingError(
            f"rank {layout.rank}'s published KV cache has {len(published)} tensors, this process's layout "
            f"{len(layout.tensors)}. Fix: start every process of the engine with the same model, cache and parallel "
            "settings"
        )
    for spec, entry in zip(layout.tensors, published, strict=True):
        expected = (spec.name, spec.shape(num_blocks), spec.dtype)
        if (entry.name, entry.shape, entry.dtype) != expected:
            raise CacheSharingError(
                f"KV cache tensor {spec.name}: published as {entry.name} {list(entry.shape)} {entry.dtype}, but this "
                f"process's layout expects {spec.name} {list(expected[1])} {spec.dtype}. Fix: start every process of "
                "the engine with the same model, cache and parallel settings and the same number of blocks"
            )


def check_platform_and_layout(platform: object, layout: object) -> None:
    """The platform and layout an engine call was given: a ConfigError naming the first bad one."""
    if not isinstance(platform, Platform):
        raise ConfigError(
            "platform", platform, "a Platform", "pass the selected platform first (fd_platforms.current_platform())"
        )
    check_layout(layout)


def _close_all(shared: list[SharedTensor]) -> None:
    """Close every tensor of ``shared``, last first, each taken out once closed: one that cannot close yet (a
    :class:`BufferInUseError`) stays, so a clear can be called again."""
    while shared:
        shared[-1].close()
        shared.pop()


def _zeros(paddle: Any, spec: CacheTensorSpec, shape: tuple[int, ...], device: str) -> Any:
    """One zero-filled tensor as raw bytes viewed as its dtype (kept out of the caller's frame, so an
    error's traceback holds no tensor)."""
    raw = paddle.zeros([*shape[:-1], shape[-1] * DTYPE_BYTES[spec.dtype]], dtype="uint8", device=device)
    return raw if spec.dtype == "uint8" else raw.view(spec.dtype)


def _alloc_error(
    spec: CacheTensorSpec, num_blocks: int, device: str, count: int, total: int, done: int, exc: BaseException
) -> DeviceAllocError:
    first_line = next(iter(str(exc).strip().splitlines()), "")
    return DeviceAllocError(
        f"could not allocate KV cache tensor {spec.name} {list(spec.shape(num_blocks))} {spec.dtype} "
        f"({format_size(spec.nbytes(num_blocks))}) on {device} after {count} of {total} tensors "
        f"({format_size(done)}): {type(exc).__name__}: {first_line}. "
        "Fix: plan fewer blocks (lower memory_utilization or num_gpu_blocks_override) or free device memory"
    )
