"""Where one rank's shared KV cache is published: a small manifest in ``/dev/shm``, by name.

The creator of a rank's cache (a worker, or the cache manager) exports each tensor through the
platform and publishes the manifest; an attacher reads it, checks it against its own layout and
opens each tensor by its handle. Names follow the engine instance of the cache-ready signal:
signal ``fd_cache_ready.<instance>`` → manifest ``fd_kv_cache.<instance>.rank<r>`` (its MTP draft
layers' ``fd_kv_cache.<instance>.rank<r>.draft``) and published
tensor names ``fd_kv.<instance>.<layout name>``.

Manifest: an 8-byte header (magic ``FDKV``, then the native uint32 length of the JSON that follows)
and JSON ``{"format": 1, "rank", "creator_pid", "device", "tensors": [{"name", "shape", "dtype",
"handle"}]}``, written before the magic. It is tiny (a few KB); the tensors' memory is wherever the
platform keeps it.

Holding is the kernel's business (:mod:`fd_platforms.ipc.shm`): the creator holds a shared lock while
the cache is published, every attacher holds one while it is attached. Retracting waits until the
creator alone holds it — every attacher has let go, or died (the kernel dropped its lock) — and only
then unlinks it, so a creator never frees memory another process still maps.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
import weakref
from dataclasses import dataclass
from typing import Any

from ..contract.errors import CacheInUseError, CacheSharingError
from ..contract.integers import MAX_COUNT, is_int
from ..ipc import shm
from ..ipc.cache_signal import SIGNAL_PREFIX, check_signal_name
from ..ipc.waiting import WaitProgress

logger = logging.getLogger(__name__)

PUBLICATION_PREFIX = "fd_kv_cache."
TENSOR_PREFIX = "fd_kv."
MAGIC = b"FDKV"
FORMAT = 1
HEADER = struct.Struct("=4sI")
MAX_MANIFEST_BYTES = 64 << 20  # far above any layout (a few hundred bytes per tensor)
POLL_SECONDS = 0.005
#: The way out of a creator's clear that an attacher still holds: a lenient attacher (``clear(strict=False)``)
#: has cleared already and lets go only once its engine's own references to the tensors are gone.
STILL_HELD_FIX = (
    "clear the attaching process's cache (KVCache.clear()); if it cleared with strict=False, it lets go only once "
    "its engine drops its own references to the cache's tensors (and views of them): drop those there, then clear "
    "this cache again; or stop that process"
)


def instance_of(instance: str) -> str:
    """The id in an engine instance's name, its cache-ready signal (``fd_cache_ready.X`` → ``X``)."""
    check_signal_name(instance)
    return instance.removeprefix(SIGNAL_PREFIX)


def publication_name(instance: str, rank: int, part: str = "all") -> str:
    """The manifest of ``rank``'s cache in engine ``instance`` (its cache-ready signal); the MTP draft layers
    (``part`` ``"draft"``, published on a call of their own) have their own, ``...rank<r>.draft``."""
    return f"{PUBLICATION_PREFIX}{instance_of(instance)}.rank{rank}" + (".draft" if part == "draft" else "")


def published_tensor_name(instance: str, layout_name: str) -> str:
    """The name a tensor of the layout is exported under, unique to the engine instance."""
    return f"{TENSOR_PREFIX}{instance_of(instance)}.{layout_name}"


@dataclass(frozen=True)
class PublishedTensor:
    """One manifest entry: the layout's name of a tensor, its shape, dtype and the exporter's handle.

    ``address`` is where the tensor's data starts in the exporting process (FastDeploy's XPU record
    carries it; the manifest does not), or None where unknown."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    handle: str
    address: int | None = None


class Publication:
    """A rank's manifest, held open by this process (creator or attacher) until it lets go.

    A creator that exits without retracting (or whose object is collected) unlinks it at exit, as
    the cache-ready signal's owner does; only SIGKILL leaves it, for the next sweep. An attacher's hold
    ends only with its let-go or its process (:func:`hold_outlives_collection`).
    """

    def __init__(
        self,
        segment: shm.Segment,
        rank: int,
        creator_pid: int,
        device: str,
        tensors: tuple[PublishedTensor, ...],
        *,
        creator: bool,
    ) -> None:
        self._held: dict[str, shm.Segment | None] = {"segment": segment}
        self.name, self.rank, self.creator_pid, self.device = segment.name, rank, creator_pid, device
        self.tensors, self.creator = tensors, creator
        self._at_exit = (
            weakref.finalize(self, _release, self._held, os.getpid())
            if creator
            else hold_outlives_collection(self, rank, "this protocol's manifest lock")
        )

    @property
    def _segment(self) -> shm.Segment | None:
        return self._held["segment"]

    @_segment.setter
    def _segment(self, segment: shm.Segment | None) -> None:
        self._held["segment"] = segment

    @classmethod
    def create(cls, name: str, rank: int, device: str, tensors: list[PublishedTensor]) -> Publication:
        """Publish the manifest (this process holds it). A stale one under the name (its holders all
        died) is reclaimed; one in use is a CacheSharingError."""
        entries = [{key: getattr(tensor, key) for key in ("name", "shape", "dtype", "handle")} for tensor in tensors]
        document = {"format": FORMAT, "rank": rank, "creator_pid": os.getpid(), "device": device, "tensors": entries}
        payload = json.dumps(document, separators=(",", ":")).encode()
        manifest = HEADER.pack(MAGIC, len(payload)) + payload
        try:
            segment = shm.Segment.create(name, len(manifest), manifest)
        except FileExistsError:
            verdict, detail = shm.reclaim(name, HEADER.size, _recognise, "KV cache publication")
            if verdict not in (shm.Verdict.RECLAIMED, shm.Verdict.GONE):
                raise CacheSharingError(
                    f"rank {rank}'s KV cache is already published as /dev/shm/{name} ({detail}). "
                    "Fix: clear the published cache first, or give this engine instance its own signal name"
                ) from None
            segment = shm.Segment.create(name, len(manifest), manifest)
        return cls(segment, rank, os.getpid(), device, tuple(tensors), creator=True)

    @classmethod
    def open(cls, name: str, rank: int) -> Publication:
        """Read rank ``rank``'s manifest and hold it (an attacher) until :meth:`let_go`."""
        missing = (
            f"rank {rank}'s KV cache is not published (no /dev/shm/{name}) although its cache-ready slot is set. "
            "Fix: the creator publishes before it sets the slot; check that every process uses the same signal name"
        )
        try:
            segment = shm.Segment.open(name, HEADER.size)
        except FileNotFoundError:
            raise CacheSharingError(missing) from None
        except shm.SegmentUnusable as exc:
            raise CacheSharingError(f"rank {rank}'s KV cache publication cannot be read: {exc}") from None
        try:
            document = _read(segment)
            if document is None or document.get("rank") != rank:
                raise CacheSharingError(
                    f"/dev/shm/{name} is not a complete fd-platforms KV cache publication (format {FORMAT}) of rank "
                    f"{rank}. Fix: check the signal name; a publication of another version or engine cannot be used"
                )
        except BaseException:
            segment.close()
            raise
        tensors = tuple(
            PublishedTensor(entry["name"], tuple(entry["shape"]), entry["dtype"], entry["handle"])
            for entry in document["tensors"]
        )
        return cls(segment, rank, document["creator_pid"], document["device"], tensors, creator=False)

    #: Its :meth:`let_go` leaves the rank's slot alone: the attacher's
    #: :meth:`KVCache.clear() <fd_platforms.engine.kv_cache.KVCache.clear>` resets it.
    resets_slot = False

    def let_go(self) -> None:
        """Drop this process's hold (an attacher's clear). Idempotent."""
        _release(self._held, None)  # closed, not unlinked (no creator pid)
        self._at_exit.detach()

    def released_by_death(self) -> bool:
        """Never: an attacher's hold is its lock on the manifest, which the kernel drops at its death."""
        return False

    def withdraw(self) -> None:
        """A failed attach's let-go: the hold dropped (this protocol's slot is not the attacher's to write)."""
        self.let_go()

    def retract(self, timeout: float) -> None:
        """The creator's clear: wait (at most ``timeout`` s; ``math.inf``: no limit, saying what it waits
        for every few seconds, :mod:`fd_platforms.ipc.waiting`) until no attacher holds it, then unlink it.

        Raises :class:`~fd_platforms.contract.errors.CacheInUseError` naming the rank when an attacher still holds it;
        the publication then stays in place, held by this process, and the caller may retry.
        """
        if self._segment is None:
            return
        own = self._segment
        own.close()  # let go of our own lock first: what remains are attachers' locks
        self._segment = None
        start = time.monotonic()
        deadline, progress = start + timeout, WaitProgress(timeout, start)
        while True:
            try:
                probe = shm.Segment.inspect(self.name)  # any size: ours even if damaged (truncated) since
            except (FileNotFoundError, shm.SegmentUnusable):
                return  # removed meanwhile, or no longer a file of ours: nothing of ours is left to retract
            with probe:
                if probe.inode != own.inode:
                    return  # replaced meanwhile: not ours to remove
                if probe.unused():
                    probe.unlink()
                    self._at_exit.detach()
                    return
            if time.monotonic() >= deadline:
                self._segment = shm.Segment.open(self.name)  # hold it again: still published
                raise CacheInUseError(
                    f"rank {self.rank}'s KV cache is still held by its attaching process after {timeout:g} s, so it "
                    f"was not freed. Fix: {STILL_HELD_FIX}",
                    (self.rank,),
                )
            progress.say(
                time.monotonic(),
                lambda: (
                    f"rank {self.rank}'s creator waiting for its attacher to let go of "
                    f"{self.name!r} (an attacher holds a lock on it until its KV cache is cleared)"
                ),
            )
            time.sleep(POLL_SECONDS)


def hold_outlives_collection(owner: object, rank: int, hold: str) -> weakref.finalize[Any, Any]:
    """An attacher's finalizer: ``owner`` collected before its let-go (a ``KVCache`` dropped without ``clear()``) keeps
    its ``hold`` (descriptors left open, and with them their locks and marks) until the process ends, and says so
    with a WARNING naming the rank and the fix. Its tensors may still be referenced (FastDeploy keeps them in
    ``share_inputs`` and ``forward_meta``) and device IPC memory keeps nothing of ours alive, so a creator that saw
    the hold go would free pages this process still writes. It never runs at exit: the kernel drops the locks with
    the process, and a creator then frees for its death."""
    finalizer = weakref.finalize(owner, _kept_after_collection, rank, hold)
    finalizer.atexit = False
    return finalizer


def _kept_after_collection(rank: int, hold: str) -> None:
    logger.warning(
        "rank %d's attached KV cache was dropped without clear(): this process keeps its hold on the creator's cache "
        "(%s) until it exits, so the creator cannot free memory it may still use. Fix: call KVCache.clear() (or "
        "ManagedCache.clear()) once the engine is done with the cache",
        rank,
        hold,
    )


def _release(held: dict[str, shm.Segment | None], creator_pid: int | None) -> None:
    """At exit or collection: the creator (not a forked child of it) unlinks what it published."""
    segment = held["segment"]
    if segment is not None:
        segment.release(creator_pid)
    held["segment"] = None


def _read(segment: shm.Segment) -> dict[str, Any] | None:
    """The manifest's JSON if the segment holds a complete one (sizes checked before reading), else None."""
    header = segment.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    magic, length = HEADER.unpack(header)
    if magic != MAGIC or length > min(MAX_MANIFEST_BYTES, segment.size - HEADER.size):
        return None
    try:
        document = json.loads(segment.read(length, HEADER.size))
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    return document if _well_formed(document) else None


def _well_formed(document: object) -> bool:
    """Whether ``document`` is a manifest of this format, every field of the type it must have."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return False
    if not (_count(document.get("rank"), 0) and _count(document.get("creator_pid"), 1)):
        return False
    tensors = document.get("tensors")
    return (
        isinstance(document.get("device"), str)
        and isinstance(tensors, list)
        and all(
            isinstance(entry, dict)
            and all(isinstance(entry.get(key), str) for key in ("name", "dtype", "handle"))
            and isinstance(entry.get("shape"), list)
            and bool(entry["shape"])
            and all(_count(extent, 1) for extent in entry["shape"])
            for entry in tensors
        )
    )


def _count(value: object, minimum: int) -> bool:
    return is_int(value) and minimum <= value <= MAX_COUNT


def _recognise(segment: shm.Segment) -> str | None:
    document = _read(segment)
    return None if document is None else f"pid {document.get('creator_pid')}"


def reclaim_instance(instance: str) -> list[str]:
    """Unlink what the engine instance of ``instance`` published and no living process holds any
    more (its processes were killed mid-clear): the engine's own leftovers, reclaimed quietly. Call it
    once every process of the instance has ended: one still held is held from outside the engine,
    and is named in a WARNING, as is any entry under its names that is not a publication of ours
    (a directory, another user's file): nothing is left behind without a word."""
    reclaimed = []
    for name in shm.names(f"{PUBLICATION_PREFIX}{instance_of(instance)}."):
        verdict, detail = shm.reclaim(name, HEADER.size, _recognise, "KV cache publication", say=logger.info)
        if verdict == shm.Verdict.RECLAIMED:
            reclaimed.append(name)
        elif verdict == shm.Verdict.IN_USE:
            logger.warning(
                "left /dev/shm/%s in place: every process of this engine has ended, but %s. It is removed by "
                "the first run after that process lets go; find it with: fuser /dev/shm/%s",
                name,
                detail,
                name,
            )
        elif verdict == shm.Verdict.SKIPPED:
            logger.warning(
                "left an entry under this engine instance's names in place: %s, so it is not provably this engine's "
                "to remove. Fix: find whose it is (ls -l, fuser), and remove it by hand if nobody needs it",
                detail,
            )
    return reclaimed


def reclaim_stale_publications() -> list[str]:
    """Unlink every KV cache publication of this user's that no living process holds (see the signal's sweep)."""
    return shm.sweep(PUBLICATION_PREFIX, HEADER.size, _recognise, "KV cache publication")
