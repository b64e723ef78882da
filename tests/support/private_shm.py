"""A ``/dev/shm`` of this test process's own: a private mount namespace with a fresh tmpfs on ``/dev/shm``.

FastDeploy's names have no instance part (``key_caches_0_rank0.device0``, its signal arrays), so two test
processes that publish them at once (two xdist workers, two runs on one host, a FastDeploy engine beside the
suite) would read, reuse and remove each other's. Entered once, early, by each pytest process (each xdist
worker): every process the tests start inherits the namespace, and the tmpfs goes when the last of them ends.
Linux only, and only as root (CAP_SYS_ADMIN); elsewhere :func:`enter` says why it could not.

The namespace belongs to the thread that enters it (Linux namespaces are per task) and to everything it starts
afterwards: threads and processes. pytest runs its tests in that thread (the main thread, xdist's workers too).
"""

from __future__ import annotations

import ctypes
import os
import sys

SHM = "/dev/shm"
CLONE_NEWNS = 0x00020000  # <sched.h>
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000  # <sys/mount.h>


def enter() -> str | None:
    """Move this thread into a new mount namespace with an empty tmpfs on ``/dev/shm``.

    Returns None when done, else why not (not Linux, not root, or the kernel refused; nothing changed then).
    """
    if not sys.platform.startswith("linux"):
        return f"private mount namespaces are Linux's ({sys.platform} here)"
    if not os.path.isdir(SHM):
        return f"there is no {SHM} here"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    if libc.unshare(CLONE_NEWNS) != 0:
        return f"unshare(CLONE_NEWNS) was refused: {os.strerror(ctypes.get_errno())} (it needs root, CAP_SYS_ADMIN)"
    # Mounts are copied from the host, shared ones still shared: made private first, the tmpfs below
    # stays in here instead of appearing on the host's /dev/shm.
    steps = (
        (None, b"/", None, MS_REC | MS_PRIVATE, None),
        (b"tmpfs", SHM.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=1777"),
    )
    for source, target, kind, flags, data in steps:
        if libc.mount(source, target, kind, flags, data) != 0:
            error = os.strerror(ctypes.get_errno())
            # the new namespace is still this host's mounts; the empty tmpfs was not mounted
            return f"mount({target.decode()}) in a new mount namespace was refused: {error}"
    return None
