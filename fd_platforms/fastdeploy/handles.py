"""One rank's KV cache published the way FastDeploy's ``set_data_ipc`` does: one tiny segment per tensor.

FastDeploy writes each cache tensor's IPC handle into a POSIX shared-memory segment named after the
tensor (``key_caches_{layer}_rank{rank}.device{device}``, ``value_caches_...``, ...), and the other
side opens it with ``share_external_data(name, shape)``, bringing the shape and dtype itself. The
segment is FastDeploy's ``shmStruct`` of the platform's build (:mod:`.records`): a
``size_t`` (``nprocesses``, always 0) and the 64-byte handle, then on XPU the tensor's device
address. A platform whose handle is or holds a raw 64-byte IPC handle — MetaX's and Iluvatar's
``*IpcGetMemHandle`` through the vendor runtime (``ipc64:<base64>``), the handle inside Paddle's
``_share_cuda``/``_share_xpu`` metadata of a tensor at its allocation's start (CUDA, XPU) — has it
written raw, exactly as FastDeploy's ``set_data_ipc`` writes it, and a raw record reads back as such
a handle, which every sharing platform opens; on the 72-byte record any other handle is written as
its text (the cpu platform's ``memfd:<pid>:<fd>``), NUL-padded. A handle that fits neither, or an
XPU record without a raw handle and an address, cannot be written and is refused, naming the
platform (or, for Paddle's metadata, why: VMM memory, or a tensor inside its allocation). A record
of another size than the platform's is refused when read or reused, naming both sizes.

The let-go handshake is FastDeploy's too: an attacher resets its rank's ``cache_ready_signal`` slot
to 0 when it lets go (an attach that failed never writes it: it never got the cache). A creator waits for
that only where FastDeploy's creator does, where an attacher exists: a cache manager's cache (the runner
attaches) and a runner's with host swap space (``num_cpu_blocks > 0``: FastDeploy's transfer manager
attaches; ``gpu_model_runner.py`` ``clear_cache`` waits for the slot only then, since its #7764), never for
its own slot. One slot cannot count two attachers of one rank (P/D with swap: the worker and the
transfer manager), so every attacher of ours also holds a mark and a shared ``flock`` on the rank's first
record while attached, which the kernel drops when it dies (:mod:`.marks`); a creator frees
only once no attacher of ours holds either, and resets the slot for dead attachers of ours only where they
are every attacher the deployment can have. An attacher of ours beside one that may be FastDeploy's leaves the slot
to it (:meth:`FastDeployHandles.let_go`), so the creator frees only once both have let go. The creator holds a
shared ``flock`` on each record while published (:mod:`fd_platforms.ipc.shm`) and a creator mark. FastDeploy's
creators never remove their records, so a record of this name that no process of ours holds is rewritten in place, as
``set_data_ipc`` does, with mode 0600 (replaced where others could write it) — unless the rank's slot says it is
published and no dead creator of ours left it: FastDeploy's publisher may still own it. One held by a living process of
ours is refused.

The names are machine-wide, so a record is trusted only as far as it is proven: read whole until two reads
agree (a rewrite in place can be met half done), this user's and writable by nobody else, its handle naming
a process of this user that holds the record where a creator of ours holds it (``/proc/locks``).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
import weakref
from collections.abc import Callable, Sequence
from contextlib import suppress

from ..contract.errors import CacheInUseError, CacheSharingError, FdPlatformsError, SignalWaitError
from ..engine.publication import POLL_SECONDS, STILL_HELD_FIX, PublishedTensor, hold_outlives_collection
from ..ipc import shm
from ..ipc.process_watch import process_uid
from ..kit.device_facts import raw_ipc_handle
from ..kit.host_sharing import handle_pid
from ..kit.vendor_device import HANDLE_BYTES, handle_bytes, handle_text
from .marks import (
    COUNTED,
    Attachers,
    attacher_prefix,
    creator_attachers,
    look,
    make_attacher_mark,
    make_creator_mark,
    remove_dead,
    remove_every_dead,
    stale_creator,
    sweep_orphan_marks,
    transfer_manager_up,
)
from .records import RecordLayout, record_layout
from .signals import CACHE_READY, FastDeploySignal, check_suffix

logger = logging.getLogger(__name__)

_PRINTABLE = re.compile(rb"[\x21-\x7e]+")
READ_TRIES = 20  #: reads of one record until two agree: a rewrite in place takes microseconds
READ_PAUSE = 0.001  # seconds between reads of a record that changed
MARK_LOOK_SECONDS = 0.1  #: how often a wait for a slot's let-go looks at its attachers' marks (DeathWatch)


def encode_handle(name: str, handle: str, platform: str, address: int | None = None) -> bytes:
    """FastDeploy's record of ``platform`` for ``handle`` (and, on XPU, the tensor's device ``address``);
    a CacheSharingError where FastDeploy could not open it."""
    layout = record_layout(platform)
    ipc = handle_bytes(handle)
    if ipc is None:
        ipc = raw_ipc_handle(name, handle)  # Paddle's IPC metadata (cuda, xpu): the raw handle inside it
    if layout.address_offset is not None:
        if ipc is None:
            raise CacheSharingError(
                f"platform {platform}'s handle for KV cache tensor {name} is not a raw {HANDLE_BYTES}-byte IPC handle, "
                "and FastDeploy's XPU record holds one (its transfer manager opens it with xpu_ipc_open_memhandle). "
                "Fix: use the fd-platforms protocol on this platform (the default)"
            )
        if address is None or not 0 < address < 2**64:
            said = "gave no device address" if address is None else f"gave device address {address}"
            raise CacheSharingError(
                f"platform {platform}'s export of KV cache tensor {name} {said}, and FastDeploy's XPU record carries "
                "the tensor's address (its XPU runner attaches through data_ptr_addr, and crashes on 0). Fix: export "
                "Paddle tensors (their data_ptr() is the address), or use the fd-platforms protocol (the default)"
            )
        return layout.pack(ipc, address)
    if ipc is not None:
        return layout.pack(ipc, None)
    raw = handle.encode("utf-8")
    if len(raw) > HANDLE_BYTES or b"\0" in raw:
        raise CacheSharingError(
            f"platform {platform}'s handle for KV cache tensor {name} is {len(raw)} bytes, but FastDeploy's record "
            f"holds a {HANDLE_BYTES}-byte handle (its set_data_ipc writes a raw IPC handle). Fix: use the "
            "fd-platforms protocol on this platform (the default); the FastDeploy protocol needs a platform whose "
            f"export gives a handle of at most {HANDLE_BYTES} bytes"
        )
    return layout.pack(raw, None)


def read_handle(name: str, platform: str) -> str:
    """The handle in FastDeploy's record ``name`` of ``platform``, read without mapping.

    A record is read whole until two reads agree (at most :data:`READ_TRIES`): FastDeploy's creators rewrite
    a leftover record in place (``set_data_ipc``: ``shm_open(O_CREAT)``, ``ftruncate``, write), so a read can
    meet a record half written or truncated. One that stays short, long, unwritten or torn is a
    CacheSharingError naming the record; a text handle must be the cpu platform's ``memfd:<pid>:<fd>``."""
    layout = record_layout(platform)
    try:
        segment = shm.Segment.inspect(name)
    except FileNotFoundError:
        raise CacheSharingError(
            f"KV cache tensor {name} is not published (no /dev/shm/{name}) although its rank's cache_ready_signal "
            "slot is set. Fix: check that the creator writes its handles under FastDeploy's names for this rank "
            "and device"
        ) from None
    except shm.SegmentUnusable as exc:
        raise CacheSharingError(f"KV cache tensor {name}'s handle record cannot be used: {exc}") from None
    with segment:
        _check_mode(segment)
        raw = _steady_record(segment, layout, platform)
    record = layout.handle(raw)
    handle = record.rstrip(b"\0")
    if not handle:
        raise _torn(name, "holds no handle (its 64 handle bytes are all 0)")
    if not _PRINTABLE.fullmatch(handle):
        return handle_text(record)  # a raw IPC handle, as FastDeploy's set_data_ipc writes it
    text = handle.decode("ascii")
    if handle_pid(text) is None:
        raise _torn(name, f"holds the text handle {text!r}, not a memfd:<pid>:<fd> handle")
    return text


def _check_mode(segment: shm.Segment) -> None:
    """A record others may rewrite proves nothing: one writable by its group or by anyone is refused."""
    info = os.fstat(segment.fd)
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheSharingError(
            f"FastDeploy's record /dev/shm/{segment.name} (owner uid {info.st_uid}) has mode "
            f"{stat.S_IMODE(info.st_mode):04o}: users other than its owner may rewrite its handle, so it cannot be "
            "trusted. Fix: run the creating process with umask 022 (creators of fd-platforms write their records "
            f"0600); remove /dev/shm/{segment.name} if no engine uses it"
        )


def _steady_record(segment: shm.Segment, layout: RecordLayout, platform: str) -> bytes:
    """The record's bytes once two reads in a row agree and are exactly ``layout.size`` long."""
    previous = b""
    for attempt in range(READ_TRIES):
        raw = segment.read(layout.size + 1)  # one byte more: a longer record is seen as such
        if len(raw) == layout.size and raw == previous:
            return raw
        if attempt:
            time.sleep(READ_PAUSE)  # being rewritten, or of another size: give its creator a moment
        previous = raw
    size = os.fstat(segment.fd).st_size
    if size != layout.size:
        raise _wrong_size(segment.name, size, layout, platform)
    raise _torn(segment.name, f"changed on each of {READ_TRIES} reads")


def _torn(name: str, found: str) -> CacheSharingError:
    return CacheSharingError(
        f"FastDeploy's record /dev/shm/{name} {found}, so it holds no handle this process can open: it is being "
        "rewritten, or was written by something other than a creator of this engine. Fix: attach once the creator "
        f"has published its cache (it sets the rank's cache_ready_signal slot after writing); remove /dev/shm/{name} "
        "if no engine uses it"
    )


class FastDeployHandles:
    """A rank's per-tensor records, held by this process (creator) or read and held (attacher).

    The same surface as :class:`~fd_platforms.engine.publication.Publication`: ``tensors``,
    ``creator``, ``creator_pid`` (the process the handles name, where they name one),
    :meth:`retract`, :meth:`let_go` and :meth:`withdraw`. ``attachers``: how many processes attach the rank as
    this process knows its deployment (0: none, so a creator's clear waits for no let-go;
    :func:`~fd_platforms.rules.roles.cache_roles`); ``beside_messager``: the rank's creator is P/D's cache messager,
    which sees neither swap space nor storage backend, so the count is at least one more where the rank's transfer
    manager is up (:meth:`seen`).
    """

    def __init__(
        self,
        suffix: str,
        rank: int,
        tensors: tuple[PublishedTensor, ...],
        segments: list[shm.Segment],
        *,
        creator: bool,
        attachers: int = 0,
        mark: shm.Segment | None = None,
        beside_messager: bool = False,
    ) -> None:
        self.suffix, self.rank, self.tensors, self.creator = suffix, rank, tensors, creator
        self.attachers, self._mark, self.beside_messager = attachers, mark, beside_messager
        self.name = f"{tensors[0].name} and {len(tensors) - 1} more" if tensors else f"rank {rank}'s publication"
        self.creator_pid = _named_pid(tensors)
        self._held = segments
        self._at_exit = (
            weakref.finalize(self, _release, self._held, os.getpid())
            if creator
            else hold_outlives_collection(self, rank, "its mark and its lock on the first record")
        )

    @classmethod
    def create(
        cls,
        suffix: str,
        rank: int,
        tensors: Sequence[PublishedTensor],
        platform: str,
        *,
        attachers: int,
        beside_messager: bool = False,
    ) -> FastDeployHandles:
        """Write every tensor's record in ``platform``'s layout (this process holds them, and a creator mark of
        its own: :mod:`.marks`); on failure none is left. Records another process may still own are
        refused (``_check_not_published()``). Marks of attachers of ours that died before are removed: at the
        next clear they would pass for attachers of this publication gone without letting go."""
        check_suffix(suffix)
        records = [
            (tensor.name, encode_handle(tensor.name, tensor.handle, platform, tensor.address)) for tensor in tensors
        ]
        if records:
            _check_not_published(suffix, rank, records[0][0], len(records), platform)
        held: list[shm.Segment] = []
        try:
            for name, record in records:
                held.append(_record_segment(name, platform, record))
            if records:
                held.append(make_creator_mark(*records[0], COUNTED if beside_messager else attachers))
        except BaseException:
            _release(held, os.getpid())
            raise
        handles = cls(
            suffix, rank, tuple(tensors), held, creator=True, attachers=attachers, beside_messager=beside_messager
        )
        remove_every_dead(suffix, rank)
        sweep_orphan_marks()
        return handles

    @classmethod
    def open(
        cls,
        suffix: str,
        rank: int,
        expected: Sequence[PublishedTensor],
        platform: str,
        *,
        attachers: int = 1,
        beside_messager: bool = False,
    ) -> FastDeployHandles:
        """Read the handle of every tensor of ``expected`` (names, shapes and dtypes are the attacher's own) from
        ``platform``'s records (on XPU the handle, as FastDeploy's transfer manager opens it, not the address),
        and hold the first record (shared) and a mark of its own (:mod:`.marks`, saying ``attachers``)
        until :meth:`let_go`, so the creator waits for this process while it lives. A failed open withdraws at
        once: it never got the cache, so it never writes the slot another attacher may hold."""
        check_suffix(suffix)
        mark = make_attacher_mark(suffix, rank, attachers) if expected else None  # first: a death from here on is seen
        try:
            tensors = tuple(
                PublishedTensor(tensor.name, tensor.shape, tensor.dtype, read_handle(tensor.name, platform))
                for tensor in expected
            )
            _check_one_creator(rank, tensors)
            held = [_hold_record(tensors[0].name, record_layout(platform).size), mark] if mark is not None else []
            return cls(
                suffix,
                rank,
                tensors,
                held,
                creator=False,
                attachers=attachers,
                mark=mark,
                beside_messager=beside_messager,
            )
        except BaseException:
            _remove_mark(mark)
            raise

    #: Its :meth:`let_go` decides the rank's slot itself
    #: (:meth:`KVCache.clear() <fd_platforms.engine.kv_cache.KVCache.clear>` leaves it to the records).
    resets_slot = True

    def let_go(self) -> None:
        """An attacher's let-go, as FastDeploy's: reset the rank's ``cache_ready_signal`` slot to 0 (where this is
        the rank's last attacher that could be: ``_last_to_let_go()``), remove its mark and drop its hold on the
        first record. Idempotent. (At exit without it only the holds go: the mark stays, unheld, and the creator
        knows the attacher of ours is gone.)"""
        if self._mark is not None and self._last_to_let_go():
            _reset_slot(self.suffix, self.rank)
        self.withdraw()

    def _last_to_let_go(self) -> bool:
        """Whether this attacher's let-go may reset the rank's one slot. With one attacher per rank
        (:meth:`seen`), always. With two (P/D with swap space or a storage backend: the worker and the transfer
        manager attach the cache messager's), only where the other is one of ours, living or dead by its mark: a
        creator of ours then waits for its lock, or frees for its death. Otherwise the other may be FastDeploy's,
        which holds nothing and resets the slot itself when it lets go; a reset now would let the creator free the
        cache under it (FastDeploy's own processes share the slot so)."""
        seen = self.seen()
        if seen.per_rank <= 1:
            return True
        mine = self._mark.name if self._mark is not None else None
        others = [name for name in seen.held if name != mine] + [mark.name for mark in seen.dead]
        return len(others) + 1 >= seen.per_rank  # by marks, not pids: one process may hold both (a test, a port)

    def seen(self, also_living: set[int] | frozenset[int] = frozenset()) -> Attachers:
        """The rank's attachers as this process must count them: its own count (``attachers``) is a floor that
        no mark, dead or forged, lowers, and any mark of the slot may raise it. Beside P/D's cache messager, which
        is never told the engine's swap space or storage backend, the floor is two once the rank's transfer manager
        says it is up (:func:`~.marks.transfer_manager_up`): FastDeploy starts one that attaches beside the worker
        whenever the engine has either. An attacher takes a living creator of ours at its word where that creator
        states its count (one where it holds the swap space itself, as ``fd-platforms run``'s manager does): the
        creator knows whether it is the rank's transfer manager."""
        exact = creator_attachers(self.tensors[0].name) if not self.creator and self.tensors else None
        floor = max(self.attachers, 1)
        if self.beside_messager and transfer_manager_up(self.suffix, self.rank):
            floor = max(floor, 2)  # the worker and the transfer manager
        return look(self.suffix, self.rank, also_living=also_living, floor=floor, exact=exact)

    def withdraw(self) -> None:
        """An attach that failed after the records were read: its mark removed and its holds dropped, the slot left
        as it is (it never got the cache; another attacher may hold the slot). Idempotent."""
        _remove_mark(self._mark)
        self._mark = None
        _release(self._held, None)
        self._at_exit.detach()

    def retract(self, timeout: float) -> None:
        """The creator's clear: wait (at most ``timeout`` s in all) until the rank's attachers have reset its
        ``cache_ready_signal`` slot to 0 (where one is expected) and no attacher of ours holds the first
        record, then unlink the records. A :class:`~fd_platforms.contract.errors.CacheInUseError` naming the rank and
        whom it waits for otherwise, with everything left in place."""
        if not self._held:
            return
        deadline = time.monotonic() + timeout
        if self._waits():
            self._wait_for_let_go(timeout)
        first = self._held[0]
        first.close()  # our own lock dropped: what remains are attachers' locks
        while True:
            try:
                probe = shm.Segment.inspect(first.name)  # any size: one truncated while published is still ours
            except (FileNotFoundError, shm.SegmentUnusable):
                break  # removed meanwhile: not ours to wait for
            with probe:
                if probe.inode != first.inode:
                    break  # replaced meanwhile: not ours to remove or wait for
                if probe.unused():
                    probe.unlink()
                    break
                holders = shm.flock_holders(probe.inode)
            if time.monotonic() >= deadline:
                self._held[0] = shm.Segment.open(first.name)  # hold it again: still published
                raise CacheInUseError(
                    f"rank {self.rank}'s KV cache is still attached by a process of fd-platforms after {timeout:g} s "
                    f"({_pids(holders)} holds /dev/shm/{first.name}), so nothing was freed. Fix: {STILL_HELD_FIX}",
                    (self.rank,),
                )
            time.sleep(POLL_SECONDS)
        self._held.pop(0)
        _release(self._held, os.getpid())
        self._at_exit.detach()
        remove_every_dead(self.suffix, self.rank)

    def attachers_now(self) -> Attachers:
        """The rank's attachers of ours as a creator sees them: the marks, and the processes other than this one
        that hold its first record (an attacher of ours holds it even where its mark was removed)."""
        holders = shm.flock_holders(self._held[0].inode) - {os.getpid()} if self._held else set()
        return self.seen(holders)

    def released_by_death(self) -> bool:
        """Whether the rank's slot stands released by the death of every attacher it can have, all of ours
        (:attr:`~.marks.Attachers.released_by_death`); never for a creator nobody attaches."""
        return self._waits() and self.creator and self.attachers_now().released_by_death

    def _waits(self) -> bool:
        """Whether a creator's clear waits for a let-go: some process attaches (a messager's worker always does)."""
        return bool(self.attachers) or self.beside_messager

    def _wait_for_let_go(self, timeout: float) -> None:
        """Wait for the slot to go 0. Where it stands released by death (every attacher the deployment can have is
        one of ours gone without letting go: SIGKILLed, or died in its attach), it is reset for them, with a
        WARNING; a dead mark beside an attacher that may be FastDeploy's, which holds nothing, is waited past."""
        with FastDeploySignal.attach(CACHE_READY, self.suffix) as signal:
            watch = DeathWatch(signal, self.rank, self.attachers_now, self.attachers_now())
            try:
                signal.wait_for(
                    self.rank, 0, timeout, what=f"rank {self.rank}'s creator waiting for its attacher", tend=watch
                )
            except SignalWaitError:
                raise CacheInUseError(_still_attached(self, signal.name, watch.seen, timeout), (self.rank,)) from None


class DeathWatch:
    """A wait's tend that looks at a slot's attachers every :data:`MARK_LOOK_SECONDS` (``look()``) and resets the
    slot for them where they stand released by death (:func:`reset_for_the_dead`); ``seen`` is the last look.
    A creator's clear and a drive wait with one alike."""

    def __init__(
        self, signal: FastDeploySignal, rank: int, look: Callable[[], Attachers], seen: Attachers | None = None
    ) -> None:
        self.signal, self.rank, self._look = signal, rank, look
        self.seen = seen if seen is not None else Attachers((), (), 1)
        self._next = 0.0

    def __call__(self) -> None:
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + MARK_LOOK_SECONDS
        self.seen = self._look()
        reset_for_the_dead(self.signal, self.rank, self.seen)


def reset_for_the_dead(signal: FastDeploySignal, rank: int, seen: Attachers) -> bool:
    """Where ``seen`` (the marks of ``rank``'s slot in ``signal``) says the slot stands released by the death of every
    attacher the deployment can have, all of ours, reset it for them with a WARNING and remove their marks; whether it
    did. A creator's clear, ``serve_kv_cache_status`` and a drive decide it alike."""
    if not seen.released_by_death or signal.get(rank) == 0:
        return False
    logger.warning(
        "rank %d's attacher of fd-platforms (%s) is gone without letting go (killed, or died in its attach), and no "
        "other process can be attached (%d per rank here): its slot in %s is reset for it, so its KV cache can be "
        "freed",
        rank,
        seen.describe_dead(),
        seen.per_rank,
        signal.name,
    )
    signal.set(rank, 0)
    remove_dead(seen)
    return True


def _still_attached(handles: FastDeployHandles, signal: str, seen: Attachers, timeout: float) -> str:
    """Why a creator's wait for its attachers' let-go failed: whom it waits for, and the way out."""
    said = f"rank {handles.rank}'s KV cache: its slot in {signal} is still set after {timeout:g} s, so nothing was "
    said += "freed"
    if seen.living:
        return (
            f"{said}. It is still attached by a process of fd-platforms ({', '.join(seen.living)}, as /proc/locks "
            f"shows the holder of its mark or of the first record). Fix: {STILL_HELD_FIX}"
        )
    reset = (
        'python -c "from fd_platforms.fastdeploy.signals import CACHE_READY, FastDeploySignal; '
        f"FastDeploySignal.attach(CACHE_READY, '{handles.suffix}').set({handles.rank}, 0)\""
    )
    if seen.dead:
        return (
            f"{said}. Its attacher(s) of fd-platforms ({seen.describe_dead()}) are gone without letting go, but this "
            f"deployment attaches {seen.per_rank} processes to each rank (P/D with swap space: the worker and the "
            "cache transfer manager), and the other may be FastDeploy's own, which holds no mark and may still map the "
            "cache: it is waited for, not freed under. Fix: clear or stop FastDeploy's attaching process (it resets "
            f"the slot when it lets go); if you know no process is attached, reset the slot by hand: {reset}"
        )
    return (
        f"{said}. No attacher of fd-platforms is attached (each holds a mark /dev/shm/"
        f"{attacher_prefix(handles.suffix, handles.rank)}*), so the attacher is FastDeploy's own process (its cache "
        "transfer manager or worker, which resets the slot to 0 when it lets go), or none came. Fix: clear or stop "
        f"FastDeploy's attaching process; if no process is attached, reset the slot by hand: {reset}"
    )


def _pids(holders: set[int]) -> str:
    return f"pid {', '.join(map(str, sorted(holders)))}" if holders else "a process of another PID namespace"


def _reset_slot(suffix: str, rank: int) -> None:
    """An attacher's let-go: its slot reset to 0, as FastDeploy's attacher does; a slot that cannot be reset (its
    signal is gone) is logged."""
    try:
        with FastDeploySignal.attach(CACHE_READY, suffix) as signal:
            signal.set(rank, 0)
    except FdPlatformsError as exc:
        logger.warning("rank %d's attacher could not reset its cache_ready_signal slot: %s", rank, exc)


def _remove_mark(mark: shm.Segment | None) -> None:
    if mark is not None:
        mark.unlink()
        mark.close()


def _check_not_published(suffix: str, rank: int, first: str, count: int, platform: str) -> None:
    """Refuse to write over records another process may still own: where ``first`` exists and the rank's slot is
    set (its cache published), unless an unheld creator mark of ours proves them a dead creator's of ours.
    FastDeploy's creators (its cache messager, runner or transfer manager) hold nothing, so whether one lives
    cannot be known; records held by a living process of ours are refused when reused (:func:`_record_segment`)."""
    try:
        probe = shm.Segment.inspect(first)
    except (FileNotFoundError, shm.SegmentUnusable):
        return  # none, or refused with its reason when written
    with probe:
        record = probe.read(record_layout(platform).size + 1)
    if stale_creator(first, record) is not None or _slot(suffix, rank) != 1:
        return
    raise CacheSharingError(
        f"rank {rank}'s KV cache is already published under FastDeploy's names (/dev/shm/{first} and {count - 1} "
        f"more) and its slot in {CACHE_READY}.{suffix} is set, and no creator of fd-platforms wrote them: a FastDeploy "
        "process (its cache messager, runner or transfer manager) published them and may still own them (it holds "
        "nothing that would prove it dead), so they are not written over. Fix: attach to that cache instead of "
        "creating one (in P/D decode with swap space FastDeploy's cache messager creates it); if no FastDeploy "
        "process uses it, stop the engine that owns the suffix, or remove the records and reset the slot"
    )


def _slot(suffix: str, rank: int) -> int | None:
    """The rank's slot (its ``cache_ready_signal`` word), None where it cannot be read."""
    with suppress(FdPlatformsError), FastDeploySignal.attach(CACHE_READY, suffix) as signal:
        return signal.get(rank)
    return None


def _check_one_creator(rank: int, tensors: Sequence[PublishedTensor]) -> None:
    """Every record of a rank read must be one creator's: handles of one kind, naming one process (where they name
    one), and that process one that may have created them (:func:`_check_creator`)."""
    named = [handle_pid(tensor.handle) for tensor in tensors]
    pids = sorted({pid for pid in named if pid is not None})
    if pids and None in named:
        raise CacheSharingError(
            f"rank {rank}'s publication (FastDeploy's records) mixes handles of two kinds: {named.count(None)} "
            f"name no process (a raw IPC handle) and {len(named) - named.count(None)} name pid "
            f"{', '.join(map(str, pids))} (memfd:<pid>:<fd>), "
            "but one creator on one platform writes every record of a rank alike: some were written by another "
            "process. Fix: find what else writes to /dev/shm under FastDeploy's names; restart the engine"
        )
    if len(pids) > 1:
        raise CacheSharingError(
            f"rank {rank}'s publication (FastDeploy's records) names handles of {len(pids)} processes (pids "
            f"{', '.join(map(str, pids))}), but one creator makes every tensor of a rank: some were written by "
            "another process. Fix: find what else writes to /dev/shm under FastDeploy's names; restart the engine"
        )
    if pids:
        _check_creator(tensors[-1].name, pids[0])


def _check_creator(name: str, pid: int) -> None:
    """The process the handles of record ``name`` name (a ``memfd:<pid>:<fd>``) must be one that may have
    created them: running as this user (who owns the record) and, where processes hold the record (a creator
    of ours holds each one it publishes; FastDeploy's hold nothing), one of them; this attacher itself only
    where it is that creator (one process creating and attaching, as tests and single-process engines do)."""
    try:
        record = shm.Segment.inspect(name)
    except (FileNotFoundError, shm.SegmentUnusable):
        return  # gone meanwhile: opening its handles reports that
    with record:
        holders = shm.flock_holders(record.inode)
    if pid == os.getpid() and pid not in holders:
        raise _not_the_creator(name, pid, "which is this attaching process itself, and it does not hold the record")
    uid = process_uid(pid)
    if uid is not None and uid != os.geteuid():
        raise _not_the_creator(name, pid, f"a process of uid {uid}, not of this user (uid {os.geteuid()})")
    if holders and pid not in holders:
        holding = ", ".join(map(str, sorted(holders)))
        raise _not_the_creator(
            name, pid, f"which does not hold the record, while the creator of ours does (pids {holding})"
        )


def _not_the_creator(name: str, pid: int, what: str) -> CacheSharingError:
    return CacheSharingError(
        f"FastDeploy's record /dev/shm/{name} names memory of pid {pid}, {what}: it would map memory that is not its "
        "creator's as this process's KV cache, so nothing was opened. Fix: find what else writes to /dev/shm "
        "under FastDeploy's names; run every process of the engine as one user"
    )


def _hold_record(name: str, size: int) -> shm.Segment:
    """An attacher's shared hold on record ``name`` of ``size`` bytes (the kernel drops it when this process dies)."""
    try:
        return shm.Segment.open(name, size)
    except FileNotFoundError:
        raise CacheSharingError(
            f"KV cache tensor {name}'s record was removed while this process attached (its creator cleared). "
            "Fix: initialize again once the creator has published the cache again"
        ) from None
    except shm.SegmentUnusable as exc:
        raise CacheSharingError(f"KV cache tensor {name}'s handle record cannot be held: {exc}") from None


def _record_segment(name: str, platform: str, record: bytes) -> shm.Segment:
    """Record segment ``name`` in ``platform``'s layout holding ``record``: new, or FastDeploy's leftover (no process
    of ours holds it) reused, mode 0600. A leftover others could write is replaced by a new one instead: a
    descriptor opened while it was writable would still write through a mode reset."""
    layout = record_layout(platform)
    with suppress(FileExistsError):
        return shm.Segment.create(name, layout.size, record)
    if _unheld_leftover(name, layout, platform):
        try:
            return shm.Segment.create(name, layout.size, record)
        except FileExistsError:
            raise CacheSharingError(
                f"KV cache tensor {name}'s record /dev/shm/{name} was written by another process while this one "
                "replaced it. Fix: find the other creator of this rank and device; two creators cannot share "
                "FastDeploy's names"
            ) from None
    segment = shm.Segment.open(name, layout.size)
    os.fchmod(segment.fd, 0o600)
    os.pwrite(segment.fd, record, 0)
    return segment


def _unheld_leftover(name: str, layout: RecordLayout, platform: str) -> bool:
    """Check that record ``name`` of this user's is of ``platform``'s size and held by no process of ours;
    whether it was writable by others and so removed (it is this user's and unused: ours to remove)."""
    try:
        probe = shm.Segment.inspect(name)
    except (FileNotFoundError, shm.SegmentUnusable) as exc:
        raise CacheSharingError(
            f"KV cache tensor {name}'s handle record cannot be written: /dev/shm/{name} exists and cannot be reused "
            f"({exc}). Fix: remove /dev/shm/{name} if no engine uses it"
        ) from None
    with probe:
        unused = probe.unused()
        if probe.size != layout.size:
            raise _odd_leftover(name, probe.size, layout, platform, unused)
        if not unused:
            raise CacheSharingError(
                f"KV cache tensor {name} is already published by a running process (/dev/shm/{name} is held): "
                "FastDeploy's record names carry no instance, only the layer, rank and device id, so another engine "
                "on this machine with the same device ids took them (FastDeploy's own engines collide the same way). "
                "Fix: give each engine distinct device ids, or run one engine per device; else clear that cache first"
            )
        return bool(os.fstat(probe.fd).st_mode & (stat.S_IWGRP | stat.S_IWOTH)) and probe.unlink()


def _odd_leftover(name: str, size: int, layout: RecordLayout, platform: str, unused: bool) -> CacheSharingError:
    """A record of another size than ``platform``'s where a creator would write: who holds it, and the fix."""
    if unused:
        found = (
            "and no process of fd-platforms holds it: a leftover of another platform's or FastDeploy build's "
            "creator, or a damaged record. It is not rewritten, since a FastDeploy process of that build (which "
            f"holds no lock) may still read it. Fix: remove /dev/shm/{name} if no engine uses it"
        )
    else:
        found = (
            "and a running process of fd-platforms holds it (a creator or attacher on another platform). Fix: clear "
            "that process's cache or stop it"
        )
    return CacheSharingError(
        f"FastDeploy's record /dev/shm/{name} holds {size} bytes, but platform {platform}'s record is {layout.size} "
        f"bytes ({layout.source}), {found}; run every process of the engine on one platform"
    )


def _wrong_size(name: str, size: int, layout: RecordLayout, platform: str) -> CacheSharingError:
    return CacheSharingError(
        f"FastDeploy's record /dev/shm/{name} holds {size} bytes, but platform {platform}'s record is {layout.size} "
        f"bytes ({layout.source}): it was written by a creator of another platform or FastDeploy build. Fix: run "
        "every process of the engine on one platform, with FastDeploy built for it; remove the record if no engine "
        "uses it"
    )


def _named_pid(tensors: Sequence[PublishedTensor]) -> int | None:
    pids = {handle_pid(tensor.handle) for tensor in tensors}
    return pids.pop() if len(pids) == 1 else None


def _release(held: list[shm.Segment], creator_pid: int | None) -> None:
    while held:
        held.pop().release(creator_pid)
