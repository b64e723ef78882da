"""FastDeploy's clear/update protocol over ``kv_cache_status``: the driver's calls and the creator's.

RL weight updates clear the KV cache and create it again. FastDeploy's processes coordinate that
through one word, ``kv_cache_status.<suffix>``, and the ``cache_ready_signal`` slots:

1. the driver (FastDeploy's worker, or :func:`drive_kv_cache_clear`) writes ``CLEARING``;
2. every attaching rank lets go of its cache and resets its ``cache_ready_signal`` slot to 0;
3. the creator (FastDeploy's cache transfer manager, or :func:`serve_kv_cache_status`) sees every
   slot at 0, frees its caches and writes ``CLEARED``;
4. the driver updates the weights and writes ``UPDATING`` (:func:`drive_kv_cache_restore`);
5. the creator creates the caches again, sets every slot to 1 and writes ``NORMAL``; each attaching
   rank attaches again once its slot is set (:func:`~fd_platforms.engine.initialize_kv_cache`).

FastDeploy runs steps 1-3 and 4-5 as two separate events, each on its own request to its engine
(``model_weights_status`` CLEARING, then UPDATING: :mod:`fd_platforms.engine.weights_status`);
:func:`drive_kv_cache_update` is the two in a row, under one claim.

FastDeploy runs a cache transfer manager per rank, and each writes ``CLEARED`` and ``NORMAL`` itself
(``fastdeploy/cache_manager/cache_transfer_manager.py``, ``check_cache_status``), so a slower rank's answer
to one step can land after the driver wrote the next and replace it: its ``CLEARED`` over ``UPDATING``,
its ``NORMAL`` over the next round's ``CLEARING``. No process acts on an answer, so the update would
hang. While it waits, the driver writes its own word again each time it reads the answer to the step
before. That never replaces a current answer: a manager answers ``CLEARED`` only once every slot is 0
and ``NORMAL`` only once every slot is set, and a creating manager frees or creates only after it has
seen the driver's word, so the answer to the current step needs every such manager to have seen it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..contract.errors import CacheSharingError, CacheSignalError, ConfigError, SignalWaitError
from ..contract.integers import check_int, is_int
from ..ipc.cache_signal import resolve_timeout
from ..ipc.fastdeploy_signals import (
    CACHE_READY,
    KV_CACHE_STATUS,
    MAX_LOCAL_RANKS,
    FastDeploySignal,
    KVCacheStatus,
    check_suffix,
)
from ..loading.platform import Platform
from .initialize import ManagedCache

SETTLE_SECONDS = 0.5
"""The least time the driver leaves every slot at 0 (from the first ``CLEARED`` to its ``UPDATING``) and
at 1 (from ``NORMAL`` to its return, so to a next clear): FastDeploy's managers look at the slots every
0.1 s (``check_cache_status``) and wait for all of them to be 0, then 1; one whose looks miss that
moment waits forever. FastDeploy's own driver leaves seconds there (the weight update, the next
request)."""
logger = logging.getLogger(__name__)
STATUS_POLL_SECONDS = 0.1  # how long serve_kv_cache_status sleeps between looks at `until` (a status write wakes it)


@dataclass
class UpdateReport:
    """Seconds each phase of one :func:`drive_kv_cache_update` took."""

    let_go_seconds: float
    cleared_seconds: float
    update_seconds: float
    created_seconds: float
    ranks: int = field(default=0)


@dataclass
class ClearReport:
    """Seconds each phase of one :func:`drive_kv_cache_clear` took: every rank letting go, the creator freeing."""

    let_go_seconds: float
    cleared_seconds: float
    ranks: int


@dataclass
class RestoreReport:
    """Seconds one :func:`drive_kv_cache_restore` took: the creator creating every rank's cache again."""

    created_seconds: float
    ranks: int


@dataclass(frozen=True)
class _Drive:
    """A drive's arguments, checked: the bound on each wait and the processes each wait watches."""

    suffix: str
    limit: float
    creator_pid: int | None
    pids: dict[int, int]
    tp: int | None


def drive_kv_cache_update(
    suffix: str | int,
    *,
    update: Callable[[], None] | None = None,
    timeout: float | None = None,
    creator_pid: int | None = None,
    attacher_pids: Mapping[int, int] | None = None,
    platform: Platform | None = None,
    managers: str = "fastdeploy",
    tp: int | None = None,
) -> UpdateReport:
    """Drive one clear/update over every local rank: :func:`drive_kv_cache_clear`, ``update()`` (load the
    new weights there), :func:`drive_kv_cache_restore`, under one claim of ``kv_cache_status`` (no other
    driver can come between the halves); see the module docstring.

    Each wait is bounded by ``timeout`` (default ``FD_CACHE_READY_TIMEOUT``) and ends early, naming the
    process, when ``creator_pid`` or a rank's process in ``attacher_pids`` exits. One driver at a time: a
    drive claims ``kv_cache_status`` (a lock the kernel arbitrates, :mod:`fd_platforms.ipc.claims`), and a
    second one is refused at once with a CacheSignalError naming the holder. A drive that fails after
    writing ``CLEARING`` (a wait, ``update``, an interrupt) writes ``NORMAL`` back, logs it and says so
    in its error, so the next drive can start; a
    :class:`~fd_platforms.contract.errors.SignalWaitError` says which rank or process did not move; a status
    other than ``NORMAL`` at the start (an update under way) is a ConfigError.

    ``platform`` (the selected one) and ``managers`` (whose cache managers serve the word:
    ``"fastdeploy"`` or ``"fd-platforms"``) let it refuse at once what can only time out: FastDeploy's
    XPU cache transfer manager has no clear or restore (its ``check_cache_status`` returns at once,
    ``fastdeploy/cache_manager/cache_transfer_manager.py``, "TODO XPU support RL").

    ``tp`` (the local ranks, where known) makes ``cache_ready_signal`` exactly FastDeploy's
    int32 array of that many words, else a CacheSignalError naming its size.
    """
    drive = checked_drive(suffix, timeout, creator_pid, attacher_pids, platform, managers, tp)
    if update is not None:
        _check_callable("update", update, "pass a function that loads the new weights, or None")
    with _claimed(drive, KVCacheStatus.NORMAL, KVCacheStatus.CLEARING) as (status, ready):
        started = time.monotonic()
        let_go, cleared = _clear(drive, status, ready)
        if update is not None:
            update()
        updated = time.monotonic()
        time.sleep(max(0.0, cleared + SETTLE_SECONDS - updated))  # every manager sees every slot at 0
        status.set(0, KVCacheStatus.UPDATING)
        done = _restore(drive, status, ready)
        return UpdateReport(let_go - started, cleared - let_go, updated - cleared, done - updated, ready.length)


def drive_kv_cache_clear(
    suffix: str | int,
    *,
    timeout: float | None = None,
    creator_pid: int | None = None,
    attacher_pids: Mapping[int, int] | None = None,
    platform: Platform | None = None,
    managers: str = "fastdeploy",
    tp: int | None = None,
) -> ClearReport:
    """The first of FastDeploy's two events: write ``CLEARING``, wait until every rank let go and the
    creator wrote ``CLEARED``, and return once every manager has seen every slot at 0
    (:data:`SETTLE_SECONDS`). The caches are then freed, ``kv_cache_status`` says ``CLEARED`` and the
    caller may clear or load weights for as long as it takes; :func:`drive_kv_cache_restore` is the second.

    FastDeploy's worker writes ``CLEARING`` on its engine's clear request (``model_weights_status`` CLEARING,
    ``DynamicWeightManager.check_model_weights_status``, ``fastdeploy/rl/dynamic_weight_manager.py``), and its
    engine client waits for ``CLEARED`` (``EngineClient.clear_load_weight``,
    ``fastdeploy/entrypoints/engine_client.py``). The arguments, the claim (held for this half only: the
    word's ``CLEARED`` then says that only a restore may come next) and what a failure writes back
    (``NORMAL``) as :func:`drive_kv_cache_update`'s; the status must be ``NORMAL`` at the start.
    """
    drive = checked_drive(suffix, timeout, creator_pid, attacher_pids, platform, managers, tp)
    with _claimed(drive, KVCacheStatus.NORMAL, KVCacheStatus.CLEARING) as (status, ready):
        started = time.monotonic()
        let_go, cleared = _clear(drive, status, ready)
        time.sleep(max(0.0, cleared + SETTLE_SECONDS - time.monotonic()))  # every manager sees every slot at 0
        return ClearReport(let_go - started, cleared - let_go, ready.length)


def drive_kv_cache_restore(
    suffix: str | int,
    *,
    timeout: float | None = None,
    creator_pid: int | None = None,
    attacher_pids: Mapping[int, int] | None = None,
    platform: Platform | None = None,
    managers: str = "fastdeploy",
    tp: int | None = None,
) -> RestoreReport:
    """The second of FastDeploy's two events, after :func:`drive_kv_cache_clear`: write ``UPDATING``, wait
    for the creator's ``NORMAL`` and every rank's slot set, and return once every manager has seen them set.
    The attaching ranks then attach again (:func:`~fd_platforms.engine.initialize_kv_cache`).

    FastDeploy's worker writes ``UPDATING`` on its engine's update request and its engine client waits for
    ``NORMAL`` (``EngineClient.update_model_weight``). The status must be ``CLEARED`` (a clear done) at the
    start, else a ConfigError; the claim is held for this half; a restore that fails writes ``NORMAL`` back,
    as a failed :func:`drive_kv_cache_update` does. The arguments as :func:`drive_kv_cache_update`'s.
    """
    drive = checked_drive(suffix, timeout, creator_pid, attacher_pids, platform, managers, tp)
    with _claimed(drive, KVCacheStatus.CLEARED, KVCacheStatus.UPDATING) as (status, ready):
        started = time.monotonic()
        return RestoreReport(_restore(drive, status, ready) - started, ready.length)


def checked_drive(
    suffix: str | int, timeout: float | None, creator_pid: int | None, attacher_pids: Mapping[int, int] | None,
    platform: Platform | None, managers: str, tp: int | None,
) -> _Drive:
    """A drive's arguments checked before any signal is touched."""
    suffix = check_suffix(suffix)
    _check_managers(managers, platform)
    limit = resolve_timeout(timeout)
    pids = _check_pids(attacher_pids)
    if creator_pid is not None:
        check_int("creator_pid", creator_pid, 1, None, what="None or a process id", fix="pass the cache manager's pid")
    _check_tp(tp)
    return _Drive(suffix, limit, creator_pid, pids, tp)


@contextmanager
def _claimed(
    drive: _Drive, expected: KVCacheStatus, first: KVCacheStatus
) -> Iterator[tuple[FastDeploySignal, FastDeploySignal]]:
    """The signals, ``kv_cache_status`` claimed for this driver, found at ``expected`` and set to ``first``;
    a failure inside writes NORMAL back (:func:`_written_back`)."""
    with _signals(drive.suffix, drive.tp) as (status, ready):
        holder = status.claim()
        if holder is not None:
            raise CacheSignalError(
                f"{status.name} (/dev/shm/{status.name}) is being driven by another drive_kv_cache_update, {holder}: "
                "one clear/update at a time, or the update would run twice. Fix: wait for that update to end (or stop "
                "that process), then drive again"
            )
        current = status.get(0)
        if current != expected:
            under_way = "no clear or update under way" if expected == KVCacheStatus.NORMAL else "a clear done"
            raise ConfigError(
                "kv_cache_status", _status_name(current), f"{expected.name} ({under_way})",
                f"wait for the update under way to finish, or reset {status.name} after checking no process drives it",
            )  # fmt: skip
        status.set(0, first)
        try:
            yield status, ready
        except BaseException as error:
            raise _written_back(status, error) from None


def _clear(drive: _Drive, status: FastDeploySignal, ready: FastDeploySignal) -> tuple[float, float]:
    """After the driver's CLEARING: every rank lets go, the creator frees; when each was seen (monotonic)."""
    clearing = _keeping(status, KVCacheStatus.CLEARING, over=KVCacheStatus.NORMAL)
    for rank in range(ready.length):
        ready.wait_for(rank, 0, drive.limit, watch_pid=drive.pids.get(rank),
                       what=f"rank {rank} letting go of its KV cache", tend=clearing)  # fmt: skip
    let_go = time.monotonic()
    status.wait_for(0, KVCacheStatus.CLEARED, drive.limit, watch_pid=drive.creator_pid,
                    what="the cache creator freeing the caches", tend=clearing)  # fmt: skip
    return let_go, time.monotonic()


def _restore(drive: _Drive, status: FastDeploySignal, ready: FastDeploySignal) -> float:
    """After the driver's UPDATING: the creator creates and every slot is set, left set for SETTLE_SECONDS;
    when it was done (monotonic)."""
    status.wait_for(0, KVCacheStatus.NORMAL, drive.limit, watch_pid=drive.creator_pid,
                    what="the cache creator creating the caches",
                    tend=_keeping(status, KVCacheStatus.UPDATING, over=KVCacheStatus.CLEARED))  # fmt: skip
    normal = time.monotonic()
    for rank in range(ready.length):
        ready.wait_for(rank, 1, drive.limit, watch_pid=drive.creator_pid,
                       what=f"rank {rank}'s KV cache being created again")  # fmt: skip
    done = time.monotonic()
    time.sleep(max(0.0, normal + SETTLE_SECONDS - done))  # every manager sees every slot at 1
    return done


def _written_back(status: FastDeploySignal, error: BaseException) -> BaseException:
    """``error`` of a drive that failed after writing its word, once ``kv_cache_status`` is NORMAL again
    (logged), saying so: the next drive can start."""
    was = _status_name(status.get(0))
    status.set(0, KVCacheStatus.NORMAL)
    note = f"{status.name} was written back to NORMAL (it said {was}) so that the next drive_kv_cache_update can start"
    logger.warning("drive_kv_cache_update failed (%s): %s", type(error).__name__, note)
    if isinstance(error, SignalWaitError):
        return error.with_hint(note)
    error.add_note(note)
    return error


def serve_kv_cache_status(
    managed: Sequence[ManagedCache],
    recreate: Callable[[int], ManagedCache],
    *,
    suffix: str | int,
    until: Callable[[], bool],
    timeout: float | None = None,
    tp: int | None = None,
) -> list[ManagedCache]:
    """The creator's side: follow ``kv_cache_status`` until ``until()`` is true; the caches then held.

    ``managed`` are this process's caches (from :func:`~fd_platforms.engine.manage_kv_cache` with
    ``protocol="fastdeploy"``); ``recreate(rank)`` makes one again (passing ``host_cache=`` the host swap
    cache the cleared one kept, its ``.host``, unless ``FD_ENABLE_SWAP_SPACE_CLEARING`` frees it). A status
    outside FastDeploy's
    ``KVCacheStatus`` is logged and never acted on. Once the status is not NORMAL and a held rank's
    slot was reset (its attacher let go, the 0 holding), each is cleared (its ``clear`` waits for
    the rank's attacher), then every slot must be 0 before ``CLEARED`` is written; on ``UPDATING``
    each is made again and every slot must be 1 before ``NORMAL`` is written. Waits are bounded by
    ``timeout`` (default ``FD_CACHE_READY_TIMEOUT``); ``tp`` (the local ranks, where known) is checked as
    :func:`drive_kv_cache_update` checks it.

    FastDeploy's workers each write ``UPDATING`` themselves on its engine's update request
    (``check_model_weights_status``, ``fastdeploy/rl/dynamic_weight_manager.py``), so a slower rank's can land
    after the ``NORMAL`` written here; with every cache held and every slot set, ``UPDATING`` is answered
    ``NORMAL`` again (nothing is created twice).

    Only the manager that holds local rank 0 waits for every slot and writes the answers: the word
    has no compare-and-swap, so a second writer's late CLEARED could overwrite the driver's UPDATING,
    and a manager waiting for every slot could miss a moment that already passed. Managers of other
    ranks (one per rank, as FastDeploy runs its transfer managers) follow their ranks' words and
    write nothing.
    """
    suffix = check_suffix(suffix)
    limit = resolve_timeout(timeout)
    if isinstance(managed, (str, bytes)) or not isinstance(managed, Sequence) or not all(
        isinstance(cache, ManagedCache) for cache in managed
    ):
        raise ConfigError("managed", managed, "a list of ManagedCache", "pass what manage_kv_cache returned per rank")
    _check_callable("recreate", recreate, "pass a function of the rank that calls manage_kv_cache again")
    _check_callable("until", until, "pass a function that says when to stop (e.g. threading.Event().is_set)")
    _check_tp(tp)
    held = list(managed)
    ranks = [cache.rank for cache in held]
    answers = 0 in ranks
    with _signals(suffix, tp) as (status, ready):
        last, since = None, 0.0  # the status last seen, and since when (the looks for a foreign write slow down)
        while not until():
            current = status.get(0)
            if current != last:
                last, since = current, time.monotonic()
            # A look can miss a whole phase where another rank's manager answers, so the cue to let go
            # is a held rank's own word: only its attacher resets it, when it lets go (and its 0 holds).
            if not status.allows(0, current):
                status.sleep_while(0, current, STATUS_POLL_SECONDS, since=since)  # refused and logged
            elif held and current != KVCacheStatus.NORMAL and any(ready.let_go(cache.rank) for cache in held):
                for cache in held:
                    cache.clear(limit)
                held = []
                if answers:
                    _wait_all(ready, 0, limit, "letting go of its KV cache")
                    status.set(0, KVCacheStatus.CLEARED)
            elif current in (KVCacheStatus.UPDATING, KVCacheStatus.NORMAL) and not held and ranks:
                held = [recreate(rank) for rank in ranks]
                if answers:
                    _wait_all(ready, 1, limit, "having its KV cache created")
                    status.set(0, KVCacheStatus.NORMAL)
            elif answers and current == KVCacheStatus.UPDATING and held and set(ready.values()) == {1}:
                status.set(0, KVCacheStatus.NORMAL)  # a late UPDATING over our NORMAL: see the docstring
            else:
                status.sleep_while(0, current, STATUS_POLL_SECONDS, since=since)
    return held


def _keeping(status: FastDeploySignal, ours: KVCacheStatus, *, over: KVCacheStatus) -> Callable[[], None]:
    """What keeps the driver's ``ours`` in the word while it waits: a late manager's ``over`` (the
    answer to the step before) is replaced by ``ours`` again; see the module docstring."""

    def keep() -> None:
        if status.get(0) == over:
            status.set(0, ours)

    return keep


def _wait_all(ready: FastDeploySignal, value: int, limit: float, what: str) -> None:
    for rank in range(ready.length):
        ready.wait_for(rank, value, limit, what=f"rank {rank} {what}")


MANAGERS = ("fastdeploy", "fd-platforms")
CANNOT_CLEAR = ("xpu",)  # device types whose FastDeploy cache transfer manager has no clear/restore


def _check_managers(managers: object, platform: object) -> None:
    if managers not in MANAGERS:
        raise ConfigError("managers", managers, f"one of {', '.join(MANAGERS)}",
                          "say whose cache managers serve kv_cache_status")  # fmt: skip
    if platform is not None and not isinstance(platform, Platform):
        raise ConfigError("platform", platform, "None or a Platform", "pass fd_platforms.current_platform()")
    if managers == "fastdeploy" and platform is not None and platform.identity.device_type in CANNOT_CLEAR:
        raise CacheSharingError(
            f"FastDeploy's cache transfer manager on {platform.identity.device_type} has no clear or restore (its "
            "check_cache_status returns at once: 'TODO XPU support RL'), so nothing would answer CLEARING and this "
            "update could only time out. Fix: serve kv_cache_status with fd-platforms' cache managers "
            "(serve_kv_cache_status; then pass managers='fd-platforms'), or restart FastDeploy's engine to change "
            "weights"
        )


def _check_callable(field_name: str, value: object, fix: str) -> None:
    if not callable(value):
        raise ConfigError(field_name, value, "a callable", fix)


@contextmanager
def _signals(suffix: str, tp: int | None) -> Iterator[tuple[FastDeploySignal, FastDeploySignal]]:
    """``kv_cache_status`` and ``cache_ready_signal`` (of ``tp`` words where known), attached."""
    with FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status:
        with FastDeploySignal.attach(CACHE_READY, suffix, tp) as ready:
            yield status, ready


def _check_tp(tp: object) -> None:
    if tp is not None:
        check_int("tp", tp, 1, MAX_LOCAL_RANKS, what="None or the number of local ranks",
                  fix="pass the tensor-parallel size")  # fmt: skip


def _check_pids(pids: Mapping[int, int] | None) -> dict[int, int]:
    if pids is None:
        return {}
    if not isinstance(pids, Mapping) or not all(
        is_int(rank) and is_int(pid) and pid > 0 for rank, pid in pids.items()
    ):
        raise ConfigError("attacher_pids", pids, "a mapping of local rank to process id", "pass {rank: pid, ...}")
    return dict(pids)


def _status_name(value: int) -> str:
    try:
        return KVCacheStatus(value).name
    except ValueError:
        return str(value)
