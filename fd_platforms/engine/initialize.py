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
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..contract.errors import CacheSharingError, FdPlatformsError, SignalWaitError
from ..contract.paddle_import import import_paddle
from ..contract.types import CacheDecision
from ..ipc.cache_signal import resolve_timeout
from ..rules.decision import DecisionInputs
from .host_cache import HostCache, allocate_host_cache, check_host_cache, swap_space_clearing
from .kv_cache import (
    AllocationProgress,
    KVCache,
    allocate_kv_cache,
    attach_kv_cache,
    check_cache_arguments,
    export_kv_cache,
)
from .protocols import OURS, WireProtocol, protocol_named

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..loading.platform import Platform
    from ..rules.layout import CacheLayout

logger = logging.getLogger(__name__)

#: How long withdrawing a creation that failed part-way waits for an attacher that came early to let go.
WITHDRAW_SECONDS = 1.0


def initialize_kv_cache(
    platform: Platform,
    layout: CacheLayout,
    num_blocks: int,
    *,
    profile: bool,
    num_cpu_blocks: int,
    storage_backend: str | None,
    splitwise_role: str,
    signal_name: str,
    setter_pid: int | None = None,
    timeout: float | None = None,
    progress: AllocationProgress | None = None,
    rule: str | None = None,
    protocol: str = OURS.name,
) -> KVCache:
    """Create or attach rank ``layout.rank``'s KV cache, as the rule decides; see the module docstring.

    ``signal_name`` is the engine's cache-ready signal (its instance also names the publication);
    ``setter_pid`` the cache manager's pid, so a waiting worker fails within a quarter second of its
    death; ``timeout`` bounds the wait (default ``FD_CACHE_READY_TIMEOUT``); ``rule`` is the rule
    version the engine pins (every process of one engine must pin the same; None: the protocol's
    :meth:`~.protocols.WireProtocol.rule_in_force`); ``protocol`` ``"fastdeploy"`` speaks FastDeploy's
    own signals and per-tensor handles (``signal_name`` is then its signal suffix, the engine's port),
    so this runner can work beside FastDeploy's unmodified processes.
    """
    check_cache_arguments(platform, layout, num_blocks)
    wire = protocol_named(protocol)
    wire.check_signal_name(signal_name)
    inputs = DecisionInputs(profile, num_cpu_blocks, storage_backend, splitwise_role)
    inputs = replace(inputs, rule=wire.rule_in_force(rule, inputs))
    limit = resolve_timeout(timeout)
    layout = platform.cache_layout(layout, num_blocks)  # the platform's shapes, checked
    import_seconds = _import_paddle()
    decision = platform.should_create_cache_tensor(**inputs.kwargs())
    sharing = platform.cache_sharing()
    if decision.create:
        started = time.monotonic()
        if profile or sharing is None:  # a profiling run's cache is its own, temporary: never published
            cache = allocate_kv_cache(
                layout, num_blocks, platform.identity.device_string(layout.device_id), progress=progress
            )
            cache._platform = platform  # its clear returns the memory to the device
        else:
            wire.check_signals(signal_name, layout.rank, manager=False, swap=False)
            cache = export_kv_cache(
                platform, layout, num_blocks, signal_name, progress=progress, protocol=wire,
                attacher_expected=num_cpu_blocks > 0,  # a cache manager with host swap attaches to a worker's
            )  # fmt: skip
        cache.create_seconds = time.monotonic() - started
        if not profile:
            cache._signal_name, cache._protocol = signal_name, wire
            with _all_or_nothing(cache, wire, signal_name):
                wire.set_ready(signal_name, layout.rank)
    else:
        check_can_attach(platform, decision, f"rank {layout.rank}")
        waited = _wait_ready(platform, wire, signal_name, layout.rank, limit, setter_pid, inputs)
        cache = attach_kv_cache(platform, layout, num_blocks, signal_name, setter_pid, wire)
        cache.wait_seconds = waited
    cache.decision, cache.import_seconds = decision, import_seconds
    return cache


@dataclass(eq=False)
class ManagedCache:
    """What the cache manager holds for one rank: the published device cache and its host swap cache."""

    rank: int
    device: KVCache
    host: HostCache | None
    _signal_name: str | None = field(default=None, repr=False)
    _protocol: WireProtocol = field(default=OURS, repr=False)

    def clear(self, timeout: float | None = None, *, clear_host: bool | None = None) -> None:
        """Wait until the rank's attacher has let go (:class:`CacheInUseError` naming the rank after
        ``timeout``, nothing freed), then unpublish and free the device cache.

        The host swap cache is kept, as FastDeploy's transfer manager keeps it across a clear/update
        (``check_cache_status`` in ``fastdeploy/cache_manager/cache_transfer_manager.py``), unless
        ``clear_host`` is True or, with ``clear_host`` None, ``FD_ENABLE_SWAP_SPACE_CLEARING`` is set
        (:func:`~.host_cache.swap_space_clearing`; checked first). A kept one stays in :attr:`host` (and
        ``swap_space_ready_signal`` at 1): pass it as ``host_cache=`` to the call that creates the cache again.
        A freed one is None and its ``swap_space_ready_signal`` word 0."""
        free_host = swap_space_clearing(clear_host)
        self.device.clear(timeout)
        if self.host is not None and free_host:
            self.host.clear()
            self.host = None
            if self._signal_name is not None:
                self._protocol.manager_swap_freed(self._signal_name, self.rank)


def manage_kv_cache(
    platform: Platform,
    layout: CacheLayout,
    num_blocks: int,
    *,
    num_cpu_blocks: int,
    signal_name: str,
    progress: AllocationProgress | None = None,
    protocol: str = OURS.name,
    rule: str | None = None,
    storage_backend: str | None = None,
    splitwise_role: str = "mixed",
    host_cache: HostCache | None = None,
) -> ManagedCache:
    """Export and publish rank ``layout.rank``'s device cache, allocate its host swap cache
    (``num_cpu_blocks`` blocks of the same layout; none when 0) or reuse ``host_cache`` (the one a
    cleared :class:`ManagedCache` kept, checked to fit), then set the rank's slot.
    ``protocol`` and ``rule`` as :func:`initialize_kv_cache`'s, which also takes ``storage_backend``
    and ``splitwise_role``: the engine's, the rule's inputs with ``num_cpu_blocks``."""
    layout, wire, _ = _manager_layout(
        platform, layout, num_blocks, signal_name, protocol,
        (num_cpu_blocks, storage_backend, splitwise_role, rule), host_cache,
        "hold a worker's cache. Fix: let the workers create their caches (role mixed, no swap space, no storage "
        "backend), or use a platform that can share",
    )  # fmt: skip
    import_seconds = _import_paddle()
    wire.check_signals(signal_name, layout.rank, manager=True, swap=num_cpu_blocks > 0)
    started = time.monotonic()
    device = export_kv_cache(
        platform, layout, num_blocks, signal_name, progress=progress, protocol=wire, attacher_expected=True
    )
    device.create_seconds, device.import_seconds = time.monotonic() - started, import_seconds
    return _managed(platform, layout, device, (num_cpu_blocks, host_cache), wire, signal_name)  # nobody attached yet


def hold_kv_cache(
    platform: Platform,
    layout: CacheLayout,
    num_blocks: int,
    *,
    num_cpu_blocks: int,
    signal_name: str,
    setter_pid: int | None = None,
    timeout: float | None = None,
    protocol: str = OURS.name,
    rule: str | None = None,
    storage_backend: str | None = None,
    splitwise_role: str = "mixed",
    host_cache: HostCache | None = None,
) -> ManagedCache:
    """The cache manager's side where the workers create (rule ``2026-04`` with swap space on): wait
    for rank ``layout.rank``'s published cache, attach to it zero-copy, then allocate its host swap
    cache (``num_cpu_blocks`` blocks). ``setter_pid`` is the rank's worker, so the wait fails within a
    quarter second of its death; ``clear()`` lets go first, so the worker can clear and re-create.
    The other arguments as :func:`manage_kv_cache`'s.
    """
    layout, wire, inputs = _manager_layout(
        platform, layout, num_blocks, signal_name, protocol,
        (num_cpu_blocks, storage_backend, splitwise_role, rule), host_cache,
        "attach to a worker's cache. Fix: pin a rule version under which the cache manager creates it (2026-01), "
        "or use a platform that can share",
    )  # fmt: skip
    limit = resolve_timeout(timeout)
    import_seconds = _import_paddle()
    wire.check_signals(signal_name, layout.rank, manager=True, swap=num_cpu_blocks > 0)
    waited = _wait_ready(platform, wire, signal_name, layout.rank, limit, setter_pid, inputs)
    device = attach_kv_cache(platform, layout, num_blocks, signal_name, setter_pid, wire)
    device.wait_seconds, device.import_seconds = waited, import_seconds
    return _managed(platform, layout, device, (num_cpu_blocks, host_cache), wire, signal_name)


def _managed(
    platform: Platform, layout: CacheLayout, device: KVCache, host: tuple[int, HostCache | None], wire: WireProtocol,
    signal_name: str,
) -> ManagedCache:
    """What a cache manager holds for ``device``'s rank, all or nothing: ``device`` with its host swap cache
    (``host``: ``num_cpu_blocks`` blocks of ``layout``, none when 0, and a kept host cache to reuse or None),
    the rank's slot set where the manager created the device cache, then the manager announced where the
    protocol asks for it (FastDeploy's words). A reused host cache is the caller's: a withdrawal keeps it."""
    num_cpu_blocks, kept = host
    managed = ManagedCache(layout.rank, device, None)
    with _all_or_nothing(managed, wire, signal_name, keep_host=kept is not None):
        if kept is not None:
            managed.host = kept
        else:
            managed.host = allocate_host_cache(platform, layout, num_cpu_blocks) if num_cpu_blocks else None
        if device.created:
            wire.set_ready(signal_name, layout.rank)
        managed._signal_name, managed._protocol = signal_name, wire
        wire.manager_up(signal_name, layout.rank, swap=managed.host is not None)
    return managed


@contextlib.contextmanager
def _all_or_nothing(
    cache: KVCache | ManagedCache, wire: WireProtocol, signal_name: str, *, keep_host: bool = False
) -> Iterator[None]:
    """Withdraw ``cache`` (a manager's: with its host cache) if the steps inside fail: a creation leaves
    nothing behind, not at garbage collection but before the error reaches the caller. A creator resets
    the rank's slot first (its own 1, or one the step inside was about to write: nobody may wait for a
    let-go of a cache that never finished), so its clear does not wait for an attacher that cannot come;
    what still cannot be withdrawn (an attacher of ours that came early and holds on) is logged."""
    device = cache.device if isinstance(cache, ManagedCache) else cache
    try:
        yield
    except BaseException:
        if device.created:
            with contextlib.suppress(FdPlatformsError, OSError):
                wire.clear_ready(signal_name, device.rank)
        try:
            if isinstance(cache, ManagedCache):
                cache.clear(WITHDRAW_SECONDS, clear_host=not keep_host)
            else:
                cache.clear(WITHDRAW_SECONDS)
        except FdPlatformsError as exc:
            logger.warning("rank %d: the KV cache of a call that failed could not be withdrawn, it is freed when "
                           "this process exits: %s", device.rank, exc)  # fmt: skip
        raise


def _manager_layout(
    platform: Platform,
    layout: CacheLayout,
    num_blocks: int,
    signal_name: str,
    protocol: str,
    rule_arguments: tuple[int, str | None, str, str | None],
    host_cache: HostCache | None,
    refusal: str,
) -> tuple[CacheLayout, WireProtocol, DecisionInputs]:
    """A cache manager call's arguments checked, before any hook: the protocol named ``protocol``, the
    rule's inputs (``num_cpu_blocks``, ``storage_backend``, ``splitwise_role``; a manager never
    profiles) with the rule in force (``rule``); then the layout in the platform's shapes. A platform
    that cannot share is refused (``refusal`` ends the message: what the manager cannot do, the fix). A kept
    ``host_cache`` must fit the layout and ``num_cpu_blocks`` (:func:`~.host_cache.check_host_cache`)."""
    check_cache_arguments(platform, layout, num_blocks)
    wire = protocol_named(protocol)
    wire.check_signal_name(signal_name)
    num_cpu_blocks, storage_backend, splitwise_role, rule = rule_arguments
    inputs = DecisionInputs(False, num_cpu_blocks, storage_backend, splitwise_role)
    inputs = replace(inputs, rule=wire.rule_in_force(rule, inputs))
    shaped = platform.cache_layout(layout, num_blocks)  # the platform's shapes, checked
    if host_cache is not None:
        check_host_cache(host_cache, shaped, num_cpu_blocks)
    if platform.cache_sharing() is None:
        raise CacheSharingError(
            f"platform {platform.name} cannot share KV cache tensors between processes (it declares no cache_sharing), "
            f"so a cache manager cannot {refusal}"
        )
    return shaped, wire, inputs


def _wait_ready(
    platform: Platform,
    wire: WireProtocol,
    signal_name: str,
    rank: int,
    limit: float,
    setter_pid: int | None,
    inputs: DecisionInputs,
) -> float:
    """``wire.wait_ready``; a wait on FastDeploy's side that timed out names, where the protocol says
    one could be at fault, a peer following another version of the rule than ``inputs.rule``."""
    try:
        return wire.wait_ready(platform, signal_name, rank, limit, setter_pid)
    except SignalWaitError as error:
        hint = wire.rule_mismatch(inputs.rule, inputs) if error.cause == "timeout" else ""
        if not hint:
            raise
        raise error.with_hint(hint) from None


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
        raise _cannot_attach(platform, decision, who)


def _cannot_attach(platform: Platform, decision: CacheDecision, who: str) -> CacheSharingError:
    return CacheSharingError(
        f"{who}: the rule decided the workers attach to the cache manager's KV cache "
        f"(deciding term {decision.deciding_term}: {decision.reason}), but platform {platform.name} cannot share KV "
        "cache tensors between processes (it declares no cache_sharing). Fix: run so that workers create their own "
        "cache (splitwise role mixed, no swap space, no storage backend), or use a platform that can share"
    )
