"""FastDeploy's clear/update protocol over ``kv_cache_status``: the driver's calls and the creator's.

RL weight updates clear the KV cache and create it again: the driver writes ``CLEARING``
(:func:`drive_kv_cache_clear`), every attaching rank lets go and resets its ``cache_ready_signal`` slot, the creator
(:func:`~fd_platforms.fastdeploy.cache_server.serve_kv_cache_status`) frees and writes ``CLEARED``; then the driver
writes ``UPDATING`` (:func:`drive_kv_cache_restore`), the creator creates again, sets every slot and writes
``NORMAL``, and the ranks attach again. :func:`drive_kv_cache_update` is the two halves under one claim. A late
answer of a slower rank's transfer manager is overwritten by the driver's word; a step that fails is said in the word
with values of fd-platforms' own (:class:`~fd_platforms.fastdeploy.fault_words.KVCacheFault`), and a failed drive
writes ``NORMAL`` back only where every rank's cache is there
(:class:`~fd_platforms.contract.errors.CacheUpdateError` otherwise, until :func:`drive_kv_cache_restore`).

See docs/engine-integration.md, "The clear/update protocol over kv_cache_status", for the steps, why rewriting the
driver's word is safe, the failure words, and the FastDeploy files each follows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

from ..contract.errors import CacheSharingError, CacheSignalError, CacheUpdateError, ConfigError, SignalWaitError
from ..contract.integers import check_int, is_int
from ..ipc.cache_signal import resolve_timeout
from ..ipc.process_watch import pid_max
from ..ipc.shared_words import MAX_LOCAL_RANKS, check_tp
from ..loading.platform import Platform
from .fault_words import FaultKind, KVCacheFault
from .handles import DeathWatch
from .marks import look
from .signals import CACHE_READY, KV_CACHE_STATUS, FastDeploySignal, KVCacheStatus, check_suffix

SETTLE_SECONDS = 0.5
"""The least time the driver leaves every slot at 0 (from the first ``CLEARED`` to its ``UPDATING``) and
at 1 (from ``NORMAL`` to its return, so to a next clear): FastDeploy's managers look at the slots every
0.1 s (``check_cache_status``) and wait for all of them to be 0, then 1; one whose looks miss that
moment waits forever. FastDeploy's own driver leaves seconds there (the weight update, the next
request)."""
logger = logging.getLogger(__name__)


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
class Drive:
    """A drive's arguments, checked: the bound on each wait and the processes each wait watches."""

    suffix: str
    limit: float
    creator_pid: int | None
    pids: dict[int, int]
    tp: int | None


def drive_kv_cache_update(
    instance: str | int,
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
    driver can come between the halves); see the module docstring. ``instance`` is the engine instance, FastDeploy's
    signal suffix.

    Each wait is bounded by ``timeout`` (default ``FD_CACHE_READY_TIMEOUT``) and ends early, naming the
    process, when ``creator_pid`` or a rank's process in ``attacher_pids`` exits. One driver at a time: a
    drive claims ``kv_cache_status`` (a lock the kernel arbitrates, :mod:`fd_platforms.ipc.claims`), and a
    second one is refused at once with a CacheSignalError naming the holder. A drive that fails after
    writing ``CLEARING`` (a wait, ``update``, an interrupt, a failure word of the creator's) writes ``NORMAL``
    back where every rank's cache is there, else leaves a failure word (module docstring); it logs which and
    says so in its error. A :class:`~fd_platforms.contract.errors.SignalWaitError` says which rank or process
    did not move, a :class:`~fd_platforms.contract.errors.CacheUpdateError` which rank the creator could not
    clear or create. At the start, a status other than ``NORMAL`` (an update under way) is a ConfigError, a
    failure word left by a drive that failed after the caches were freed a CacheUpdateError naming it (the
    creator's ``-10000 - rank``, every cache kept, counts as ``NORMAL``, with a WARNING).

    ``platform`` (the selected one) and ``managers`` (whose cache managers serve the word:
    ``"fastdeploy"`` or ``"fd-platforms"``) let it refuse at once what can only time out: FastDeploy's
    XPU cache transfer manager has no clear or restore (its ``check_cache_status`` returns at once,
    ``fastdeploy/cache_manager/cache_transfer_manager.py``, "TODO XPU support RL").

    ``tp`` (the local ranks, where known) makes ``cache_ready_signal`` exactly FastDeploy's
    int32 array of that many words, else a CacheSignalError naming its size. ``creator_pid`` and every pid
    in ``attacher_pids`` must be a process id the kernel can give (1 to ``/proc/sys/kernel/pid_max``), and
    every rank there a local rank (0 to ``tp`` - 1, or to the signal's words less one once attached):
    checked before any signal word is written, a ConfigError naming the field otherwise.
    """
    drive = checked_drive(instance, timeout, creator_pid, attacher_pids, platform, managers, tp)
    if update is not None:
        check_callable("update", update, "pass a function that loads the new weights, or None")
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
    instance: str | int,
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
    (:data:`~fd_platforms.fastdeploy.cache_status.SETTLE_SECONDS`). The caches are then freed, ``kv_cache_status`` says
    ``CLEARED`` and the caller may clear or load weights for as long as it takes; :func:`drive_kv_cache_restore` is the
    second.

    FastDeploy's worker writes ``CLEARING`` on its engine's clear request (``model_weights_status`` CLEARING,
    ``DynamicWeightManager.check_model_weights_status``, ``fastdeploy/rl/dynamic_weight_manager.py``), and its
    engine client waits for ``CLEARED`` (``EngineClient.clear_load_weight``,
    ``fastdeploy/entrypoints/engine_client.py``). The arguments, the claim (held for this half only: the
    word's ``CLEARED`` then says that only a restore may come next), what a failure leaves and what the
    status must be at the start as :func:`drive_kv_cache_update`'s.
    """
    drive = checked_drive(instance, timeout, creator_pid, attacher_pids, platform, managers, tp)
    with _claimed(drive, KVCacheStatus.NORMAL, KVCacheStatus.CLEARING) as (status, ready):
        started = time.monotonic()
        let_go, cleared = _clear(drive, status, ready)
        time.sleep(max(0.0, cleared + SETTLE_SECONDS - time.monotonic()))  # every manager sees every slot at 0
        return ClearReport(let_go - started, cleared - let_go, ready.length)


def drive_kv_cache_restore(
    instance: str | int,
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
    ``NORMAL`` (``EngineClient.update_model_weight``). The status must be ``CLEARED`` (a clear done) or a
    failure word saying a rank may have no cache (a drive or a creation that failed after the caches were
    freed: the creator creates what is missing) at the start, else a ConfigError; the claim is held for this
    half; a restore that fails leaves what :func:`drive_kv_cache_update` leaves (every slot set: ``NORMAL``,
    else a failure word). The arguments as :func:`drive_kv_cache_update`'s.
    """
    drive = checked_drive(instance, timeout, creator_pid, attacher_pids, platform, managers, tp)
    with _claimed(drive, KVCacheStatus.CLEARED, KVCacheStatus.UPDATING) as (status, ready):
        started = time.monotonic()
        return RestoreReport(_restore(drive, status, ready) - started, ready.length)


def checked_drive(
    suffix: str | int,
    timeout: float | None,
    creator_pid: int | None,
    attacher_pids: Mapping[int, int] | None,
    platform: Platform | None,
    managers: str,
    tp: int | None,
) -> Drive:
    """A drive's arguments checked before any signal is touched (the ranks of ``attacher_pids`` against the
    signal's length once attached, ``_check_ranks_fit()``)."""
    suffix = check_suffix(suffix, "instance")
    _check_managers(managers, platform)
    limit = resolve_timeout(timeout)
    check_tp(tp)
    pids = _check_pids(attacher_pids, tp)
    if creator_pid is not None:
        _check_pid("creator_pid", creator_pid, "pass the cache manager's pid")
    return Drive(suffix, limit, creator_pid, pids, tp)


@contextmanager
def _claimed(
    drive: Drive, expected: KVCacheStatus, first: KVCacheStatus
) -> Iterator[tuple[FastDeploySignal, FastDeploySignal]]:
    """The signals, ``kv_cache_status`` claimed for this driver, found at ``expected`` (:func:`_check_start`)
    and set to ``first``; a failure inside writes back what is true (:func:`_left_after`)."""
    with status_signals(drive.suffix, drive.tp) as (status, ready):
        _check_ranks_fit(drive.pids, ready)
        holder = status.claim()
        if holder is not None:
            raise CacheSignalError(
                f"{status.name} (/dev/shm/{status.name}) is being driven by another drive_kv_cache_update, {holder}: "
                "one clear/update at a time, or the update would run twice. Fix: wait for that update to end (or stop "
                "that process), then drive again"
            )
        _check_start(status, expected)
        status.set(0, first)
        try:
            yield status, ready
        except BaseException as error:  # noqa: BLE001 - any failure leaves the word saying what is true
            raise _left_after(status, ready, error) from None


def _check_start(status: FastDeploySignal, expected: KVCacheStatus) -> None:
    """Refuse to start unless ``kv_cache_status`` says ``expected``: a failure word is a CacheUpdateError
    naming it, except where it lets this drive start (a kept one a clear, a lost one a restore: see
    :func:`drive_kv_cache_update`, :func:`drive_kv_cache_restore`); anything else a ConfigError."""
    current = status.get(0)
    fault = KVCacheFault.read(current)
    if fault is not None and fault.kept == (expected == KVCacheStatus.NORMAL):
        if fault.kept:
            logger.warning(
                "%s says %s: every cache is held, so this drive starts from it", status.name, fault.describe()
            )
        return
    if fault is not None and not fault.kept:
        raise CacheUpdateError(
            f"{status.name} says {fault.describe()}: the last clear/update failed after the caches were freed, so "
            "another clear would wait for caches that are not there. Fix: run drive_kv_cache_restore (the cache "
            "creator creates what is missing; its log names why it could not) once the cause is gone, e.g. space in "
            "/dev/shm; if the cache creator exited, restart the engine",
            fault.word,
            fault.rank,
        )
    if current != expected:
        under_way = "no clear or update under way" if expected == KVCacheStatus.NORMAL else "a clear done"
        fix = f"wait for the update under way to finish, or reset {status.name} after checking no process drives it"
        if current == KVCacheStatus.CLEARED:
            fix = "the caches are freed: run drive_kv_cache_restore first (it has the creator create them again)"
        raise ConfigError("kv_cache_status", _status_name(current), f"{expected.name} ({under_way})", fix)


def _clear(drive: Drive, status: FastDeploySignal, ready: FastDeploySignal) -> tuple[float, float]:
    """After the driver's CLEARING: every rank lets go, the creator frees; when each was seen (monotonic)."""
    clearing = _keeping(status, KVCacheStatus.CLEARING, over=KVCacheStatus.NORMAL)
    for rank in range(ready.length):
        if not ready.let_go(rank):
            dead = DeathWatch(ready, rank, partial(look, drive.suffix, rank))  # an attacher of ours that died
            ready.wait_for(
                rank,
                0,
                drive.limit,
                watch_pid=drive.pids.get(rank),
                what=f"rank {rank} letting go of its KV cache",
                tend=partial(_each, clearing, dead),
            )
    let_go = time.monotonic()
    status.wait_for(
        0,
        KVCacheStatus.CLEARED,
        drive.limit,
        watch_pid=drive.creator_pid,
        what="the cache creator freeing the caches",
        tend=clearing,
    )
    return let_go, time.monotonic()


def _restore(drive: Drive, status: FastDeploySignal, ready: FastDeploySignal) -> float:
    """After the driver's UPDATING: the creator creates and every slot is set, left set for SETTLE_SECONDS;
    when it was done (monotonic)."""
    status.wait_for(
        0,
        KVCacheStatus.NORMAL,
        drive.limit,
        watch_pid=drive.creator_pid,
        what="the cache creator creating the caches",
        tend=_keeping(status, KVCacheStatus.UPDATING, over=KVCacheStatus.CLEARED),
    )
    normal = time.monotonic()
    for rank in range(ready.length):
        ready.wait_for(
            rank, 1, drive.limit, watch_pid=drive.creator_pid, what=f"rank {rank}'s KV cache being created again"
        )
    done = time.monotonic()
    time.sleep(max(0.0, normal + SETTLE_SECONDS - done))  # every manager sees every slot at 1
    return done


def _left_after(status: FastDeploySignal, ready: FastDeploySignal, error: BaseException) -> BaseException:
    """``error`` of a drive that failed after writing its word, saying what ``kv_cache_status`` was left at
    (logged): NORMAL where every slot is set (every rank's cache is there), unless the creator's failure
    word says a rank has none; else that failure word, or DRIVE_FAILED (see the module docstring)."""
    said = status.get(0)
    fault = KVCacheFault.read(said)
    if (fault is None or fault.kept) and all(slot == 1 for slot in ready.values()):
        status.set(0, KVCacheStatus.NORMAL)
        note = (
            f"{status.name} was written back to NORMAL (it said {_status_name(said)}): every rank's cache is "
            "there (every cache_ready_signal slot set), so the next drive_kv_cache_update can start"
        )
    elif fault is not None and fault.kept:
        note = (
            f"{status.name} was left at {_status_name(said)}, not NORMAL: a cache_ready_signal slot is 0 while the "
            "creator creates again what it freed; the next drive_kv_cache_update starts from it"
        )
    else:
        if fault is None:
            status.set(0, KVCacheFault(FaultKind.DRIVE_FAILED).word)
        note = (
            f"{status.name} was left at {_status_name(status.get(0))} (it said {_status_name(said)}), not NORMAL: "
            "not every rank's cache is there (a cache_ready_signal slot is 0). Fix: drive_kv_cache_restore has the "
            "creator create what is missing; the next clear or update is refused until then"
        )
    logger.warning("drive_kv_cache_update failed (%s): %s", type(error).__name__, note)
    if isinstance(error, (SignalWaitError, CacheUpdateError)):
        return error.with_hint(note)
    if hasattr(error, "add_note"):  # Python 3.11+ (PEP 678); on 3.10 the warning above alone carries the note
        error.add_note(note)
    return error


def _each(*tends: Callable[[], None]) -> None:
    """Run each of ``tends``: one wait's tend made of several."""
    for tend in tends:
        tend()


def _keeping(status: FastDeploySignal, ours: KVCacheStatus, *, over: KVCacheStatus) -> Callable[[], None]:
    """What keeps the driver's ``ours`` in the word while it waits: a late manager's ``over`` (the
    answer to the step before) is replaced by ``ours`` again; see the module docstring. A creator's failure
    word ends the wait: a CacheUpdateError naming it."""

    def keep() -> None:
        now = status.get(0)
        fault = KVCacheFault.read(now)
        if fault is not None:
            raise CacheUpdateError(
                f"{status.name} says {fault.describe()}, in place of the drive's {ours.name}. Fix: the cache "
                f"creator's log names the cause (an ERROR naming rank {fault.rank}): e.g. stop the process that "
                "holds that rank's cache, or free space in /dev/shm; then drive again",
                fault.word,
                fault.rank,
            )
        if now == over:
            status.set(0, ours)

    return keep


MANAGERS = ("fastdeploy", "fd-platforms")
CANNOT_CLEAR = ("xpu",)  # device types whose FastDeploy cache transfer manager has no clear/restore


def _check_managers(managers: object, platform: object) -> None:
    if managers not in MANAGERS:
        raise ConfigError(
            "managers", managers, f"one of {', '.join(MANAGERS)}", "say whose cache managers serve kv_cache_status"
        )
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


def check_callable(field_name: str, value: object, fix: str) -> None:
    if not callable(value):
        raise ConfigError(field_name, value, "a callable", fix)


@contextmanager
def status_signals(suffix: str, tp: int | None) -> Iterator[tuple[FastDeploySignal, FastDeploySignal]]:
    """``kv_cache_status`` and ``cache_ready_signal`` (of ``tp`` words where known), attached."""
    with (
        FastDeploySignal.attach(KV_CACHE_STATUS, suffix) as status,
        FastDeploySignal.attach(CACHE_READY, suffix, tp) as ready,
    ):
        yield status, ready


def _check_pid(field_name: str, pid: object, fix: str) -> None:
    check_int(field_name, pid, 1, pid_max(), what="None or a process id", note="/proc/sys/kernel/pid_max", fix=fix)


ATTACHER_PIDS_FIX = "pass {local rank: the pid of that rank's attaching process, ...}"


def _check_pids(pids: object, tp: int | None) -> dict[int, int]:
    """``attacher_pids``: local ranks (0 to ``tp`` - 1, else to MAX_LOCAL_RANKS - 1) to process ids."""
    if pids is None:
        return {}
    if not isinstance(pids, Mapping):
        raise ConfigError("attacher_pids", pids, "None or a mapping of local rank to process id", ATTACHER_PIDS_FIX)
    ranks, of = (tp, f"tp {tp}") if tp is not None else (MAX_LOCAL_RANKS, "the most local ranks")
    limit = pid_max()
    for rank, pid in pids.items():
        if not (is_int(rank) and 0 <= rank < ranks and is_int(pid) and 1 <= pid <= limit):
            raise ConfigError(
                "attacher_pids",
                {rank: pid},
                f"local ranks from 0 to {ranks - 1} ({of}), each to a process id from "
                f"1 to {limit} (/proc/sys/kernel/pid_max)",
                ATTACHER_PIDS_FIX,
            )
    return dict(pids)


def _check_ranks_fit(pids: Mapping[int, int], ready: FastDeploySignal) -> None:
    """Every rank of ``attacher_pids`` one of ``cache_ready_signal``'s words (its local ranks: tp not given)."""
    for rank, pid in pids.items():
        if rank >= ready.length:
            raise ConfigError(
                "attacher_pids",
                {rank: pid},
                f"local ranks from 0 to {ready.length - 1} ({ready.name} has "
                f"{ready.length} word{'s' if ready.length > 1 else ''}, one per local rank)",
                f"{ATTACHER_PIDS_FIX} of this engine's local ranks; pass tp= to have it checked before attaching",
            )


def _status_name(value: int) -> str:
    fault = KVCacheFault.read(value)
    if fault is not None:
        return fault.describe()
    try:
        return KVCacheStatus(value).name
    except ValueError:
        return str(value)
