"""int32 words in a ``/dev/shm`` segment, read and written so that a truncation cannot SIGBUS us.

The base of both signal kinds (ours, :mod:`.cache_signal`; FastDeploy's, :mod:`fd_platforms.fastdeploy.signals`).
No word is read or written through the mapping: ``pread``/``pwrite`` on the descriptor, a short read
being the typed :class:`~fd_platforms.contract.errors.CacheSignalError` naming the truncation. The
mapping only gives a futex its address, where the kernel answers ``EFAULT`` instead of raising
SIGBUS. The creator (``owner``) unlinks the segment on close, at exit or when the object is
collected; a forked child of it never does, nor does an attacher.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..contract.errors import CacheSignalError
from ..contract.integers import check_int
from . import futex, shm

if TYPE_CHECKING:  # typing.Self is Python 3.11's
    from typing_extensions import Self

WORD_BYTES = 4
MAX_LOCAL_RANKS = 1024  # the most words a signal holds, one per local rank
CHECK_SECONDS = 0.25  #: how often a wait looks at the watched process and the clock
POLL_SECONDS = 0.002  # the sleep between looks where futexes are unavailable


class SharedWords:
    """A segment's int32 words. ``what`` names the kind in messages (``"cache-ready signal"``)."""

    what = "shared-memory signal"

    def __init__(self, segment: shm.Segment, name: str, *, owner: bool) -> None:
        self._segment = segment
        anchor = ctypes.c_char.from_buffer(segment.map())  # the futex's address only: no word is read through it
        self._base_address = ctypes.addressof(anchor)
        del anchor  # keep no buffer export alive, so the segment can be closed
        self.name, self.owner = name, owner
        # Runs on close(), on garbage collection or at interpreter exit, whichever comes first.
        self._release = weakref.finalize(self, segment.release, os.getpid() if owner else None)

    def needed_bytes(self) -> int:
        """The bytes this object reads and writes (a segment shrunk below it is truncated)."""
        return self._segment.size

    def close(self) -> None:
        """Unmap the segment; the owner also unlinks it. Idempotent. Do not close while waiting."""
        self._release()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return not self._release.alive

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _fd(self) -> int:
        if self.closed:
            raise CacheSignalError(f"{self.what} {self.name!r} is closed. Fix: attach to it again")
        return self._segment.fd

    def _read(self, word: int, count: int) -> tuple[int, ...]:
        """``count`` words from ``word`` on, read from the descriptor."""
        raw = os.pread(self._fd(), count * WORD_BYTES, word * WORD_BYTES)
        if len(raw) < count * WORD_BYTES:
            raise self._truncated()
        return struct.unpack(f"={count}i", raw)

    def _write(self, word: int, *values: int) -> None:
        os.pwrite(self._fd(), struct.pack(f"={len(values)}i", *values), word * WORD_BYTES)

    def _futex(self, call: Callable[..., object], *args: object) -> None:
        """A futex call on a word's address; EFAULT (the segment truncated under the mapping) is typed."""
        try:
            call(*args)
        except OSError as exc:
            if exc.errno != errno.EFAULT:
                raise
            raise self._truncated() from None

    def _truncated(self) -> CacheSignalError:
        size = os.fstat(self._fd()).st_size
        return CacheSignalError(
            f"{self.what} {self.name!r} was truncated to {size} bytes while in use (it needs {self.needed_bytes()}): "
            f"another process shrank /dev/shm/{self.name}. Fix: find what writes to /dev/shm beside the engine; "
            "restart the engine"
        )

    def _word_address(self, word: int) -> int:
        self._fd()
        return self._base_address + word * WORD_BYTES

    def _wake(self, word: int) -> None:
        """Wake every process sleeping on ``word`` (after writing it)."""
        if futex.AVAILABLE:
            self._futex(futex.wake, self._word_address(word))

    def _sleep(self, word: int, seen: int, seconds: float, *, foreign: bool, since: float | None = None) -> None:
        """Sleep up to ``seconds`` while ``word`` is ``seen``; woken at once by a futex wake, and with
        ``foreign`` also within :data:`~fd_platforms.ipc.futex.FOREIGN_POLL_SECONDS` of a plain store
        (looking as often as :func:`~fd_platforms.ipc.futex.sleep_while` does for a wait begun at
        ``since``). Without futexes: a :data:`POLL_SECONDS` sleep."""
        if not futex.AVAILABLE:
            time.sleep(min(max(seconds, 0.0), POLL_SECONDS))
        elif foreign:
            self._futex(futex.sleep_while, self._word_address(word), seen, seconds, since)
        else:
            self._futex(futex.wait, self._word_address(word), seen, seconds)


def check_tp(tp: object) -> int | None:
    """``tp`` as an engine call takes it: None, or the number of local ranks (a ConfigError naming ``tp``)."""
    if tp is None:
        return None
    return check_int(
        "tp",
        tp,
        1,
        MAX_LOCAL_RANKS,
        what="None or the number of local ranks",
        fix="pass the tensor-parallel size (FastDeploy's parallel_config.tensor_parallel_size)",
    )
