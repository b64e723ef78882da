"""Attacher marks: how a creator of ours tells a dead attacher of ours from FastDeploy's own attacher.

Under FastDeploy's protocol an attacher lets go by resetting its rank's ``cache_ready_signal`` slot to 0
(FastDeploy's ``gpu_model_runner.py`` ``clear_cache`` waits for that when ``num_cpu_blocks > 0``). An attacher
that is SIGKILLed never does, and the slot alone cannot say whether anyone is still attached. So each attacher
of ours makes a mark of its own next to the rank's first record, ``<record>.fdp-attacher-<pid>-<hex>`` (8 bytes:
its pid), and holds a shared ``flock`` on it while attached; the kernel drops the lock when the process dies,
however it dies. A mark nobody holds is an attacher of ours that is gone; a rank whose slot is set with no mark
at all is attached by FastDeploy's own process (which holds nothing) or by none. Marks of dead attachers are
this user's and unlocked, so :func:`fd_platforms.ipc.shm.reclaim` may remove them.
"""

from __future__ import annotations

import os
import secrets
import struct

from ..ipc import shm

_PID = struct.Struct("=q")
WHAT = "FastDeploy attacher mark"


def mark_prefix(record: str) -> str:
    """The names of the marks of attachers of the rank whose first record is ``record`` start with this."""
    return f"{record}.fdp-attacher-"


def make_mark(record: str) -> shm.Segment:
    """This attacher's mark next to ``record``, held (shared) until closed; the kernel drops it at death."""
    segment = shm.Segment.create(f"{mark_prefix(record)}{os.getpid()}-{secrets.token_hex(3)}", _PID.size)
    os.pwrite(segment.fd, _PID.pack(os.getpid()), 0)
    return segment


def _recognise(segment: shm.Segment) -> str | None:
    raw = segment.read(_PID.size)
    return f"pid {_PID.unpack(raw)[0]}" if len(raw) == _PID.size and _PID.unpack(raw)[0] > 0 else None


def reclaim_marks(record: str) -> tuple[list[str], list[str]]:
    """Look at every mark next to ``record``: (the attachers of ours still attached, the dead ones whose marks
    were just removed), each as ``pid N``. Marks that are not complete ones of this user's are left alone."""
    living, dead = [], []
    try:
        names = sorted(name for name in os.listdir(shm.SHM_DIR) if name.startswith(mark_prefix(record)))
    except OSError:
        return [], []
    for name in names:
        verdict, _ = shm.reclaim(name, _PID.size, _recognise, WHAT, say=lambda *args: None)
        pid = f"pid {name[len(mark_prefix(record)):].split('-')[0]}"
        if verdict == shm.Verdict.IN_USE:
            living.append(pid)
        elif verdict == shm.Verdict.RECLAIMED:
            dead.append(pid)
    return living, dead
