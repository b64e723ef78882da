"""POSIX shared-memory segments in ``/dev/shm``, handled as a container demands.

Real deployments share ``/dev/shm`` between pods, users and PID namespaces, so the rules are:

- **Liveness is a lock the kernel holds.** Every process that uses a segment holds a shared
  ``flock`` on it while it does; the kernel drops the lock when the process exits, however it
  exits (SIGKILL included) and whatever PID namespace it runs in. A segment on which an
  exclusive lock can be taken is used by no living process (:meth:`Segment.unused`). A pid in a
  header means nothing across namespaces and is kept for messages only.
- **Open nothing odd.** An entry is looked at with ``lstat`` before it is opened: only a regular
  file owned by this user is opened, with ``O_NOFOLLOW | O_NONBLOCK``, and the open file must be
  the very inode that was looked at. Directories, symlinks, FIFOs, devices and other users'
  segments are never opened, mapped or deleted.
- **Check sizes before mapping.** A segment is mapped only up to the size ``fstat`` reports, and
  a new one reserves its pages with ``posix_fallocate`` first, so a full ``/dev/shm`` is an error
  at creation (naming the sizes), never a SIGBUS later.
- **Named only once complete.** A new segment gets its name when its size and first bytes are in
  place, so a name never holds a half-made segment, not even one whose creator was killed.
- **Delete only what is proven dead.** :meth:`Segment.unlink` removes the name only while it
  still names the inode this process holds.
- **No resource tracker.** Python's ``multiprocessing.resource_tracker`` keeps a set of names per
  tracker shared by a process tree and unlinks on exit; segments here never enter it.
"""

from __future__ import annotations

import enum
import errno
import fcntl
import logging
import mmap
import os
import stat
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from ..contract.errors import FdPlatformsError

logger = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
LOCK_RETRY_SECONDS = 1.0  # how long an attacher retries a shared lock a sweeper holds for a moment


class SegmentUnusable(FdPlatformsError):
    """An entry in ``/dev/shm`` that this process must not open, map or delete; the reason is the message."""


class ShmSpaceError(FdPlatformsError, MemoryError):
    """``/dev/shm`` cannot hold a new segment; the message names the sizes and the fix."""

    exit_code = 2


def shm_path(name: str) -> str:
    """The file of segment ``name`` (names are validated by their callers: no ``/``)."""
    return os.path.join(SHM_DIR, name)


def describe_entry(info: os.stat_result) -> str:
    """What kind of entry ``info`` is, for messages (``a directory``, ``a FIFO``, ...)."""
    mode = info.st_mode
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((text for test, text in kinds if test(mode)), "not a regular file")


def check_entry(name: str, info: os.stat_result, min_size: int) -> None:
    """Refuse (:class:`SegmentUnusable`) an entry that is not a regular file of ours holding ``min_size`` bytes."""
    if not stat.S_ISREG(info.st_mode):
        raise SegmentUnusable(f"/dev/shm/{name} is {describe_entry(info)}")
    if info.st_uid != os.geteuid():
        raise SegmentUnusable(f"/dev/shm/{name} belongs to uid {info.st_uid}, not this user (uid {os.geteuid()})")
    if info.st_size < min_size:
        raise SegmentUnusable(f"/dev/shm/{name} holds {info.st_size} bytes, fewer than the {min_size} expected")


def flock_holders(inode: tuple[int, int]) -> set[int]:
    """The pids ``/proc/locks`` lists as holding a ``flock`` on ``inode`` (device, inode number), waiters left out.

    The kernel keeps that list, so a pid in it is a process that holds the file open and locked now (pids are
    those of the reader's PID namespace). Empty where ``/proc/locks`` cannot be read."""
    device, number = inode
    wanted = f"{os.major(device):02x}:{os.minor(device):02x}:{number}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            lines = locks.read().splitlines()
    except OSError:
        return set()
    # A row: "1: FLOCK  ADVISORY  READ  1234 00:19:5678 0 EOF"; a waiter has "->" second.
    rows = (line.split() for line in lines)
    return {int(row[4]) for row in rows if len(row) > 5 and row[1] == "FLOCK" and row[5] == wanted and row[4].isdigit()}


def shm_free_bytes() -> int | None:
    """Bytes ``/dev/shm`` can still hold (None where it cannot be asked)."""
    try:
        info = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


@dataclass(eq=False)
class Segment(AbstractContextManager["Segment"]):
    """One open segment: its file descriptor (which carries this process's lock) and its size.

    Build it with :meth:`create` or :meth:`open`; :meth:`map` maps it; :meth:`close` unmaps it,
    closes the descriptor and so drops this process's lock (a ``with`` block on it closes it on leaving).
    Only :meth:`close` closes it: one collected unclosed keeps its descriptor, and its lock, until the process ends.
    """

    name: str
    fd: int
    size: int
    inode: tuple[int, int]
    _map: mmap.mmap | None = field(default=None, repr=False)

    @classmethod
    def create(cls, name: str, size: int, content: bytes = b"") -> Segment:
        """Create ``name`` with ``size`` bytes starting with ``content``, mode 0600, locked (shared) by this process.

        It is named only once complete: made without a name (``O_TMPFILE``), sized, written, then linked, so no
        process ever opens it half made, and a creator killed before the link leaves nothing (the kernel frees a
        file that has no name once its last descriptor closes). Raises ``FileExistsError`` when the name is taken
        and :class:`ShmSpaceError` when ``/dev/shm`` cannot hold ``size`` bytes.
        """
        fd = os.open(SHM_DIR, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # held from its first moment under the name
            _reserve(fd, name, size)
            os.pwrite(fd, content, 0)
            # With src_dir_fd (ignored for an absolute path) Python calls linkat with AT_SYMLINK_FOLLOW, which links
            # the file the /proc entry names (link(2) would link the /proc symlink itself): FileExistsError if taken.
            os.link(f"/proc/self/fd/{fd}", shm_path(name), src_dir_fd=fd, follow_symlinks=True)
            info = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        return cls(name, fd, size, (info.st_dev, info.st_ino))

    @classmethod
    def open(cls, name: str, min_size: int = 0) -> Segment:
        """Open an existing segment of ours holding at least ``min_size`` bytes, locked (shared).

        Raises ``FileNotFoundError`` when it does not exist, or was removed before the lock was had
        (a remover unlinks while it holds the segment, so a lock had on a file still named holds it),
        and :class:`SegmentUnusable` when it is not a regular file of this user's of that size
        (nothing odd is ever opened).
        """
        segment = cls.inspect(name, min_size)
        try:
            deadline = time.monotonic() + LOCK_RETRY_SECONDS
            while not segment._try_lock(fcntl.LOCK_SH):
                if time.monotonic() >= deadline:
                    raise SegmentUnusable(f"/dev/shm/{name} stays locked exclusively by another process")
                time.sleep(0.005)
            if not _names(shm_path(name), segment.inode):
                raise FileNotFoundError(errno.ENOENT, "removed while this process opened it", shm_path(name))
        except BaseException:
            segment.close()
            raise
        return segment

    @classmethod
    def inspect(cls, name: str, min_size: int = 0) -> Segment:
        """Open ``name`` to look at it, taking no lock (see :meth:`open` for the checks)."""
        path = shm_path(name)
        check_entry(name, os.lstat(path), min_size)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise
            raise SegmentUnusable(f"/dev/shm/{name} cannot be opened: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            check_entry(name, info, min_size)  # the entry may have been replaced since lstat
        except BaseException:
            os.close(fd)
            raise
        return cls(name, fd, info.st_size, (info.st_dev, info.st_ino))

    def _try_lock(self, kind: int) -> bool:
        try:
            fcntl.flock(self.fd, kind | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def unused(self) -> bool:
        """Whether no living process holds the segment (this one then holds it exclusively).

        Call it on a segment from :meth:`inspect`: a segment this process holds itself counts
        as used.
        """
        return self._try_lock(fcntl.LOCK_EX)

    def read(self, nbytes: int, offset: int = 0) -> bytes:
        """``nbytes`` from ``offset`` without mapping (short where the segment is shorter)."""
        return os.pread(self.fd, nbytes, offset)

    def map(self) -> mmap.mmap:
        """The whole segment mapped shared, read-write (mapped once, up to its checked size)."""
        if self._map is None:
            self._map = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        return self._map

    def unlink(self) -> bool:
        """Remove the name if it still names this segment's inode; whether it was removed."""
        return _unlink_if_same(shm_path(self.name), self.inode)

    def close(self) -> None:
        """Unmap and close (dropping this process's lock). Idempotent."""
        if self._map is not None:
            self._map.close()
            self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def release(self, owner_pid: int | None) -> None:
        """Close it, unlinking it first where this process is ``owner_pid`` (its creator, not a forked child of it)."""
        if owner_pid == os.getpid():
            self.unlink()
        self.close()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _reserve(fd: int, name: str, size: int) -> None:
    """Give the new segment its size with its pages reserved, or raise ShmSpaceError.

    Where the file system cannot reserve (no ``fallocate``), the size is checked against the free
    space first and set with ``ftruncate``.
    """
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as exc:
        unsupported = exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
        if not unsupported and exc.errno not in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
            raise
        free = shm_free_bytes()
        if unsupported and (free is None or size <= free):
            os.ftruncate(fd, size)
            return
        raise ShmSpaceError(
            f"/dev/shm cannot hold shared memory segment {name} of {size} bytes"
            f"{'' if free is None else f' (it has {free} bytes free)'}. "
            "Fix: give the container more shared memory (docker run --shm-size, a larger memory-backed "
            "emptyDir in Kubernetes) or use less"
        ) from None


def _names(path: str, inode: tuple[int, int]) -> bool:
    """Whether ``path`` names ``inode`` (``(st_dev, st_ino)``) now."""
    try:
        current = os.lstat(path)
    except FileNotFoundError:
        return False
    return (current.st_dev, current.st_ino) == inode


def _unlink_if_same(path: str, inode: tuple[int, int]) -> bool:
    """Unlink ``path`` only while it names ``inode``; whether it did."""
    if not _names(path, inode):
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


class Verdict(enum.Enum):
    """What a reclaim found under one name."""

    RECLAIMED = "reclaimed"  # a dead segment of this user's, now unlinked
    IN_USE = "in use"  # some living process holds it
    GONE = "gone"  # removed or replaced meanwhile
    SKIPPED = "skipped"  # not provably a segment of this user's kind: left alone


#: Says whether an open segment is a complete one of the caller's kind: who made it (``"pid 42"``), or None.
Recognise = Callable[[Segment], "str | None"]


def reclaim(
    name: str, min_size: int, recognise: Recognise, what: str, *, say: Callable[..., None] | None = None
) -> tuple[Verdict, str]:
    """Unlink ``name`` if it is provably a dead ``what`` of this user's: (verdict, detail).

    Never raises for what it finds: anything it cannot open, does not recognise or cannot prove
    unused is left alone, with the reason.
    """
    try:
        segment = Segment.inspect(name, min_size)
    except FileNotFoundError:
        return Verdict.GONE, "its owner removed it meanwhile"
    except SegmentUnusable as exc:
        return Verdict.SKIPPED, str(exc)
    except OSError as exc:
        return Verdict.SKIPPED, f"/dev/shm/{name} cannot be inspected: {exc.strerror or exc}"
    with segment:
        try:
            owner = recognise(segment)
        except Exception as exc:  # noqa: BLE001 - any content at all: what cannot be recognised is left alone
            owner = None
            logger.info("/dev/shm/%s could not be recognised as a %s: %s: %s", name, what, type(exc).__name__, exc)
        if not segment.unused():
            held = f" ({owner} in its PID namespace)" if owner is not None else ""
            return Verdict.IN_USE, f"a living process holds it{held}"
        if owner is None:
            return Verdict.SKIPPED, f"/dev/shm/{name} is not a complete fd-platforms {what}"
        if not segment.unlink():
            return Verdict.GONE, "it was replaced or removed meanwhile"
        (say or logger.warning)("reclaiming %s %r left behind by %s (no living process holds it)", what, name, owner)
        return Verdict.RECLAIMED, ""


def names(prefix: str) -> list[str]:
    """The names in ``/dev/shm`` that start with ``prefix``, sorted (none where it cannot be listed)."""
    try:
        return sorted(entry for entry in os.listdir(SHM_DIR) if entry.startswith(prefix))
    except OSError:
        return []


def sweep(prefix: str, min_size: int, recognise: Recognise, what: str) -> list[str]:
    """Reclaim every ``what`` named ``prefix*`` that no living process holds; the names reclaimed.

    Entries it cannot open or does not recognise are left alone, named in one WARNING line.
    """
    reclaimed, skipped = [], []
    for name in names(prefix):
        verdict, detail = reclaim(name, min_size, recognise, what)
        if verdict == Verdict.RECLAIMED:
            reclaimed.append(name)
        elif verdict == Verdict.SKIPPED:
            skipped.append(detail)
    if skipped:
        logger.warning(
            "left %d entr%s in /dev/shm alone (not a %s this user can prove unused): %s",
            len(skipped),
            "y" if len(skipped) == 1 else "ies",
            what,
            "; ".join(skipped),
        )
    return reclaimed
