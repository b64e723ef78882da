"""A claim on a file that the kernel arbitrates and drops at the claimer's death: one driver at a time.

The claim is an open-file-description write lock (``F_OFD_SETLK``) on one byte: it belongs to the
descriptor, not the process, so two claims in one process conflict too, and closing another
descriptor of the file does not drop it. Linux keeps ``fcntl`` locks apart from the ``flock`` every
opener of a segment holds (:mod:`.shm`), so a claim never stands in a sweeper's way. An OFD lock
reports no owner (``F_OFD_GETLK`` gives pid -1), so the claimer also takes a process-owned (POSIX)
lock on the next byte: ``F_GETLK`` on it gives the claimer's pid as this PID namespace sees it, 0
where the claimer runs outside it. The claimer takes that pid lock *first*, so no loser ever finds
the claim taken and its pid not yet told; a loser that finds the pid lock held is refused at once
(the holder is claiming or holds the claim). A POSIX lock is dropped when its process closes any
descriptor of the file, or when the same process fails a second claim, so a pid lock found free
decides nothing: the claim alone does.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

_FLOCK = "hhqqi4x"  # struct flock: l_type, l_whence, l_start, l_len, l_pid (Linux, 64-bit)


def try_claim(fd: int, byte: int = 0) -> bool:
    """Claim ``byte`` of the file open at ``fd``: True when this descriptor now holds it, False when
    another open file holds it (the claim lasts until ``fd`` is closed or :func:`release`)."""
    if not _lock(fd, fcntl.F_SETLK, fcntl.F_WRLCK, byte + 1):  # the claimer's pid, told before it claims
        return False
    if not _lock(fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, byte):
        _lock(fd, fcntl.F_SETLK, fcntl.F_UNLCK, byte + 1)
        return False
    return True


def release(fd: int, byte: int = 0) -> None:
    """Drop the claim on ``byte`` (closing ``fd`` drops it too)."""
    _lock(fd, fcntl.F_SETLK, fcntl.F_UNLCK, byte + 1)
    _lock(fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, byte)


def claimer(fd: int, byte: int = 0) -> str:
    """Who holds the claim on ``byte``, for messages: its pid in this PID namespace where the kernel tells it."""
    found = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, byte + 1, 1, 0))
    kind, _, _, _, pid = struct.unpack(_FLOCK, found)
    if kind == fcntl.F_UNLCK:
        return (
            "a process whose pid the kernel cannot tell (this process itself, or one that closed another "
            "descriptor of the file)"
        )
    if pid == 0:
        return "a process outside this PID namespace (the kernel gives its pid as 0 here)"
    return f"pid {pid} (as this PID namespace sees it)"


def _lock(fd: int, command: int, kind: int, byte: int) -> bool:
    try:
        fcntl.fcntl(fd, command, struct.pack(_FLOCK, kind, os.SEEK_SET, byte, 1, 0))
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True
