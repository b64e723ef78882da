"""Marks: what our processes beside FastDeploy's leave in ``/dev/shm``, so a dead one of ours is told from FastDeploy's.

FastDeploy's worker and cache transfer manager attach with ``share_external_data`` and hold nothing: no lock, mark
or pid file; they let go by resetting their rank's ``cache_ready_signal`` slot to 0 (``gpu_model_runner.py``
``clear_cache`` waits for that when ``num_cpu_blocks > 0``). An attacher of ours that is SIGKILLed never does, so
each one makes a mark of its own and holds a shared ``flock`` on it while attached; the kernel drops the lock when
the process dies, however it dies.

- **Attacher marks**, ``fdp-attacher.<suffix>.r<rank>.<pid>-<hex>``: one per attaching process and part, naming the
  slot it holds (the suffix and rank), its pid and how many processes attach each rank in its deployment
  (:func:`fd_platforms.rules.roles.cache_roles`). A dead mark stands for the slot only where every attacher the
  deployment can have is a dead one of ours (:attr:`Attachers.released_by_death`): in P/D with swap space the other
  attacher may be FastDeploy's, and a dead mark says nothing about it.
- **Creator marks**, ``<first record>.fdp-creator``: a creator of ours holds one while its records are published,
  with its pid, how many processes it knows attach (:func:`creator_attachers`; :data:`COUNTED` for P/D's cache
  messager, which cannot know) and the first record's bytes.
  One nobody holds whose bytes are still the record's proves the records stale ones of a dead creator of ours;
  records without that proof may be a living FastDeploy process's.

Marks are this user's, mode 0600; one nobody holds is removed through :func:`fd_platforms.ipc.shm.reclaim`, which
proves it unlocked first.
"""

from __future__ import annotations

import os
import secrets
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass

from ..contract.errors import CacheSharingError, FdPlatformsError
from ..ipc import shm
from .signals import CACHE_READY, CACHE_TRANSFER_INITED, FastDeploySignal

_ATTACHER = struct.Struct("=qqq")  # pid, rank, attachers per rank
_PID = struct.Struct("=q")  # either mark starts with its maker's pid
_CREATOR = struct.Struct("=qq")  # a creator mark: its pid, the attachers it expects per rank, then the first record
ATTACHER_WHAT = "FastDeploy attacher mark"
CREATOR_WHAT = "FastDeploy creator mark"
MAX_ATTACHERS = 2
COUNTED = -1  # a creator mark's count where the creator (P/D's cache messager) cannot know it: counted at each look


ATTACHER_NAME_START = "fdp-attacher."


def attacher_prefix(suffix: str, rank: int) -> str:
    """The names of the marks of the attachers of ``rank``'s slot under ``suffix`` start with this."""
    return f"{ATTACHER_NAME_START}{suffix}.r{rank}."


def make_attacher_mark(suffix: str, rank: int, attachers: int) -> shm.Segment:
    """This attacher's mark of ``rank``'s slot, held (shared) until closed; the kernel drops it at death."""
    name = f"{attacher_prefix(suffix, rank)}{os.getpid()}-{secrets.token_hex(3)}"
    return shm.Segment.create(name, _ATTACHER.size, _ATTACHER.pack(os.getpid(), rank, attachers))


@dataclass(frozen=True)
class DeadMark:
    """The mark of an attacher of ours that is gone without letting go (its lock dropped)."""

    name: str
    pid: int
    says: int = 1  # the attachers per rank its maker counted


@dataclass(frozen=True)
class Attachers:
    """What the marks of one slot say: the attachers of ours still attached (each ``pid N`` as ``/proc/locks``
    shows its holder), the dead ones, how many attachers the deployment has per rank (the most any mark says), and
    the held marks by name (one per attacher: two attachers of one process hold two)."""

    living: tuple[str, ...]
    dead: tuple[DeadMark, ...]
    per_rank: int
    held: tuple[str, ...] = ()

    @property
    def released_by_death(self) -> bool:
        """Whether the slot stands released: no attacher of ours lives, and dead ones of ours are as many as the
        attachers the deployment can have (so none of them can be FastDeploy's, which holds nothing)."""
        return not self.living and len({mark.pid for mark in self.dead}) >= self.per_rank

    def describe_dead(self) -> str:
        """The dead attachers, for messages (``pid 12, pid 34``)."""
        return ", ".join(f"pid {mark.pid}" for mark in self.dead)


def look(
    suffix: str,
    rank: int,
    *,
    also_living: set[int] | frozenset[int] = frozenset(),
    floor: int = 1,
    exact: int | None = None,
) -> Attachers:
    """The marks of ``rank``'s slot under ``suffix``, looked at, none removed. ``also_living`` are pids of attachers
    of ours the caller knows alive otherwise (a creator: those holding its first record), a mark of theirs or not.
    The attachers per rank are ``exact`` where the caller knows them (a creator that sees its deployment), else the
    most any mark says, never below ``floor``: no mark, dead or forged, lowers what the caller knows. A dead mark
    that counts fewer attachers than that was made by no process of this deployment (each counts the same, by
    :func:`fd_platforms.rules.roles.cache_roles`): it never stands for one of them."""
    living = {f"pid {pid}" for pid in also_living}
    dead: list[DeadMark] = []
    held: list[str] = []
    per_rank = 1
    for name in shm.names(attacher_prefix(suffix, rank)):
        try:
            segment = shm.Segment.inspect(name, _ATTACHER.size)
        except (OSError, shm.SegmentUnusable):
            continue  # gone meanwhile, or not a mark of this user's
        with segment:
            pid, marked_rank, attachers = _ATTACHER.unpack(segment.read(_ATTACHER.size))
            if pid <= 0 or marked_rank != rank or not 1 <= attachers <= MAX_ATTACHERS:
                continue  # not a complete mark of ours: left alone
            per_rank = max(per_rank, attachers)
            if segment.unused():
                dead.append(DeadMark(name, pid, attachers))
            else:
                living.update(f"pid {holder}" for holder in shm.flock_holders(segment.inode) or {pid})
                held.append(name)
    counted = exact if exact is not None else max(floor, per_rank)
    ours = tuple(mark for mark in dead if mark.says >= counted)
    return Attachers(tuple(sorted(living)), ours, counted, tuple(sorted(held)))


def remove_dead(attachers: Attachers) -> list[int]:
    """Remove the dead marks of ``attachers`` that are still dead (each proven unlocked again); their pids."""
    return [mark.pid for mark in attachers.dead if _reclaimed(mark.name, say=lambda *_: None)]


def remove_every_dead(suffix: str, rank: int) -> list[int]:
    """Remove every dead mark of ``rank``'s slot, whatever it counts (a publication's start and end: none stands for
    an attacher of the next); their pids."""
    return remove_dead(look(suffix, rank, exact=0))


def sweep_orphan_marks() -> list[str]:
    """Remove the dead attacher marks of slots that are gone (no ``cache_ready_signal.<suffix>`` any more: the engine
    that owned the suffix exited, or a run's signals were swept), each proven ours and unlocked; the names removed.
    A dead mark of a slot that still exists is left: it stands for its attacher until the slot's creator clears."""
    removed = []
    for name in shm.names(ATTACHER_NAME_START):
        suffix = name[len(ATTACHER_NAME_START) :].rsplit(".r", 1)[0]
        if suffix and not os.path.exists(shm.shm_path(f"{CACHE_READY}.{suffix}")) and _reclaimed(name):
            removed.append(name)
    return removed


def _reclaimed(name: str, say: Callable[..., None] | None = None) -> bool:
    """Whether attacher mark ``name`` was removed, proven ours and unlocked (:func:`fd_platforms.ipc.shm.reclaim`,
    ``say`` as it takes it)."""
    return shm.reclaim(name, _ATTACHER.size, _recognise, ATTACHER_WHAT, say=say)[0] == shm.Verdict.RECLAIMED


def _recognise(segment: shm.Segment) -> str | None:
    """Who made a mark of either kind (each starts with its maker's pid), or None where it is no complete mark."""
    raw = segment.read(_PID.size)
    return f"pid {_PID.unpack(raw)[0]}" if len(raw) == _PID.size and _PID.unpack(raw)[0] > 0 else None


def creator_mark_name(first_record: str) -> str:
    return f"{first_record}.fdp-creator"


def make_creator_mark(first_record: str, record: bytes, attachers: int = 1) -> shm.Segment:
    """A creator's mark of its records, holding its pid, the ``attachers`` it expects per rank and the first
    ``record``'s bytes, held until closed. A mark of a dead creator of ours still there (its records rewritten since
    by another) is removed first; anything else under the mark's name (a living creator's mark, an empty or foreign
    file, a directory, a FIFO, a link, another user's entry) is a CacheSharingError naming it and its owner."""
    name, content = creator_mark_name(first_record), _CREATOR.pack(os.getpid(), attachers) + record
    try:
        return shm.Segment.create(name, len(content), content)
    except FileExistsError:
        _, why = shm.reclaim(name, _PID.size, _recognise, CREATOR_WHAT)
    try:
        return shm.Segment.create(name, len(content), content)
    except FileExistsError:
        raise CacheSharingError(
            f"cannot mark FastDeploy's records from {first_record!r} as this creator's: /dev/shm/{name} exists "
            f"({_entry(name)}) and is no dead creator mark of ours ({why or 'it came back meanwhile'}). Fix: if no "
            f"engine uses this rank's records, remove /dev/shm/{name}; else give this engine another "
            "engine_worker_queue_port"
        ) from None


def _entry(name: str) -> str:
    """What ``/dev/shm/<name>`` is and whose, for an error: ``"a directory of uid 1000"``."""
    try:
        found = os.lstat(f"{shm.SHM_DIR}/{name}")
    except OSError as error:
        return f"it cannot be read: {error.strerror or error}"
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"))
    kind = next((word for test, word in kinds if test(found.st_mode)), f"a file of {found.st_size} bytes")
    return f"{kind} of uid {found.st_uid}" + (" (another user)" if found.st_uid != os.geteuid() else "")


def creator_attachers(first_record: str) -> int | None:
    """How many processes the living creator of ours of ``first_record`` knows attach each rank (its mark says: one
    where it holds the host swap space itself, the rank's transfer manager), or None where no living creator of ours
    holds the records (FastDeploy's creators make no mark) or it cannot know (P/D's cache messager: :data:`COUNTED`)."""
    try:
        segment = shm.Segment.inspect(creator_mark_name(first_record), _CREATOR.size)
    except (OSError, shm.SegmentUnusable):
        return None
    with segment:
        pid, attachers = _CREATOR.unpack(segment.read(_CREATOR.size))
        return attachers if pid > 0 and 0 <= attachers <= MAX_ATTACHERS and not segment.unused() else None


def transfer_manager_up(suffix: str, rank: int) -> bool:
    """Whether ``rank``'s cache transfer manager has said it is up in FastDeploy's ``cache_transfer_inited_signal``
    (its ``__init__``, once attached: ``cache_transfer_manager.py`` ~L303-311 at c1b7c083; FastDeploy's engine makes
    the signal before any cache process starts, ``common_engine.py`` ~L425, and serves only once every rank's is set,
    ``prefix_cache_manager.py`` ~L341). In P/D that manager attaches beside the worker; FastDeploy's holds no mark."""
    try:
        with FastDeploySignal.attach(CACHE_TRANSFER_INITED, suffix) as inited:
            return 0 <= rank < inited.length and inited.get(rank) == 1
    except FdPlatformsError:
        return False  # no FastDeploy engine made it: none of its transfer managers runs


def stale_creator(first_record: str, record: bytes) -> int | None:
    """The pid of a dead creator of ours whose mark proves ``first_record`` (now holding ``record``) its stale
    leftover, its mark removed; None where no unheld mark of ours holds exactly those bytes."""
    name = creator_mark_name(first_record)
    size = _CREATOR.size + len(record)
    try:
        segment = shm.Segment.inspect(name, size)
    except (OSError, shm.SegmentUnusable):
        return None
    with segment:
        raw = segment.read(size + 1)
        if len(raw) != size or raw[_CREATOR.size :] != record or not segment.unused():
            return None
        pid = _PID.unpack(raw[: _PID.size])[0]
        return pid if segment.unlink() else None
