"""Whether a given process is still running, robust to pid reuse where Linux pidfds exist; how one ended."""

from __future__ import annotations

import os
import select
import signal

from ..contract.integers import check_int, decimal

START_TICKS_MASK = 0x7FFFFFFF  #: start times are compared on their low 31 bits (they fit an int32 word)
PID_MAX_LIMIT = 2**22  #: the largest pid_max the kernel allows (PID_MAX_LIMIT, include/linux/threads.h)


def pid_max() -> int:
    """The largest process id the kernel gives (``/proc/sys/kernel/pid_max``; :data:`PID_MAX_LIMIT` unread)."""
    try:
        with open("/proc/sys/kernel/pid_max") as limit:
            return int(limit.read())
    except (OSError, ValueError):
        return PID_MAX_LIMIT


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3 onwards of ``/proc/<pid>/stat`` (state first), or ``None`` when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            stat = handle.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; fields after its last ')' are plain.
    return stat[stat.rfind(")") + 2 :].split()


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks after boot (``/proc/<pid>/stat``), or ``None``."""
    fields = _stat_fields(pid)
    return decimal(fields[19]) if fields and len(fields) > 19 else None


def parent_pid(pid: int) -> int | None:
    """The process's parent (``/proc/<pid>/stat``), or ``None`` when unreadable."""
    fields = _stat_fields(pid)
    return decimal(fields[1]) if fields and len(fields) > 1 else None


def process_uid(pid: int) -> int | None:
    """The effective uid the process runs as (``/proc/<pid>/status``; its ``/proc`` directory's owner is root
    for a process that changed uid), or ``None`` when unreadable."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("Uid:"):
                    fields = line.split()
                    return decimal(fields[2]) if len(fields) > 2 else None
    except OSError:
        return None
    return None


def pid_running(pid: int, start_ticks: int | None = None) -> bool:
    """True while ``pid`` exists, is not a zombie, and (if given) started at ``start_ticks``.

    Start times are compared under :data:`START_TICKS_MASK`; an unreadable start time counts
    as a match.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    fields = _stat_fields(pid)
    if fields and fields[0] in ("Z", "X"):
        return False
    if start_ticks is None:
        return True
    current = process_start_ticks(pid)
    return current is None or current & START_TICKS_MASK == start_ticks & START_TICKS_MASK


class ProcessWatch:
    """Watches one process; :meth:`exited` is cheap enough to call several times a second.

    With a pidfd (Linux 5.3+) the watch follows the very process it was opened on, so a reused
    pid cannot fool it; elsewhere it falls back to :func:`pid_running` with the start time.
    """

    def __init__(self, pid: int) -> None:
        check_int(
            "creator_pid",
            pid,
            1,
            PID_MAX_LIMIT,
            what="a process id",
            fix="pass the pid of the process that creates the cache (it sets the slot)",
        )
        self.pid = pid
        self._start_ticks = process_start_ticks(pid)
        self._pidfd: int | None = None
        self._poller = select.poll()
        self._gone = False
        try:
            self._pidfd = os.pidfd_open(pid)
            self._poller.register(self._pidfd, select.POLLIN)
        except ProcessLookupError:
            self._gone = True
        except (AttributeError, OSError):
            self._gone = not pid_running(pid)

    def exited(self) -> bool:
        """True once the watched process has exited (zombies count as exited)."""
        if self._gone:
            return True
        if self._pidfd is not None:
            self._gone = bool(self._poller.poll(0))
        else:
            self._gone = not pid_running(self.pid, self._start_ticks)
        return self._gone

    def close(self) -> None:
        """Release the pidfd, if one was opened."""
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def describe_exit(code: int | None) -> str:
    """``exited with code 3`` or ``was killed by SIGKILL``."""
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
