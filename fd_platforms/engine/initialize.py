"""A runner's whole KV-cache initialization, and the cache manager's side of it, in one call each.

:func:`initialize_kv_cache` is what every model runner calls (GPU, XPU, Iluvatar, MetaX alike):

1. decide with the one rule (``should_create_cache_tensor``);
2. create: the layout's tensors, zero-filled — exported and published where the platform can
   share, plain otherwise — then set the rank's cache-ready slot; or
3. attach: refuse at once where the platform cannot share (naming the rule's deciding term and the
   fix); otherwise wait for the slot (futex, bounded, noticing a dead cache manager), then open every
   published tensor zero-copy, each checked against this process's layout.

:func:`manage_kv_cache` is the cache manager's: export and publish one rank's device cache, carve
its host swap cache, set the slot. Both return records whose ``clear()`` lets go, so the cache can
be initialized again (sleep mode and weight updates).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..contract.errors import CacheNotReadyError, CacheSharingError, ConfigError, FdPlatformsError
from ..contract.paddle_import import import_paddle
from ..contract.types import CacheDecision, CacheRoleShape
from ..loading.platform import Platform
from ..rules.decision import DecisionInputs, decide_cache_creation
from ..rules.roles import MESSAGER, TRANSFER_MANAGER, WORKER, CacheRoles, cache_roles
from . import rank_parts
from .host_cache import HostCache, allocate_host_cache, check_host_cache, swap_space_clearing
from .kv_cache import AllocationProgress, KVCache, allocate_shaped, attach_kv_cache, export_kv_cache
from .protocols import OURS, WireProtocol
from .request import CacheRequest, check_not_draft

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..rules.layout import CacheLayout

logger = logging.getLogger(__name__)

#: How long withdrawing a creation that failed part-way waits for an attacher that came early to let go.
WITHDRAW_SECONDS = 1.0


def initialize_kv_cache(
    platform: Platform, request: CacheRequest, *, progress: AllocationProgress | None = None
) -> KVCache:
    """Create or attach the rank's KV cache that ``request`` asks for, as the rule decides; see the module
    docstring. ``progress`` gets ``(bytes done, bytes in all)`` as a creator allocates.

    The request's fields (:class:`~.request.CacheRequest`): ``instance`` names the engine instance (under our
    protocol its cache-ready signal, which also names the rank's publication; under FastDeploy's its signal suffix,
    the engine's ``engine_worker_queue_port``); ``creator_pid`` the process that creates the cache (the cache
    manager), so a waiting worker fails within a quarter second of its death; ``timeout`` bounds the wait;
    ``rule`` is the version every process of the engine pins alike; ``protocol`` ``"fastdeploy"`` speaks
    FastDeploy's own signals and per-tensor handles, beside its unmodified processes; ``tensor_specs`` (one layer's
    tensors as the engine's attention backend states them) are checked against the platform's shapes
    (:func:`~fd_platforms.rules.shapes.engine_shaped`) before any hook runs; ``tp`` makes every per-rank signal
    FastDeploy's int32 array of exactly that many words.

    With MTP the runner passes ``whole.main()`` and the proposer, on a call of its own, ``whole.draft()``
    with the same ``num_blocks`` (its tensors hold ``plan.num_draft_blocks``). Each part creates or attaches
    by the same rule; a creator sets the rank's one slot when the second of the two parts is published in
    this process (:mod:`.rank_parts`), whichever comes first (FastDeploy's runner calls its proposer first,
    ``gpu_model_runner.py`` ``update_share_input_block_num``); an attacher of either part waits for it.
    """
    _check_call(platform, request)
    _check_one_part(request)
    wire, instance, inputs = request.wire, request.instance, request.inputs
    layout = platform.cache_layout(request.layout, request.num_blocks, request.tensor_specs)
    import_seconds = _import_paddle()
    decision = platform.should_create_cache_tensor(**inputs.kwargs())
    roles = cache_roles(inputs)
    if decision.create:
        started = time.monotonic()
        if inputs.profile or platform.cache_sharing() is None:  # a profiling run's cache is its own: never published
            cache = allocate_shaped(platform, layout, request.num_blocks, progress)
        else:
            wire.check_signals(instance, layout.rank, manager=False, swap=False)
            attachers = len(roles.others(WORKER))  # a cache transfer manager beside it attaches
            cache = export_kv_cache(platform, layout, request.num_blocks, instance, wire, attachers, progress)
        cache.create_seconds = time.monotonic() - started
        if not inputs.profile:
            cache._instance, cache._protocol = instance, wire
            with _all_or_nothing(cache, wire, instance):
                if rank_parts.created(wire.name, instance, layout.rank, layout.part):  # main and draft: both
                    wire.set_ready(instance, layout.rank)
    else:
        check_can_attach(platform, decision, f"rank {layout.rank}")
        waited = _wait_ready(platform, request, layout.rank)
        per_rank, beside_messager = len(roles.attachers), roles.creator == MESSAGER
        cache = attach_kv_cache(
            platform,
            layout,
            request.num_blocks,
            instance,
            request.creator_pid,
            wire,
            per_rank,
            beside_messager=beside_messager,
        )
        cache.wait_seconds = waited
    cache.decision, cache.import_seconds = decision, import_seconds
    return cache


@dataclass(eq=False)
class ManagedCache:
    """What the cache manager holds for one rank: its device cache (``kv_cache``, published by the manager
    or attached to the worker's: :attr:`created` says which), its host swap cache (``host_cache``), and with
    MTP (``draft=``) the draft layers' device cache, published on its own (the host swap cache then holds
    main and draft layers, as FastDeploy's transfer manager's does)."""

    rank: int
    kv_cache: KVCache
    host_cache: HostCache | None
    """The rank's host swap cache (None: none, or freed by a :meth:`clear`)."""
    _instance: str | None = field(default=None, repr=False)
    _protocol: WireProtocol = field(default=OURS, repr=False)
    draft: KVCache | None = None
    swap_space_clearing: bool = field(default=False, repr=False)
    """``FD_ENABLE_SWAP_SPACE_CLEARING`` as :func:`manage_kv_cache` read it: whether a clear frees the host swap
    cache."""

    @property
    def created(self) -> bool:
        """Whether the manager created the device cache (False: it attached to the worker's)."""
        return self.kv_cache.created

    def released_by_death(self) -> bool:
        """Whether the rank's published cache (main or draft) stands released by the death of its attachers, all
        of ours (:meth:`KVCache.released_by_death() <fd_platforms.engine.kv_cache.KVCache.released_by_death>`):
        ``serve_kv_cache_status`` clears it as if they had let go."""
        return self.kv_cache.released_by_death() or (self.draft is not None and self.draft.released_by_death())

    def clear(self, timeout: float | None = None, *, clear_host: bool | None = None) -> None:
        """Wait until the rank's attacher has let go (:class:`~fd_platforms.contract.errors.CacheInUseError` naming the
        rank after ``timeout``, nothing freed), then unpublish and free the device cache (the draft
        layers' first).

        The host swap cache is kept, as FastDeploy's transfer manager keeps it across a clear/update
        (``check_cache_status`` in ``fastdeploy/cache_manager/cache_transfer_manager.py``), unless
        ``clear_host`` is True or, with ``clear_host`` None, ``FD_ENABLE_SWAP_SPACE_CLEARING`` was set when the cache
        was managed (:attr:`swap_space_clearing`: read and checked there, once). A kept one stays in
        :attr:`host_cache` (and ``swap_space_ready_signal`` at 1): pass it as ``host_cache=`` to the call that creates
        the cache again.
        A freed one is None and its ``swap_space_ready_signal`` word 0."""
        free_host = self.swap_space_clearing if clear_host is None else swap_space_clearing(clear_host)
        if self.draft is not None:
            self.draft.clear(timeout)
        self.kv_cache.clear(timeout)
        if self.host_cache is not None and free_host:
            self.host_cache.clear()
            self.host_cache = None
            if self._instance is not None:
                self._protocol.manager_swap_freed(self._instance, self.rank)


def manage_kv_cache(
    platform: Platform, request: CacheRequest, *, progress: AllocationProgress | None = None, attach: bool = False
) -> ManagedCache:
    """The cache manager's side of the rank ``request`` names, as the rule in force decides
    (:func:`~fd_platforms.engine.initialize.manager_creates`):

    - where the workers attach, export and publish the device cache, allocate its host swap cache
      (``num_cpu_blocks`` blocks of the same layout; none when 0) or reuse ``host_cache`` (the one a cleared
      :class:`ManagedCache` kept, checked to fit), then set the rank's slot;
    - where the workers create (rule ``2026-04`` with swap space), wait for the rank's published cache,
      attach to it zero-copy, then allocate its host swap cache. ``creator_pid`` is the rank's worker, so
      the wait fails within a quarter second of its death; ``timeout`` bounds it (default
      ``FD_CACHE_READY_TIMEOUT``); ``clear()`` lets go first, so the worker can clear and re-create.

    :attr:`ManagedCache.created` says which it did. The other fields as :func:`initialize_kv_cache`'s (a manager never
    profiles).

    With MTP, the request's ``layout`` is ``whole.main()`` and its ``draft`` ``whole.draft()``: the draft layers are
    published (or attached) too, on their own for the proposer, before the rank's one slot is set (FastDeploy's
    transfer manager makes main and extra layers in one loop before it sets ``cache_ready_signal``:
    ``cache_transfer_manager.py`` ``_init_gpu_cache``); the host swap cache holds both.

    P/D (``splitwise_role`` prefill or decode): FastDeploy's cache messager creates the rank's cache
    (``cache_manager/cache_messager.py`` ``main``) and the worker attaches; with swap space its transfer manager
    attaches too. Our messager is this call with ``num_cpu_blocks=0``: it creates and publishes, sets the slot and,
    as FastDeploy's messager, writes no transfer-manager word and holds no host swap cache. Our transfer manager is
    this call with ``attach=True`` (beside the request: it is this caller's side, not the cache's) and the deployment's
    ``num_cpu_blocks``: it waits for the rank's published cache (``creator_pid``: the messager), attaches, then carves
    its host swap cache (what ``cache_transfer_manager.py`` ``_init_gpu_cache`` does without ``--create_cache_tensor``).
    The rule decides the workers' side only, and in P/D it sends them to attach whoever creates; ``attach=True`` is
    refused (a ConfigError) only where it would leave nobody to create: a mixed instance whose workers the rule sends to
    attach (this manager is their creator), and without swap space (FastDeploy starts no transfer manager then, and
    counts no second attacher). ``attach=False`` (the default) keeps the rule's side."""
    _check_call(platform, request)
    _check_manager_side(request)
    return _manage(platform, request, attach, progress)


def manager_creates(platform: Platform, inputs: DecisionInputs, roles: CacheRoles) -> bool:
    """Whether a cache manager creates a rank's device cache on ``inputs`` (a manager never profiles): unless the rule
    lets the workers create and a cache transfer manager runs beside them
    (:func:`~fd_platforms.rules.roles.cache_roles`), where it attaches to theirs, as FastDeploy's transfer manager
    does since PR #7471 (``fastdeploy/cache_manager/cache_transfer_manager.py``, "Waiting for runners ... to create
    kv cache"). ``roles``: the rank's, :func:`~fd_platforms.rules.roles.cache_roles` on ``inputs``."""
    creates = platform.should_create_cache_tensor(**inputs.kwargs()).create
    return not (creates and TRANSFER_MANAGER in roles.attachers)


def _check_attach(inputs: DecisionInputs, roles: CacheRoles) -> None:
    """``attach=True`` only where the rule in force has a cache transfer manager attach to another process's cache
    (the workers' or the cache messager's, :func:`~fd_platforms.rules.roles.cache_roles`): a ConfigError naming the
    input that leaves the rank with no creator, or starts no transfer manager."""
    if TRANSFER_MANAGER in roles.attachers:
        return
    if roles.creator == TRANSFER_MANAGER:
        decision = decide_cache_creation(**inputs.kwargs())
        raise ConfigError(
            "attach",
            True,
            "only beside another creator of the rank's cache: the workers (where the rule in force "
            "lets them create) or, in P/D (splitwise_role prefill or decode), the cache messager",
            f"drop attach=True: under rule {inputs.rule} the workers of this mixed instance attach "
            f"({decision.deciding_term}: {decision.reason}), so this cache manager is the one that creates",
        )
    raise ConfigError(
        "num_cpu_blocks",
        inputs.num_cpu_blocks,
        "> 0, or a storage backend, with attach=True: FastDeploy starts a cache transfer manager beside the cache only "
        "with host swap space or a storage backend (prefix_cache_manager.py launch_cache_manager), so no creator "
        "counts another attacher",
        "pass the deployment's num_cpu_blocks and kvcache_storage_backend, or drop attach=True (P/D with neither: "
        "the messager's call, manage_kv_cache with num_cpu_blocks=0, creates)",
    )


def _is_messager(creates: bool, inputs: DecisionInputs) -> bool:
    """Whether a creating cache manager is the cache messager of P/D: FastDeploy starts no transfer manager there (no
    swap space, no storage backend: ``prefix_cache_manager.py`` ``launch_cache_manager``), and its messager writes
    ``cache_ready_signal`` alone (``cache_messager.py`` ``main``), no transfer-manager word."""
    return creates and inputs.splitwise_role != "mixed" and not inputs.num_cpu_blocks and not inputs.storage_backend


_REFUSALS = {
    True: "hold a worker's cache. Fix: let the workers create their caches (role mixed, no swap space, no storage "
    "backend), or use a platform that can share",
    False: "attach to a worker's cache. Fix: pin a rule version under which the cache manager creates it (2026-01), "
    "or use a platform that can share",
    "attach": "attach to the cache of another process (the workers' or the cache messager's). Fix: use a platform "
    "that can share",
}


def _manage(
    platform: Platform, request: CacheRequest, attach: bool, progress: AllocationProgress | None
) -> ManagedCache:
    """:func:`manage_kv_cache`'s work on a checked ``request``: the layout in the platform's shapes (the engine's
    ``tensor_specs`` where given), then whether the manager creates (as the rule decides, :func:`manager_creates`;
    with ``attach`` it attaches, checked by :func:`_check_attach`). A creating P/D manager without swap space is the
    cache messager (:func:`_is_messager`): it says nothing beyond the slot. A platform that cannot share is refused,
    naming what the manager cannot do and the fix. A ``draft`` part (MTP) is made or attached the same way, in the
    platform's shapes, after the main part. A kept ``host_cache`` must fit the layout (main and draft) and
    ``num_cpu_blocks`` (:func:`~.host_cache.check_host_cache`). ``FD_ENABLE_SWAP_SPACE_CLEARING``, which the
    manager's clear follows, is read and checked here, once (:func:`~.host_cache.swap_space_clearing`), not at the
    first clear of a serving manager."""
    frees_swap = swap_space_clearing(None)  # FD_ENABLE_SWAP_SPACE_CLEARING read (and checked) once, here
    wire, name, inputs, num_blocks = request.wire, request.instance, request.inputs, request.num_blocks
    num_cpu_blocks, host_cache = inputs.num_cpu_blocks, request.host_cache
    layout = platform.cache_layout(request.layout, num_blocks, request.tensor_specs)  # the platform's or the engine's
    roles = cache_roles(inputs)
    if attach:
        _check_attach(inputs, roles)
    creates = not attach and manager_creates(platform, inputs, roles)
    if platform.cache_sharing() is None:
        raise CacheSharingError(
            f"platform {platform.name} cannot share KV cache tensors between processes (it declares no cache_sharing), "
            f"so a cache manager cannot {_REFUSALS['attach' if attach else creates]}"
        )
    messager = _is_messager(creates, inputs)
    # the draft part in the main part's shapes (the engine's tensor_specs are stated for the main layers: a draft
    # layer's block axis is its int(num_blocks * ratio), as FastDeploy's transfer manager shapes its extra layers from
    # one key_cache_shape: cache_transfer_manager.py _init_gpu_cache, num_extra_layer_gpu_blocks); the host swap
    # cache holds the whole rank
    draft_layout: CacheLayout | None = None
    host_layout = layout
    if request.draft is not None:
        specs = request.tensor_specs
        if specs is not None:
            blocks = request.draft.mtp_blocks(num_blocks)
            specs = tuple(CacheRoleShape(spec.role, (blocks, *spec.shape[1:]), spec.dtype) for spec in specs)
        draft_layout = platform.cache_layout(request.draft, num_blocks, specs)
        host_layout = layout.joined(draft_layout)
    if host_cache is not None:
        check_host_cache(host_cache, host_layout, num_cpu_blocks)
    import_seconds = _import_paddle()
    wire.check_signals(name, layout.rank, manager=not messager, swap=num_cpu_blocks > 0)
    per_rank = len(roles.attachers)  # an attaching transfer manager is one of them
    # A creating manager that holds the swap space is the rank's transfer manager (in P/D too, as fd-platforms run has
    # it): the others attach. The messager sees neither swap space nor a storage backend (FastDeploy passes it no such
    # flag): it counts the worker, and the transfer manager FastDeploy starts beside it once that says it is up.
    expected = max(1, len(roles.others(TRANSFER_MANAGER)))
    beside_messager = messager or (not creates and roles.creator == MESSAGER)

    def make(part: CacheLayout, progress: AllocationProgress | None = None) -> KVCache:
        """``part`` of the rank's device cache (main, then draft): exported where the manager creates, else attached."""
        if creates:
            return export_kv_cache(
                platform, part, num_blocks, name, wire, expected, progress, beside_messager=beside_messager
            )
        return attach_kv_cache(
            platform, part, num_blocks, name, request.creator_pid, wire, per_rank, beside_messager=beside_messager
        )

    if creates:
        started = time.monotonic()
        device = make(layout, progress)
        device.create_seconds = time.monotonic() - started
    else:
        waited = _wait_ready(platform, request, layout.rank, layout, draft_layout)
        device = make(layout)
        device.wait_seconds = waited
    device.import_seconds = import_seconds
    # all or nothing: the draft layers' cache and the host swap cache (a kept one is the caller's: a withdrawal keeps
    # it), the slot set where the manager created, then the manager announced (not by the messager)
    managed = ManagedCache(layout.rank, device, None, swap_space_clearing=frees_swap)
    with _all_or_nothing(managed, wire, name, keep_host=host_cache is not None):
        managed.draft = None if draft_layout is None else make(draft_layout)
        if host_cache is None and num_cpu_blocks:
            host_cache = allocate_host_cache(platform, host_layout, num_cpu_blocks)
        managed.host_cache = host_cache
        if device.created:
            wire.set_ready(name, layout.rank)
        managed._instance, managed._protocol = name, wire
        if not messager:
            wire.manager_up(name, layout.rank, swap=host_cache is not None)
    return managed


def _check_call(platform: object, request: object) -> None:
    """What an engine call takes beside the record's own checks: the platform and a :class:`CacheRequest` (a
    ConfigError naming the argument)."""
    if not isinstance(platform, Platform):
        raise ConfigError(
            "platform", platform, "a Platform", "pass the selected platform first (fd_platforms.current_platform())"
        )
    if not isinstance(request, CacheRequest):
        raise ConfigError(
            "request",
            request,
            "a CacheRequest (one rank's layout, blocks and rule inputs, checked when it is made)",
            "build one: CacheRequest(layout=..., num_blocks=..., instance=..., num_cpu_blocks=..., splitwise_role=...)",
        )


def _check_one_part(request: CacheRequest) -> None:
    """A runner's call makes one part of the rank's cache: no ``draft`` beside it, no kept host cache."""
    if request.draft is not None:
        raise ConfigError(
            "draft",
            f"the draft part of rank {request.draft.rank}",
            "None: initialize_kv_cache makes one part per call",
            "call initialize_kv_cache again with the draft part as the layout (the proposer's call); "
            "draft= is a cache manager's (manage_kv_cache)",
        )
    if request.host_cache is not None:
        raise ConfigError(
            "host_cache",
            request.host_cache,
            "None: a runner holds no host swap cache",
            "pass the kept host cache to manage_kv_cache, the cache manager's call",
        )


def _check_manager_side(request: CacheRequest) -> None:
    """A cache manager never profiles and takes no draft part as its layout."""
    if request.profile:
        raise ConfigError(
            "profile",
            True,
            "False: a cache manager never profiles",
            "pass profile=False (a runner's profiling run makes a cache of its own)",
        )
    check_not_draft(request.layout)


@contextlib.contextmanager
def _all_or_nothing(
    cache: KVCache | ManagedCache, wire: WireProtocol, instance: str, *, keep_host: bool = False
) -> Iterator[None]:
    """Withdraw ``cache`` (a manager's: with its host cache) if the steps inside fail: a creation leaves
    nothing behind, not at garbage collection but before the error reaches the caller. A creator resets
    the rank's slot first (its own 1, or one the step inside was about to write: nobody may wait for a
    let-go of a cache that never finished), so its clear does not wait for an attacher that cannot come;
    what still cannot be withdrawn (an attacher of ours that came early and holds on) is logged."""
    device = cache.kv_cache if isinstance(cache, ManagedCache) else cache
    try:
        yield
    except BaseException:
        if device.created:
            with contextlib.suppress(FdPlatformsError, OSError):
                wire.clear_ready(instance, device.rank)
        try:
            if isinstance(cache, ManagedCache):
                cache.clear(WITHDRAW_SECONDS, clear_host=not keep_host)
            else:
                cache.clear(WITHDRAW_SECONDS)
        except FdPlatformsError as exc:
            logger.warning(
                "rank %d: the KV cache of a call that failed could not be withdrawn, it is freed when "
                "this process exits: %s",
                device.rank,
                exc,
            )
        raise


def _wait_ready(platform: Platform, request: CacheRequest, rank: int, *parts: CacheLayout | None) -> float:
    """``wire.wait_ready``; a wait that timed out names, where it can be seen, the part of the rank's cache
    (of ``parts``: main and draft) that its creator published without the other, and, where the protocol says
    one could be at fault, a peer following another version of the rule than the request's."""
    wire, inputs = request.wire, request.inputs
    try:
        return wire.wait_ready(platform, request.instance, rank, request.timeout, request.creator_pid)
    except CacheNotReadyError as error:
        if error.cause != "timeout":
            raise
        hints = (rank_parts.one_missing(wire, request.instance, rank, parts), wire.rule_mismatch(inputs.rule, inputs))
        if not any(hints):
            raise
        raise error.with_hint(". ".join(hint for hint in hints if hint)) from None


def _import_paddle() -> float:
    """Import paddle (every platform's tensors are Paddle's) before any step is timed; the seconds it took."""
    started = time.monotonic()
    import_paddle()
    return time.monotonic() - started


def check_can_attach(platform: Platform, decision: CacheDecision, who: str = "this worker") -> None:
    """Refuse, when the rule decides, workers sent to attach on a platform that cannot share cache tensors.

    An engine calls it before starting its cache manager (``fd-platforms run`` does);
    :func:`initialize_kv_cache` calls it before it would wait. ``who`` starts the message.
    """
    if not decision.create and platform.cache_sharing() is None:
        raise CacheSharingError(
            f"{who}: the rule decided the workers attach to the cache manager's KV cache "
            f"(deciding term {decision.deciding_term}: {decision.reason}), but platform {platform.name} cannot share "
            "KV cache tensors between processes (it declares no cache_sharing). Fix: run so that workers create their "
            "own cache (splitwise role mixed, no swap space, no storage backend), or use a platform that can share"
        )
