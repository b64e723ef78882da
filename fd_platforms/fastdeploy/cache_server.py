"""The creator's side of FastDeploy's clear/update protocol: :func:`serve_kv_cache_status`.

A cache manager of ours that created the ranks' caches follows ``kv_cache_status`` as FastDeploy's cache transfer
manager does (``CacheTransferManager.check_cache_status``, ``fastdeploy/cache_manager/cache_transfer_manager.py``):
it frees once the ranks let go and answers ``CLEARED``, creates again on ``UPDATING`` and answers ``NORMAL``. The
protocol, the driver's side and the failure words are :mod:`.cache_status`'s; a rank that fails here is reported
and the others served on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..contract.errors import ConfigError, FdPlatformsError, SignalWaitError
from ..engine.initialize import ManagedCache
from ..ipc.cache_signal import resolve_timeout
from ..ipc.shared_words import check_tp
from .cache_status import check_callable, status_signals
from .fault_words import FaultKind, KVCacheFault
from .signals import FastDeploySignal, KVCacheStatus, check_suffix

logger = logging.getLogger(__name__)
STATUS_POLL_SECONDS = 0.1  # how long serve_kv_cache_status sleeps between looks at `until` (a status write wakes it)


@dataclass(frozen=True)
class ServeFailure:
    """A step :func:`serve_kv_cache_status` could not do for one rank: ``step`` is ``"clear"`` or ``"create"``."""

    rank: int
    step: str
    error: Exception


def serve_kv_cache_status(
    managed: Sequence[ManagedCache],
    recreate: Callable[[int], ManagedCache],
    *,
    instance: str | int,
    until: Callable[[], bool],
    timeout: float | None = None,
    tp: int | None = None,
    failures: list[ServeFailure] | None = None,
) -> list[ManagedCache]:
    """The creator's side: follow ``kv_cache_status`` until ``until()`` is true; the caches then held.

    ``managed`` are this process's caches (from :func:`~fd_platforms.engine.manage_kv_cache` with
    ``protocol="fastdeploy"``); ``recreate(rank)`` makes one again (passing ``host_cache=`` the host swap
    cache the cleared one kept, its ``.host_cache``, unless ``FD_ENABLE_SWAP_SPACE_CLEARING`` frees it). A
    status outside FastDeploy's ``KVCacheStatus`` and fd-platforms' failure words is logged and never acted
    on. Once the status is not NORMAL and a held rank's slot was reset (its attacher let go, the 0 holding),
    each is cleared (its ``clear`` waits for the rank's attacher), then every slot must be 0 before
    ``CLEARED`` is written; on ``UPDATING`` what is missing is made again and every slot must be 1 before
    ``NORMAL`` is written. Waits are bounded by ``timeout`` (default ``FD_CACHE_READY_TIMEOUT``); ``tp`` (the
    local ranks, where known) is checked as :func:`~.cache_status.drive_kv_cache_update` checks it.

    A rank that fails does not end the serving. Its error (a clear whose attacher does not let go in time,
    CacheInUseError; a creation with /dev/shm full, ShmSpaceError; any error of ``clear`` or ``recreate``)
    is logged at ERROR naming the rank and the cause and appended to ``failures`` (a list, where given) as
    a :class:`~fd_platforms.fastdeploy.cache_server.ServeFailure`. A failed clear keeps the ranks not cleared (setting a
    kept rank's slot again where its attacher had let go, so that it attaches again) and creates again those it freed;
    then the manager of rank 0 writes ``NOT_CLEARED`` (``-10000 - rank``). A rank not created is left out, the
    others held, and its manager writes ``NOT_CREATED`` (``-20000 - rank``); the next ``UPDATING`` (a
    :func:`~.cache_status.drive_kv_cache_restore`) creates what is missing. :mod:`.cache_status` says why these words.

    FastDeploy's workers each write ``UPDATING`` themselves on its engine's update request
    (``check_model_weights_status``, ``fastdeploy/rl/dynamic_weight_manager.py``), so a slower rank's can land
    after the ``NORMAL`` written here; with every cache held and every slot set, ``UPDATING`` is answered
    ``NORMAL`` again (nothing is created twice).

    Only the manager that holds local rank 0 waits for every slot and writes the answers (and
    ``NOT_CLEARED``): the word has no compare-and-swap, so a second writer's late CLEARED could overwrite
    the driver's UPDATING, and a manager waiting for every slot could miss a moment that already passed.
    Managers of other ranks (one per rank, as FastDeploy runs its transfer managers) follow their ranks'
    words and write only ``NOT_CREATED``, which never comes late: a rank without a cache holds back NORMAL.
    """
    suffix = check_suffix(instance, "instance")  # FastDeploy names its signals after the engine instance
    limit = resolve_timeout(timeout)
    if not isinstance(managed, (list, tuple)) or not all(isinstance(cache, ManagedCache) for cache in managed):
        raise ConfigError("managed", managed, "a list of ManagedCache", "pass what manage_kv_cache returned per rank")
    check_callable("recreate", recreate, "pass a function of the rank that calls manage_kv_cache again")
    check_callable("until", until, "pass a function that says when to stop (e.g. threading.Event().is_set)")
    check_tp(tp)
    if failures is not None and not isinstance(failures, list):
        raise ConfigError("failures", failures, "None or a list", "pass a list the failed ranks are appended to")
    with status_signals(suffix, tp) as (status, ready):
        server = _Server(status, ready, recreate, limit, {cache.rank: cache for cache in managed}, failures)
        last, since = None, 0.0  # the status last seen, and since when (the looks for a foreign write slow down)
        while not until():
            current = status.get(0)
            if current != last:
                last, since = current, time.monotonic()
            if not server.step(current):
                status.sleep_while(0, current, STATUS_POLL_SECONDS, since=since)
    return server.caches()


class _Server:
    """:func:`serve_kv_cache_status`'s state: the caches held per rank (a rank missing once freed, or not
    created again) and what it does on each look."""

    def __init__(
        self,
        status: FastDeploySignal,
        ready: FastDeploySignal,
        recreate: Callable[[int], ManagedCache],
        limit: float,
        held: dict[int, ManagedCache],
        failures: list[ServeFailure] | None,
    ) -> None:
        self.status, self.ready, self.recreate, self.limit = status, ready, recreate, limit
        self.ranks, self.held, self.failures = list(held), held, failures
        self.answers = 0 in held  # see serve_kv_cache_status: only rank 0's manager answers

    def caches(self) -> list[ManagedCache]:
        return [self.held[rank] for rank in self.ranks if rank in self.held]

    def missing(self) -> list[int]:
        return [rank for rank in self.ranks if rank not in self.held]

    def step(self, current: int) -> bool:
        """Act on the status ``current`` where it asks for a step; whether it did."""
        fault = KVCacheFault.read(current)
        if fault is not None:  # a failed round: only what another manager's failed clear freed is made again
            if fault.kept and self.missing():
                self.create(answer=False)
                return True
            return False
        if not self.status.allows(0, current):  # refused and logged
            return False
        # A look can miss a whole phase where another rank's manager answers, so the cue to let go
        # is a held rank's own word: only its attacher resets it, when it lets go (and its 0 holds).
        if (
            self.held
            and current != KVCacheStatus.NORMAL
            and any(self.ready.let_go(rank) or cache.released_by_death() for rank, cache in self.held.items())
        ):
            self.clear()
        elif current in (KVCacheStatus.UPDATING, KVCacheStatus.NORMAL) and self.missing():
            self.create(answer=True)
        elif (
            self.answers
            and current == KVCacheStatus.UPDATING
            and not self.missing()
            and set(self.ready.values()) == {1}
        ):
            self.status.set(0, KVCacheStatus.NORMAL)  # a late UPDATING over our NORMAL: see the docstring
        else:
            return False
        return True

    def clear(self) -> None:
        """Clear every held rank, then (rank 0's manager) wait for every slot at 0 and answer CLEARED; on the
        first failure, :meth:`undo`."""
        freed: list[int] = []
        for rank in list(self.held):
            try:
                self.held[rank].clear(self.limit)
            except Exception as error:  # noqa: BLE001 - the rank's failure is reported; serving goes on
                self.failed(rank, "clear", error)
                self.undo(freed, rank)
                return
            del self.held[rank]
            freed.append(rank)
        if self.answers:
            try:
                _wait_all(self.ready, 0, self.limit, "letting go of its KV cache")
            except SignalWaitError as error:
                self.failed(error.rank, "clear", error)
                self.undo(freed, error.rank)
                return
            self.status.set(0, KVCacheStatus.CLEARED)

    def undo(self, freed: list[int], rank: int) -> None:
        """After ``rank``'s clear failed: the kept ranks' slots set again where their attachers let go (their
        caches are still published), the ``freed`` ones created again, the failure said."""
        for kept, cache in self.held.items():
            if cache.created and not cache.kv_cache.cleared and self.ready.get(kept) == 0:
                self.ready.set(kept, 1)
        lost = self.create_again(freed)
        self.say(KVCacheFault(FaultKind.NOT_CLEARED, rank) if lost is None else lost)

    def create(self, *, answer: bool) -> None:
        """Create what is missing; with ``answer`` (rank 0's manager), wait for every slot at 1 and answer NORMAL."""
        lost = self.create_again(self.missing())
        if lost is not None:
            self.say(lost)
        elif answer and self.answers:
            try:
                _wait_all(self.ready, 1, self.limit, "having its KV cache created")
            except SignalWaitError as error:
                self.failed(error.rank, "create", error)
                self.say(KVCacheFault(FaultKind.NOT_CREATED, error.rank))
                return
            self.status.set(0, KVCacheStatus.NORMAL)

    def create_again(self, ranks: list[int]) -> KVCacheFault | None:
        """Make each of ``ranks`` again (``recreate``); NOT_CREATED for the first that could not be, else None."""
        lost = None
        for rank in ranks:
            try:
                self.held[rank] = _recreated(rank, self.recreate(rank))
            except Exception as error:  # noqa: BLE001 - the rank's failure is reported; the others are made
                self.failed(rank, "create", error)
                lost = lost or KVCacheFault(FaultKind.NOT_CREATED, rank)
        return lost

    def say(self, fault: KVCacheFault) -> None:
        """Write ``fault`` where this manager writes it (NOT_CLEARED: rank 0's manager only)."""
        if self.answers or not fault.kept:
            self.status.set(0, fault.word)

    def failed(self, rank: int, step: str, error: Exception) -> None:
        logger.error(
            "rank %d: the cache manager could not %s its KV cache (%s: %s); it serves the other ranks on",
            rank,
            step,
            type(error).__name__,
            error,
            exc_info=not isinstance(error, FdPlatformsError),
        )
        if self.failures is not None:
            self.failures.append(ServeFailure(rank, step, error))


def _recreated(rank: int, made: object) -> ManagedCache:
    """What ``recreate(rank)`` returned, where it is what the serving holds: a :class:`ManagedCache` of ``rank`` that
    created its cache; a ConfigError naming the call, what it returned and what is allowed otherwise (the rank then
    counts as not created)."""
    if isinstance(made, ManagedCache) and made.rank == rank and made.created:
        return made
    raise ConfigError(
        f"recreate({rank})'s return value",
        made,
        f"the ManagedCache of rank {rank} that manage_kv_cache(..., protocol='fastdeploy') made, creating its cache",
        "return what manage_kv_cache returned for that rank",
    )


def _wait_all(ready: FastDeploySignal, value: int, limit: float, what: str) -> None:
    for rank in range(ready.length):
        ready.wait_for(rank, value, limit, what=f"rank {rank} {what}")
