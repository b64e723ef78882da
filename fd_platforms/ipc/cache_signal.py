"""The cache-ready signal: one int32 slot per local rank in POSIX shared memory.

The engine process creates the signal (it is the *owner*); workers and the cache-manager process attach to it by
name. Whoever allocates a rank's KV cache sets that rank's slot; a worker that does not allocate waits for it with
:meth:`CacheReadySignal.wait`, asleep on a futex the setter wakes. The segment ``/dev/shm/<name>`` (mode 0600) is
native-endian int32 words: magic ``0x46444352`` (``"FDCR"``), layout version ``2``, the number of ranks, the
owner's pid (for messages only), four reserved, then word ``8 + r``, the slot of local rank ``r`` (0 clear,
anything else set). Liveness is a shared ``flock`` every process using it holds (:mod:`fd_platforms.ipc.shm`): the
owner unlinks the segment on close, and one nobody holds is reclaimed by the next owner of its name or by
:func:`reclaim_stale_signals`. Words are read and written with ``pread``/``pwrite``, never through the mapping, so
a truncated segment is a :class:`~fd_platforms.contract.errors.CacheSignalError`, not a SIGBUS.

See docs/lifecycle.md, "The cache-ready signal", for the layout word by word, liveness across containers, the
lifetimes, the wait's bounds and why a futex; docs/performance.md, "The cache-ready wait", for its measurements.
"""

from __future__ import annotations

import os
import re
import secrets
import struct
import time
from collections.abc import Mapping

from ..contract.errors import CacheNotReadyError, CacheSignalError, ConfigError
from ..contract.integers import check_int
from . import shm
from .process_watch import ProcessWatch
from .shared_words import CHECK_SECONDS, MAX_LOCAL_RANKS, WORD_BYTES, SharedWords
from .timeouts import check_seconds, env_seconds, knob
from .waiting import WaitProgress

SIGNAL_PREFIX = "fd_cache_ready."
MAGIC = 0x46444352
LAYOUT_VERSION = 2
HEADER_WORDS = 8
ENV_TIMEOUT = "FD_CACHE_READY_TIMEOUT"
DEFAULT_TIMEOUT = 600.0
HEADER_BYTES = HEADER_WORDS * WORD_BYTES

_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
_WORD_MAGIC, _WORD_VERSION, _WORD_RANKS, _WORD_PID = range(4)


def new_signal_name(instance: str | None = None) -> str:
    """``fd_cache_ready.<instance>``; without ``instance`` a name unique to this process and call.

    Use a stable instance (e.g. the engine's port) when a restarted engine should reclaim the
    segment its crashed predecessor left behind.
    """
    suffix = instance if instance is not None else f"{os.getpid()}-{secrets.token_hex(4)}"
    return check_signal_name(SIGNAL_PREFIX + suffix)


def check_signal_name(name: object, field: str = "signal_name") -> str:
    """``name`` if it is a valid segment name, else a :class:`~fd_platforms.contract.errors.ConfigError` naming
    ``field``."""
    if not isinstance(name, str) or not _NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            field,
            name,
            "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 201 characters",
            "pass a name such as 'fd_cache_ready.engine-8188', or omit it to get a unique one",
        )
    return name


def resolve_timeout(
    timeout: float | None, environ: Mapping[str, str] | None = None, *, default: float = DEFAULT_TIMEOUT
) -> float:
    """The wait limit in seconds: ``timeout``, else ``FD_CACHE_READY_TIMEOUT``, else ``default`` (600; a protocol
    whose peers wait for ever passes ``math.inf``); ``math.inf`` (``FD_CACHE_READY_TIMEOUT=inf``) for none, as
    FastDeploy's own waits have none."""
    if timeout is not None:
        return check_seconds(
            "timeout", timeout, "pass a finite number of seconds > 0, or math.inf for no limit", unbounded=True
        )
    return env_seconds(ENV_TIMEOUT, default, environ, unbounded=True)


class CacheReadySignal(SharedWords):
    """One engine instance's cache-ready slots. Build it with :meth:`create` or :meth:`attach`."""

    what = "cache-ready signal"

    def __init__(self, segment: shm.Segment, name: str, num_ranks: int, *, owner: bool) -> None:
        super().__init__(segment, name, owner=owner)
        self.num_ranks = num_ranks

    # -- building ---------------------------------------------------------------------------

    @classmethod
    def create(cls, num_ranks: int, name: str | None = None) -> CacheReadySignal:
        """Create the segment (this process becomes its owner), all slots clear.

        A segment of the same name that no living process holds is reclaimed with a warning;
        one in use, or one that is not a signal of this user's, is a
        :class:`~fd_platforms.contract.errors.CacheSignalError`.
        """
        check_int("num_ranks", num_ranks, 1, MAX_LOCAL_RANKS, fix="pass the number of local ranks")
        name = check_signal_name(name) if name is not None else new_signal_name()
        size = (HEADER_WORDS + num_ranks) * WORD_BYTES
        header = struct.pack("=4i", MAGIC, LAYOUT_VERSION, num_ranks, os.getpid())  # words _WORD_MAGIC.._WORD_PID
        try:
            segment = _create_segment(name, size, header)
        except FileExistsError:
            _reclaim_or_refuse(name)
            try:
                segment = _create_segment(name, size, header)
            except FileExistsError:
                raise CacheSignalError(
                    f"cache-ready signal {name!r} was created by another process while this one reclaimed it. "
                    "Fix: give each engine instance its own signal name"
                ) from None
        return cls(segment, name, num_ranks, owner=True)

    @classmethod
    def attach(cls, name: str) -> CacheReadySignal:
        """Attach to a signal the engine created; closing an attached signal never unlinks it."""
        check_signal_name(name)
        try:
            segment = shm.Segment.open(name, HEADER_BYTES)
        except FileNotFoundError:
            raise CacheSignalError(
                f"cache-ready signal {name!r} does not exist (no /dev/shm/{name}). "
                "Fix: the engine process creates it before starting workers; check that this name is the one it created"
            ) from None
        except shm.SegmentUnusable as exc:
            raise _not_a_signal(name, str(exc)) from None
        header = _read_header(segment)
        if header is None:
            segment.close()
            raise _not_a_signal(name, f"its header is not a complete fd-platforms signal of layout {LAYOUT_VERSION}")
        return cls(segment, name, header[_WORD_RANKS], owner=False)

    # -- slots --------------------------------------------------------------------------------

    def set(self, rank: int) -> None:
        """Mark ``rank``'s cache ready and wake everyone waiting on it."""
        self._write(HEADER_WORDS + self._check_rank(rank), 1)
        self._wake(HEADER_WORDS + rank)

    def clear(self, rank: int) -> None:
        """Mark ``rank``'s cache not ready."""
        self._write(HEADER_WORDS + self._check_rank(rank), 0)

    def is_set(self, rank: int) -> bool:
        """Whether ``rank``'s slot is set."""
        return self._read(HEADER_WORDS + self._check_rank(rank), 1)[0] != 0

    def slots(self) -> tuple[int, ...]:
        """Every rank's slot value, rank 0 first."""
        return self._read(HEADER_WORDS, self.num_ranks)

    # -- waiting ------------------------------------------------------------------------------

    def wait(
        self,
        rank: int,
        timeout: float | None = None,
        creator_pid: int | None = None,
        *,
        progress_seconds: float | None = None,
    ) -> float:
        """Block until ``rank``'s slot is set; the seconds waited.

        ``timeout`` defaults to ``FD_CACHE_READY_TIMEOUT`` (600 s); ``math.inf`` waits with no limit.
        With ``creator_pid`` (the process that creates the cache and sets the slot), the wait fails within about
        :data:`~fd_platforms.ipc.shared_words.CHECK_SECONDS` of that process exiting. Every ``progress_seconds``
        (default :data:`~.waiting.PROGRESS_SECONDS`) it logs what it waits for (:mod:`.waiting`: INFO, WARNING without a
        limit). Raises :class:`~fd_platforms.contract.errors.CacheNotReadyError`; Ctrl-C interrupts at once.
        """
        self._check_rank(rank)
        limit = resolve_timeout(timeout)
        watch = ProcessWatch(creator_pid) if creator_pid is not None else None
        start = time.monotonic()
        progress = WaitProgress(limit, start, progress_seconds)
        try:
            while not self.is_set(rank):
                now = time.monotonic()
                if watch is not None and watch.exited() and not self.is_set(rank):
                    raise self._not_ready(
                        rank,
                        now - start,
                        "creator_exited",
                        f"the process expected to set it (pid {watch.pid}) exited without setting it",
                        "read that process's log for why it stopped; the KV cache of this rank was never allocated",
                    )
                if now - start >= limit:
                    raise self._not_ready(
                        rank,
                        now - start,
                        "timeout",
                        f"the limit is {limit:g} s",
                        f"check that the cache manager is running and progressing; if allocation legitimately "
                        f"takes longer, raise {knob(ENV_TIMEOUT, argument=timeout is not None)}",
                    )
                progress.say(now, lambda: self._waiting_for(rank, watch))
                seconds = min(CHECK_SECONDS, start + limit - now, progress.until_next(now))
                self._sleep(HEADER_WORDS + rank, 0, seconds, foreign=False)  # our setters wake
            return time.monotonic() - start
        finally:
            if watch is not None:
                watch.close()

    def _waiting_for(self, rank: int, watch: ProcessWatch | None) -> str:
        """What a wait for ``rank``'s slot says it waits for (:mod:`.waiting`)."""
        slots = self.slots()
        ready = [index for index, value in enumerate(slots) if value]
        creator = (
            f"pid {watch.pid}, watched: its exit ends the wait"
            if watch is not None
            else "no creator_pid named, so its exit goes unnoticed"
        )
        return (
            f"rank {rank} waiting for its KV cache: cache-ready signal {self.name!r} slot {rank} is {slots[rank]}, "
            f"set once the process creating the cache has it ({creator}); slots set: {ready or 'none'} of "
            f"{self.num_ranks}"
        )

    def _not_ready(self, rank: int, elapsed: float, cause: str, detail: str, fix: str) -> CacheNotReadyError:
        return CacheNotReadyError(self.name, rank, elapsed, self.slots(), cause, detail, fix)

    # -- names and checks -----------------------------------------------------------------------

    @property
    def instance(self) -> str:
        """The engine instance this signal stands for: its name without ``fd_cache_ready.``."""
        return self.name.removeprefix(SIGNAL_PREFIX)

    def __repr__(self) -> str:
        role = "owner" if self.owner else "attached"
        return f"CacheReadySignal({self.name!r}, num_ranks={self.num_ranks}, {role})"

    def _check_rank(self, rank: int) -> int:
        return check_int(
            "rank",
            rank,
            0,
            self.num_ranks - 1,
            what="a local rank",
            fix=f"signal {self.name!r} has {self.num_ranks} slots",
        )


# -- the segment itself (see fd_platforms.ipc.shm for the rules) -----------------------------------


def _create_segment(name: str, size: int, header: bytes) -> shm.Segment:
    try:
        return shm.Segment.create(name, size, header)
    except FileExistsError:
        raise
    except OSError as exc:
        raise CacheSignalError(
            f"cache-ready signal {name!r} cannot be created in /dev/shm: {exc.strerror or exc}. "
            "Fix: check that /dev/shm exists and is writable (containers: mount a memory-backed /dev/shm)"
        ) from None


def _not_a_signal(name: str, why: str) -> CacheSignalError:
    return CacheSignalError(
        f"shared memory {name!r} is not a usable fd-platforms cache-ready signal (layout {LAYOUT_VERSION}): {why}. "
        "Fix: check the signal name; a segment from another program, user or version cannot be used"
    )


def _read_header(segment: shm.Segment) -> tuple[int, ...] | None:
    """The header words if the segment is a complete signal of this layout (read, not mapped), else ``None``."""
    raw = segment.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        return None
    header = struct.unpack(f"={HEADER_WORDS}i", raw)
    complete = (
        header[_WORD_MAGIC] == MAGIC
        and header[_WORD_VERSION] == LAYOUT_VERSION
        and 1 <= header[_WORD_RANKS] <= MAX_LOCAL_RANKS
        and segment.size >= (HEADER_WORDS + header[_WORD_RANKS]) * WORD_BYTES
    )
    return header if complete else None


def _recognise(segment: shm.Segment) -> str | None:
    """Who made ``segment`` (``pid 42``) if it is a complete signal of this layout, else None."""
    header = _read_header(segment)
    return None if header is None else f"pid {header[_WORD_PID]}"


def _reclaim_or_refuse(name: str) -> None:
    """Make room for a new signal called ``name``: reclaim a dead one, refuse anything else."""
    verdict, detail = shm.reclaim(name, HEADER_BYTES, _recognise, CacheReadySignal.what)
    if verdict == shm.Verdict.IN_USE:
        raise CacheSignalError(
            f"cache-ready signal {name!r} is in use by a running engine: {detail}. "
            "Fix: give this engine instance another name, or stop that engine first"
        )
    if verdict == shm.Verdict.SKIPPED:
        raise CacheSignalError(
            f"shared memory {name!r} exists and cannot be reclaimed: {detail}. "
            f"Fix: choose another name, or remove /dev/shm/{name} if nothing uses it"
        )


def reclaim_stale_signals() -> list[str]:
    """Unlink every cache-ready signal of this user's that no living process holds; the names reclaimed.

    An engine killed with SIGKILL cannot remove its signal, and a fresh engine uses a fresh name,
    so ``fd-platforms run`` sweeps at start. Signals in use (in any PID namespace) are left
    alone; entries it cannot open or does not recognise (other users' segments, directories,
    symlinks, FIFOs, other layouts) are left alone too, named in one WARNING line. It never raises
    for what it finds.
    """
    return shm.sweep(SIGNAL_PREFIX, HEADER_BYTES, _recognise, CacheReadySignal.what)
