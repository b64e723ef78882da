"""FastDeploy's own signals: bare int32 arrays in POSIX shared memory, read and written as its processes do.

FastDeploy's engine, workers and cache transfer manager meet through ``IPCSignal``: a segment named
``<name>.<suffix>`` (the suffix is the engine's ``engine_worker_queue_port``) holding a numpy array
and nothing else — no header, no lock, no wake. This module speaks that format so that our runner or
cache manager can sit next to FastDeploy's *unmodified* processes:

====================================== ======== ==================================================
name                                   shape    meaning
====================================== ======== ==================================================
``cache_ready_signal``                 [tp]     1: rank's KV cache created; the attacher resets it to 0
``swap_space_ready_signal``            [tp]     1: rank's host swap cache allocated
``cache_transfer_inited_signal``       [tp]     1: rank's cache transfer manager is up
``kv_cache_status``                    [1]      :class:`KVCacheStatus` of the clear/update protocol
``model_weights_status``               [1]      the weights' status, the same four values: the RL flow's
                                                two events (:mod:`fd_platforms.fastdeploy.weights_status`)
``get_profile_block_num``              [1]      the agreed block count (local rank 0 writes it); one
                                                word per rank on Iluvatar, and a suffix of its own
                                                (:mod:`fd_platforms.fastdeploy.block_handoff`)
====================================== ======== ==================================================

Reading and writing: every word goes through ``pread``/``pwrite`` on the descriptor, so a segment
another process truncates cannot SIGBUS us; its size is checked before it is mapped (the mapping
only gives the futex its address). Our writes also wake futex waiters, so our own waiters see our
writes at once; FastDeploy's writes wake nobody, so a wait also looks at the word on a short,
growing interval (:func:`fd_platforms.ipc.futex.sleep_while`), seeing such a store within
:data:`~fd_platforms.ipc.futex.FOREIGN_POLL_SECONDS`.

Lifetimes: FastDeploy's engine creates these segments and removes them at exit; where our process
plays the engine (:meth:`FastDeploySignal.create`) it unlinks what it created on close or exit. A
name that already exists is never removed here: FastDeploy's processes hold no lock, so nothing
proves such a segment dead (the error names the file to remove by hand).
"""

from __future__ import annotations

import enum
import logging
import os
import stat
import struct
import time
from collections.abc import Callable
from functools import partial

from ..contract.errors import CacheSignalError, ConfigError, SignalWaitError
from ..contract.integers import check_int, is_int
from ..ipc import claims, shm
from ..ipc.process_watch import ProcessWatch
from ..ipc.shared_words import CHECK_SECONDS, MAX_LOCAL_RANKS, WORD_BYTES, SharedWords, check_tp
from ..ipc.waiting import WaitProgress
from .fault_words import KVCacheFault
from .values import SUFFIX

CACHE_READY = "cache_ready_signal"
SWAP_SPACE_READY = "swap_space_ready_signal"
CACHE_TRANSFER_INITED = "cache_transfer_inited_signal"
KV_CACHE_STATUS = "kv_cache_status"
MODEL_WEIGHTS_STATUS = "model_weights_status"
PROFILE_BLOCK_NUM = "get_profile_block_num"

LET_GO_HOLD_SECONDS = 0.2
"""How long a ``cache_ready_signal`` slot must read 0 (its let-go value) before a wait for that 0 ends: a
slot flickering through 0 while its attacher still maps the cache frees nothing. A real let-go stays 0
until the creator sets the slot again, and FastDeploy's own processes look every 0.1 s."""
HOLD_LOOK_SECONDS = 0.005  #: how often a held value is looked at while it must hold

logger = logging.getLogger(__name__)


class KVCacheStatus(enum.IntEnum):
    """The values of ``kv_cache_status`` (FastDeploy's ``KVCacheStatus``), and of ``model_weights_status``
    (its ``ModelWeightsStatus`` has the same four, ``fastdeploy/inter_communicator/ipc_signal_const.py``)."""

    NORMAL = 0
    UPDATING = 1
    CLEARING = -1
    CLEARED = -2


FIXED_LENGTH = {KV_CACHE_STATUS: 1, MODEL_WEIGHTS_STATUS: 1}  # words whatever the tp (np.zeros([1], dtype=np.int32))
PER_RANK = (CACHE_READY, SWAP_SPACE_READY, CACHE_TRANSFER_INITED)  # one word per local rank: np.zeros([tp])
#: The values FastDeploy writes in each signal's words (``KVCacheStatus`` in
#: ``fastdeploy/inter_communicator/ipc_signal_const.py``, ModelWeightsStatus the same; the per-rank arrays are flags):
#: a word outside them is refused and logged, never acted on.
ALLOWED: dict[str, tuple[int, ...]] = dict.fromkeys(PER_RANK, (0, 1)) | dict.fromkeys(
    FIXED_LENGTH, tuple(map(int, KVCacheStatus))
)


class FastDeploySuffix(str):
    """FastDeploy's signal suffix with the engine's tensor-parallel size where known (``tp``, else None): every
    per-rank signal attached under it must then be exactly FastDeploy's int32 array of ``tp`` words
    (:meth:`FastDeploySignal.attach`), however deep in the engine the attach is."""

    tp: int | None

    @classmethod
    def of(cls, suffix: object, *, tp: int | None = None, field: str = "suffix") -> FastDeploySuffix:
        """``suffix`` checked (:func:`check_suffix`, a ConfigError naming ``field``), with ``tp`` (checked)."""
        made = cls(check_suffix(suffix, field))
        made.tp = check_tp(tp)  # None stays None
        return made


def check_suffix(suffix: object, field: str = "suffix") -> str:
    """``suffix`` as FastDeploy names its signals with it (the engine's port), else a ConfigError naming ``field``."""
    if is_int(suffix):
        suffix = str(suffix)
    if not isinstance(suffix, str) or not SUFFIX.fullmatch(suffix):
        raise ConfigError(
            field,
            suffix,
            "letters, digits, '_' and '-', at most 64 (FastDeploy uses the engine's engine_worker_queue_port)",
            "pass the suffix the FastDeploy engine gives its signals, e.g. 9923",
        )
    return suffix


def segment_name(name: str, suffix: str | int) -> str:
    """FastDeploy's segment name: ``<name>.<suffix>``."""
    return f"{name}.{check_suffix(suffix)}"


class FastDeploySignal(SharedWords):
    """One of FastDeploy's int32 signal arrays. Build it with :meth:`create` or :meth:`attach`."""

    what = "FastDeploy signal"

    def __init__(self, segment: shm.Segment, name: str, length: int, *, owner: bool) -> None:
        super().__init__(segment, name, owner=owner)
        self.length = length
        self.kind = name.rsplit(".", 1)[0]  # FastDeploy's name without the suffix
        self.allowed = ALLOWED.get(self.kind)  # None: any int32 (the block count)
        self._refused: dict[int, int] = {}  # the last refused value logged per word (logged once per change)

    def needed_bytes(self) -> int:
        return self.length * WORD_BYTES

    @classmethod
    def create(cls, name: str, suffix: str | int, length: int, initial: int = 0) -> FastDeploySignal:
        """Create ``<name>.<suffix>`` with ``length`` words set to ``initial``, as FastDeploy's engine does."""
        full = segment_name(name, suffix)
        _check_length(length)
        try:
            segment = shm.Segment.create(full, length * WORD_BYTES, struct.pack(f"={length}i", *[initial] * length))
        except FileExistsError:
            raise CacheSignalError(
                f"FastDeploy signal {full!r} already exists (/dev/shm/{full}): another engine with this suffix may be "
                f"using it, and FastDeploy's processes hold no lock that would prove it dead. Fix: use another suffix, "
                f"or remove /dev/shm/{full} if no engine with suffix {suffix} is running"
            ) from None
        except OSError as exc:
            raise CacheSignalError(f"FastDeploy signal {full!r} cannot be created in /dev/shm: {exc}") from None
        return cls(segment, full, length, owner=True)

    @classmethod
    def attach(cls, name: str, suffix: str | int, length: int | None = None) -> FastDeploySignal:
        """Attach to ``<name>.<suffix>``; its length is its size in words unless ``length`` is given
        (the local ranks, tp, where the caller knows them; ``kv_cache_status`` always has one word): then
        the file must be exactly the int32 array FastDeploy makes for it (``_check_shape()``)."""
        full = segment_name(name, suffix)
        if length is None and name in PER_RANK:
            length = getattr(suffix, "tp", None)  # the tp a FastDeploySuffix carries
        length = FIXED_LENGTH.get(name, length)
        if length is not None:
            _check_length(length)
        try:
            segment = shm.Segment.open(full, WORD_BYTES)
        except FileNotFoundError:
            raise CacheSignalError(
                f"FastDeploy signal {full!r} does not exist (no /dev/shm/{full}). Fix: start the FastDeploy engine "
                f"(it creates its signals) first, and pass the suffix it uses (its engine_worker_queue_port)"
            ) from None
        except shm.SegmentUnusable as exc:
            raise CacheSignalError(f"FastDeploy signal {full!r} cannot be used: {exc}") from None
        try:
            _check_private(full, segment)
            words = _check_shape(full, segment.size, length, per_rank=name not in FIXED_LENGTH)
        except CacheSignalError:
            segment.close()
            raise
        return cls(segment, full, words, owner=False)

    # -- words ---------------------------------------------------------------------------------

    def values(self) -> tuple[int, ...]:
        """Every word, index 0 first."""
        return self._read(0, self.length)

    def get(self, index: int) -> int:
        """Word ``index``."""
        return self._read(self._check_index(index), 1)[0]

    def checked(self, index: int) -> int | None:
        """Word ``index`` if it holds one of FastDeploy's values for this signal
        (:data:`~fd_platforms.fastdeploy.signals.ALLOWED`), else None, with a WARNING naming the signal, the value and
        the allowed set (once per new value)."""
        value = self.get(index)
        return value if self.allows(index, value) else None

    def allows(self, index: int, value: int) -> bool:
        """Whether ``value`` read from word ``index`` is one FastDeploy writes there (or, in ``kv_cache_status``, a
        failure word of ours: :mod:`.fault_words`); a WARNING when not."""
        ours = self.kind == KV_CACHE_STATUS and KVCacheFault.read(value) is not None
        if self.allowed is None or value in self.allowed or ours:
            self._refused.pop(index, None)
            return True
        if self._refused.get(index) != value:
            self._refused[index] = value
            logger.warning(
                "FastDeploy signal %r (/dev/shm/%s) word %d holds %d, not one of FastDeploy's values %s: refused, "
                "not acted on. Fix: find the process that writes it (only FastDeploy's engine, workers and cache "
                "managers, or fd-platforms beside them, may)",
                self.name,
                self.name,
                index,
                value,
                ", ".join(map(str, self.allowed)),
            )
        return False

    def let_go(self, index: int) -> bool:
        """Whether word ``index`` says its attacher let go: a 0 (one of FastDeploy's values, :meth:`checked`)
        that holds in ``cache_ready_signal`` (:data:`~fd_platforms.fastdeploy.signals.LET_GO_HOLD_SECONDS`), as every
        wait for it counts it."""
        return self.checked(index) == 0 and self._held(index, 0)

    def holds(self, index: int, value: int, seconds: float) -> bool:
        """Whether word ``index`` reads ``value`` at every look for ``seconds`` (looks every
        :data:`~fd_platforms.fastdeploy.signals.HOLD_LOOK_SECONDS`): a value a process only flickers through does not
        hold."""
        end = time.monotonic() + seconds
        while self.get(index) == value:
            now = time.monotonic()
            if now >= end:
                return True
            time.sleep(min(HOLD_LOOK_SECONDS, end - now))
        return False

    def claim(self) -> str | None:
        """Claim this signal for one driver, held until it is closed (:mod:`.claims`, which the kernel
        arbitrates): None once claimed, else who holds the claim, for the message."""
        fd = self._fd()
        return None if claims.try_claim(fd) else claims.claimer(fd)

    def set(self, index: int, value: int) -> None:
        """Write word ``index`` and wake whoever waits on it."""
        self._write(self._check_index(index), value)
        self._wake(index)

    def write_all(self, value: int) -> None:
        """Write every word (the way FastDeploy's engine fills a new signal) and wake every waiter."""
        self._write(0, *([value] * self.length))
        for index in range(self.length):
            self._wake(index)

    def wait_for(
        self,
        index: int,
        value: int,
        timeout: float,
        *,
        watch_pid: int | None = None,
        what: str = "",
        writer: str = "",
        tend: Callable[[], object] | None = None,
    ) -> float:
        """Block until word ``index`` equals ``value``; the seconds waited. A ``cache_ready_signal``
        slot's 0 (the let-go) must hold for :data:`~fd_platforms.fastdeploy.signals.LET_GO_HOLD_SECONDS`; a value
        outside FastDeploy's set is logged (:meth:`checked`).

        A :class:`~fd_platforms.contract.errors.SignalWaitError` after ``timeout`` seconds (``math.inf``: never), or
        within about :data:`~fd_platforms.ipc.shared_words.CHECK_SECONDS` of ``watch_pid`` exiting (the process
        expected to write it). ``what`` names the step in it. Every :data:`~.waiting.PROGRESS_SECONDS` it logs what
        it waits for (:mod:`.waiting`), ``writer`` saying who writes the word. ``tend`` is called before every look
        (at least every :data:`~fd_platforms.ipc.shared_words.CHECK_SECONDS`), e.g. to keep another word as the
        caller set it.
        """
        self._check_index(index)
        watch = ProcessWatch(watch_pid) if watch_pid is not None else None
        start = time.monotonic()
        progress = WaitProgress(timeout, start)
        try:
            while True:
                if tend is not None:
                    tend()
                seen = self.get(index)
                if seen == value and self._held(index, value):
                    return time.monotonic() - start
                self.allows(index, seen)
                self._check_same_file(index, value, seen, what)
                now = time.monotonic()
                exited = watch is not None and watch.exited() and self.get(index) != value
                if exited or now - start >= timeout:
                    kind, why = "timeout", f"the limit is {timeout:g} s"
                    if exited:
                        kind, why = "watched_exited", f"the process expected to write it (pid {watch_pid}) exited"
                    raise SignalWaitError(self.name, index, value, seen, now - start, kind, what, why)
                progress.say(now, partial(self._waiting_for, index, value, seen, what, writer, watch))
                self.sleep_while(
                    index, seen, min(CHECK_SECONDS, start + timeout - now, progress.until_next(now)), since=start
                )
        finally:
            if watch is not None:
                watch.close()

    def _held(self, index: int, value: int) -> bool:
        """Whether ``value``, just read from word ``index``, counts: a let-go 0 in ``cache_ready_signal`` must hold."""
        return value != 0 or self.kind != CACHE_READY or self.holds(index, 0, LET_GO_HOLD_SECONDS)

    def _check_same_file(self, index: int, value: int, seen: int, what: str) -> None:
        """A CacheSignalError when the name no longer names the file this object reads (removed, or
        removed and created again: a new inode), with what the name holds now; a wait would otherwise
        read the old file until its timeout."""
        try:
            info = os.lstat(shm.shm_path(self.name))
        except FileNotFoundError:
            now = "was removed"
        else:
            if (info.st_dev, info.st_ino) == self._segment.inode:
                return
            now = f"was replaced by another file ({_word_now(self.name, index)})"
        step = f"{what}: " if what else ""
        raise CacheSignalError(
            f"{step}FastDeploy signal {self.name!r} (/dev/shm/{self.name}) {now} while this process waited for word "
            f"{index} to be {value} (the file it had opened says {seen}). Fix: a process removed the signal and may "
            "have created it again (an engine restarted under this suffix?); start this process again once the "
            "engine that owns the suffix is up"
        )

    def _waiting_for(
        self, index: int, value: int, seen: int, what: str, writer: str, watch: ProcessWatch | None
    ) -> str:
        """What a wait for word ``index`` says it waits for (:mod:`.waiting`)."""
        who = writer or "the process doing that step"
        who += (
            f" (pid {watch.pid}, watched: its exit ends the wait)"
            if watch is not None
            else " (no pid named, so its exit goes unnoticed)"
        )
        return (
            f"{what or 'waiting'}: FastDeploy signal {self.name!r} word {index} is {seen}, waiting for {value}; "
            f"written by {who}"
        )

    def sleep_while(self, index: int, seen: int, seconds: float, *, since: float | None = None) -> None:
        """Sleep up to ``seconds`` while word ``index`` is ``seen``: woken by our writes at once, a
        foreign store seen within :data:`~fd_platforms.ipc.futex.FOREIGN_POLL_SECONDS`. A caller
        sleeping in slices passes ``since``, when it began waiting on ``seen`` (``time.monotonic()``),
        so that the looks stay as sparse as the wait's length allows instead of starting over."""
        self._sleep(self._check_index(index), seen, seconds, foreign=True, since=since)

    # -- names and checks -----------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"FastDeploySignal({self.name!r}, length={self.length}, {'owner' if self.owner else 'attached'})"

    def _check_index(self, index: int) -> int:
        return check_int(
            "index",
            index,
            0,
            self.length - 1,
            what="an index",
            fix=f"signal {self.name!r} has {self.length} words (one per local rank)",
        )


def _check_shape(full: str, size: int, length: int | None, *, per_rank: bool) -> int:
    """The words of signal file ``full`` of ``size`` bytes: with ``length`` known, exactly the int32 array
    FastDeploy makes (``IPCSignal(array=np.zeros([tp], dtype=np.int32))``, ``fastdeploy/inter_communicator/
    ipc_signal.py``, created in ``fastdeploy/engine/common_engine.py`` ``EngineService._init_worker_signals``),
    else any int32 array of 1 to :data:`MAX_LOCAL_RANKS` words; a CacheSignalError naming the sizes otherwise.
    ``per_rank``: the array has one word per local rank."""
    if length is not None and size != length * WORD_BYTES:
        tp = f" for tp {length}, one word per local rank" if per_rank else ""
        raise CacheSignalError(
            f"FastDeploy signal {full!r} (/dev/shm/{full}) holds {size} bytes, but FastDeploy makes it an int32 array "
            f"of {length} word{'s' if length > 1 else ''} ({length * WORD_BYTES} bytes{tp}): it is "
            f"another array (an int64 one, or one for another tp) that int32 words would misread. Fix: check the "
            f"signal's suffix and the tensor-parallel size; remove /dev/shm/{full} if no engine uses it"
        )
    words = size // WORD_BYTES
    if not 1 <= words <= MAX_LOCAL_RANKS or size % WORD_BYTES:
        raise CacheSignalError(
            f"FastDeploy signal {full!r} holds {size} bytes, not an int32 array of 1 to "
            f"{MAX_LOCAL_RANKS} words. Fix: check the signal name and suffix"
        )
    return words


def _check_private(full: str, segment: shm.Segment) -> None:
    """A signal others may write proves nothing (their write to a slot would make a creator free its cache): one
    writable by its group or by anyone is refused, as records are (the owner is checked on open)."""
    mode = os.fstat(segment.fd).st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheSignalError(
            f"FastDeploy signal {full!r} (/dev/shm/{full}) has mode {stat.S_IMODE(mode):04o}: users other than its "
            "owner may write its words, so none can be trusted. Fix: start the FastDeploy engine with umask 022 (its "
            f"IPCSignal creates signals 0600); remove /dev/shm/{full} if no engine uses it"
        )


def _word_now(name: str, index: int) -> str:
    """What word ``index`` of the file now named ``name`` holds, for messages (never raises)."""
    try:
        segment = shm.Segment.inspect(name)
    except (OSError, shm.SegmentUnusable) as exc:
        return f"which cannot be read: {exc}"
    with segment:
        raw = segment.read(WORD_BYTES, index * WORD_BYTES)
    if len(raw) < WORD_BYTES:
        return f"of {segment.size} bytes, without word {index}"
    return f"its word {index} is now {struct.unpack('=i', raw)[0]}"


def _check_length(length: object) -> None:
    check_int("length", length, 1, MAX_LOCAL_RANKS, fix="pass the number of local ranks (tp)")
