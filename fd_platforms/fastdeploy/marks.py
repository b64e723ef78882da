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
- **Creator marks**, ``<first record>.fdp-creator.<pid>-<hex>``: a creator of ours holds one while its records are
  published, with its pid, how many processes it knows attach (:func:`creator_attachers`; :data:`COUNTED` for P/D's
  cache messager, which cannot know) and the first record's bytes. One nobody holds whose bytes are still the
  record's proves the records stale ones of a dead creator of ours; records without that proof may be a living
  FastDeploy process's.

No mark has a fixed name: each ends in its maker's pid and random hex, and readers list the prefix and pass over
what is not this user's mark, so an entry anyone plants in ``/dev/shm`` (another user's, an empty file, a directory)
stops no engine. FastDeploy's own record names are fixed by FastDeploy: a planted record stays a typed refusal
naming its owner (:mod:`.handles`).

Marks are this user's, mode 0600; one nobody holds is removed through :func:`fd_platforms.ipc.shm.reclaim`, which
proves it unlocked first.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from ..contract.errors import CacheSharingError, FdPlatformsError
from ..ipc import shm
from .signals import CACHE_READY, CACHE_TRANSFER_INITED, FastDeploySignal

logger = logging.getLogger(__name__)

_ATTACHER = struct.Struct("=qqq")  # pid, rank, attachers per rank
_PID = struct.Struct("=q")  # either mark starts with its maker's pid
_CREATOR = struct.Struct("=qq")  # a creator mark: its pid, the attachers it expects per rank, then the first record
ATTACHER_WHAT = "FastDeploy attacher mark"
CREATOR_WHAT = "FastDeploy creator mark"
MAX_ATTACHERS = 2
MARK_NAME_TRIES = 8  # random names tried for one mark (each taken only by a process racing this one)
COUNTED = -1  #: a creator mark's count where the creator (P/D's cache messager) cannot know it: counted at each look


ATTACHER_NAME_START = "fdp-attacher."
_ATTACHER_NAME = re.compile(
    rf"{re.escape(ATTACHER_NAME_START)}(?P<suffix>.+)\.r(?P<rank>\d+)\.(?P<pid>\d+)-[0-9a-f]{{6,16}}"
)


def attacher_prefix(suffix: str, rank: int) -> str:
    """The names of the marks of the attachers of ``rank``'s slot under ``suffix`` start with this."""
    return f"{ATTACHER_NAME_START}{suffix}.r{rank}."


def make_attacher_mark(suffix: str, rank: int, attachers: int) -> shm.Segment:
    """This attacher's mark of ``rank``'s slot, held (shared) until closed; the kernel drops it at death. Its name
    ends in its pid and random hex, so no one can take it first: a name taken is tried again with other hex."""
    content = _ATTACHER.pack(os.getpid(), rank, attachers)
    for _ in range(MARK_NAME_TRIES):
        try:
            name = f"{attacher_prefix(suffix, rank)}{os.getpid()}-{secrets.token_hex(8)}"
            return shm.Segment.create(name, _ATTACHER.size, content)
        except FileExistsError:
            continue
    raise CacheSharingError(
        f"cannot mark this attacher of rank {rank}: {MARK_NAME_TRIES} random names under /dev/shm/"
        f"{attacher_prefix(suffix, rank)} were taken as they were made. Fix: look at who fills /dev/shm with them"
    )


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
    return [mark.pid for mark in attachers.dead if _reclaimed(mark.name)]


def remove_every_dead(suffix: str, rank: int) -> list[int]:
    """Remove every dead mark of ``rank``'s slot, whatever it counts (a publication's start and end: none stands for
    an attacher of the next); their pids."""
    return remove_dead(look(suffix, rank, exact=0))


def sweep_orphan_marks() -> list[str]:
    """Remove the dead attacher marks of slots that are gone (no ``cache_ready_signal.<suffix>`` any more: the engine
    that owned the suffix exited, or a run's signals were swept), each recognised as one of ours in full (its name's
    form, its size, its pid, rank and count, ``_recognise_attacher()``) and proven unlocked; the names removed, said
    in one WARNING line. A dead mark of a slot that still exists is left: it stands for its attacher until the slot's
    creator clears."""
    removed = []
    for name in shm.names(ATTACHER_NAME_START):
        found = _ATTACHER_NAME.fullmatch(name)
        if found is None or os.path.exists(shm.shm_path(f"{CACHE_READY}.{found['suffix']}")):
            continue
        if _reclaimed(name):
            removed.append(name)
    if removed:
        logger.warning(
            "removed %d dead %s(s) whose slots are gone (no process held them): %s",
            len(removed),
            ATTACHER_WHAT,
            ", ".join(removed[:3]) + (f" and {len(removed) - 3} more" if len(removed) > 3 else ""),
        )
    return removed


def _recognise_attacher(segment: shm.Segment) -> str | None:
    """Who made attacher mark ``segment``, or None where it is not exactly one of ours: a name of the form
    :func:`make_attacher_mark` gives, :data:`_ATTACHER`'s size, and the pid and rank its name says, with a count
    of attachers a deployment can have."""
    found = _ATTACHER_NAME.fullmatch(segment.name)
    raw = segment.read(_ATTACHER.size + 1)
    if found is None or len(raw) != _ATTACHER.size:
        return None
    pid, rank, attachers = _ATTACHER.unpack(raw)
    if pid != int(found["pid"]) or rank != int(found["rank"]) or not 1 <= attachers <= MAX_ATTACHERS:
        return None
    return f"pid {pid}"


def _reclaimed(name: str) -> bool:
    """Whether attacher mark ``name`` was removed, recognised as ours and proven unlocked, without a word (its
    caller says what it removed)."""
    found = shm.reclaim(name, _ATTACHER.size, _recognise_attacher, ATTACHER_WHAT, say=lambda *_: None)
    return found[0] == shm.Verdict.RECLAIMED


def _recognise(segment: shm.Segment) -> str | None:
    """Who made a mark of either kind (each starts with its maker's pid), or None where it is no complete mark."""
    raw = segment.read(_PID.size)
    return f"pid {_PID.unpack(raw)[0]}" if len(raw) == _PID.size and _PID.unpack(raw)[0] > 0 else None


def creator_prefix(first_record: str) -> str:
    """The names of creator marks of the records from ``first_record`` start with this; each adds its maker's pid
    and random hex, so no name is fixed: anyone may create any free name in ``/dev/shm``, and one planted there
    (another user's, an empty file, a directory) is some other entry, never a mark that stops a creator."""
    return f"{first_record}.fdp-creator."


def make_creator_mark(first_record: str, record: bytes, attachers: int = 1) -> shm.Segment:
    """A creator's mark of its records, holding its pid, the ``attachers`` it expects per rank and the first
    ``record``'s bytes, held until closed. Marks of dead creators of ours for these records (rewritten since by
    another) are removed first; entries under the prefix that are no mark of this user's are left alone, in the
    way of nothing. A living creator of ours holding a mark of them is a CacheSharingError naming it."""
    prefix = creator_prefix(first_record)
    for name in shm.names(prefix):
        verdict, why = shm.reclaim(name, _PID.size, _recognise, CREATOR_WHAT)
        if verdict == shm.Verdict.IN_USE:
            raise CacheSharingError(
                f"cannot mark FastDeploy's records from {first_record!r} as this creator's: /dev/shm/{name} is "
                f"another creator's mark of them ({why}). Fix: clear that engine's cache first, or give this engine "
                "other device ids (FastDeploy's record names carry only the layer, rank and device id)"
            )
    content = _CREATOR.pack(os.getpid(), attachers) + record
    for _ in range(MARK_NAME_TRIES):
        try:
            return shm.Segment.create(f"{prefix}{os.getpid()}-{secrets.token_hex(8)}", len(content), content)
        except FileExistsError:
            continue  # taken by someone in the meantime: another random name
    raise CacheSharingError(
        f"cannot mark FastDeploy's records from {first_record!r}: {MARK_NAME_TRIES} random names under /dev/shm/"
        f"{prefix} were taken as they were made. Fix: look at who fills /dev/shm with {prefix}* and remove those"
    )


def _creator_marks(first_record: str, size: int) -> Iterator[shm.Segment]:
    """This user's creator marks of the records from ``first_record``, each at least ``size`` bytes, opened in turn
    (and closed after); others' entries and what cannot be opened are passed over."""
    for name in shm.names(creator_prefix(first_record)):
        try:
            segment = shm.Segment.inspect(name, size)
        except (OSError, shm.SegmentUnusable):
            continue
        with segment:
            yield segment


def creator_attachers(first_record: str) -> int | None:
    """How many processes the living creator of ours of ``first_record`` knows attach each rank (its mark says: one
    where it holds the host swap space itself, the rank's transfer manager), or None where no living creator of ours
    holds the records (FastDeploy's creators make no mark) or it cannot know (P/D's cache messager: :data:`COUNTED`)."""
    for segment in _creator_marks(first_record, _CREATOR.size):
        pid, attachers = _CREATOR.unpack(segment.read(_CREATOR.size))
        if pid > 0 and not segment.unused():
            return attachers if 0 <= attachers <= MAX_ATTACHERS else None
    return None


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
    size = _CREATOR.size + len(record)
    for segment in _creator_marks(first_record, size):
        raw = segment.read(size + 1)
        if len(raw) == size and raw[_CREATOR.size :] == record and segment.unused() and segment.unlink():
            return int(_PID.unpack(raw[: _PID.size])[0])
    return None
