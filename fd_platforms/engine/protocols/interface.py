"""What the engine asks of an inter-process protocol: one small interface, one object per protocol."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING, ClassVar, Protocol

from ..publication import PublishedTensor

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ...loading.platform import Platform
    from ...rules.decision import DecisionInputs
    from ...rules.layout import CacheLayout


class Published(Protocol):
    """A rank's publication: the handles of its cache as a protocol publishes them (our manifest, FastDeploy's
    records, one per tensor): what the cache record asks of it, whoever published it."""

    name: str
    rank: int
    creator: bool
    tensors: tuple[PublishedTensor, ...]
    #: Whether an attacher's :meth:`let_go` decides the rank's slot itself (FastDeploy's records: one slot for two
    #: attachers), so the cache record does not reset it first.
    resets_slot: bool

    @property
    def creator_pid(self) -> int | None:
        """The pid of the process that published it, where the records say (None: they do not)."""

    def let_go(self) -> None:
        """An attacher lets go of it."""

    def withdraw(self) -> None:
        """An attach that failed lets go without telling anyone it was attached."""

    def released_by_death(self) -> bool:
        """Whether every attacher that held it has died (so the creator may free it)."""

    def retract(self, timeout: float) -> None:
        """The creator takes it back once every attacher has let go (at most ``timeout``)."""


class WireProtocol(ABC):
    """Every step where the engine's processes meet, in one protocol's format.

    An ABC rather than a ``typing.Protocol``: the implementations are this package's own, each made
    once at import, so one that lacks an operation fails there instead of at its first call. A step
    that exists under one protocol only is a no-op under the other. ``instance`` is the name the
    processes of one engine share: the engine instance (our cache-ready signal's name, or FastDeploy's signal suffix).
    """

    #: As the public API and ``[scheduler] protocol`` spell it.
    name: ClassVar[str]

    def __repr__(self) -> str:
        """As a record that holds it shows it (``CacheRequest(protocol=...)``): the call that gives it back."""
        return f"protocol_named({self.name!r})"

    @abstractmethod
    def check_instance(self, instance: object) -> None:
        """A ConfigError unless ``instance`` is a name this protocol's signals can have."""

    @abstractmethod
    def instance_name(self, instance: object, *, tp: int | None) -> str:
        """The engine instance's name from the engine call's ``instance=``, checked; ``tp`` (None: unknown) the
        engine's local ranks."""

    @abstractmethod
    def wait_limit(self, timeout: float | None) -> float:
        """The bound of a wait of ours under this protocol (for the rank's cache, for its attachers' let-go):
        ``timeout``, else ``FD_CACHE_READY_TIMEOUT``, else the protocol's default (a protocol whose peers wait for
        ever has none)."""

    @abstractmethod
    def tensor_name(self, instance: str, layout_name: str) -> str:
        """The name the layout's tensor ``layout_name`` is exported and opened under."""

    @abstractmethod
    def set_ready(self, instance: str, rank: int) -> None:
        """Set ``rank``'s cache-ready slot (and wake its waiters)."""

    @abstractmethod
    def clear_ready(self, instance: str, rank: int) -> None:
        """Reset ``rank``'s cache-ready slot to 0."""

    @abstractmethod
    def check_signals(self, instance: str, rank: int, *, manager: bool, swap: bool) -> None:
        """Before anything is published: a typed error unless every signal that a creation for ``rank``
        writes exists and has ``rank``'s slot (``manager``: the cache manager's words too; ``swap``: it
        holds host swap space), so a call that cannot finish fails before it leaves anything behind."""

    @abstractmethod
    def check_export(self, platform: Platform, device: str) -> None:
        """Before any tensor is exported on ``device``: a CacheSharingError where this protocol's records cannot
        carry the handles ``platform``'s memory gets in this process
        (:meth:`Platform.memory_ipc() <fd_platforms.loading.platform.Platform.memory_ipc>`)."""

    @abstractmethod
    def rule_in_force(self, rule: str | None, inputs: DecisionInputs, field: str = "rule") -> str:
        """The rule version the processes follow on ``inputs``: ``rule`` where pinned, else the default
        where this protocol's peers can be taken to follow it; a ConfigError naming ``field`` otherwise."""

    @abstractmethod
    def rule_mismatch(self, rule: str, inputs: DecisionInputs) -> str:
        """For a wait on a peer that timed out under ``rule``: how a peer following another version
        would explain it, and the fix; "" where no peer can differ."""

    @abstractmethod
    def wait_ready(
        self, platform: Platform, instance: str, rank: int, timeout: float | None, creator_pid: int | None
    ) -> float:
        """Wait (at most ``timeout``, None: ``FD_CACHE_READY_TIMEOUT``; failing early when ``creator_pid`` dies) for
        ``rank``'s slot; the seconds waited."""

    @abstractmethod
    def part_record(self, instance: str, layout: CacheLayout) -> str:
        """The ``/dev/shm`` entry that is there while ``layout``'s part of its rank's cache is published (a
        timed-out wait says which part of main and draft it sees published and which not)."""

    @abstractmethod
    def publish(
        self,
        instance: str,
        rank: int,
        device: str,
        tensors: Sequence[PublishedTensor],
        platform_name: str,
        *,
        attachers: int,
        part: str = "all",
        beside_messager: bool = False,
    ) -> Published:
        """Publish ``rank``'s exported tensors (held by this process until retracted); ``attachers``: how many
        processes are configured to attach to them (0: none); ``part`` the layout's part (its MTP draft
        layers are published on their own); ``beside_messager``: this creator is P/D's cache messager, which cannot
        see whether a transfer manager attaches beside the worker (:class:`~fd_platforms.rules.roles.CacheRoles`)."""

    @abstractmethod
    def open_published(
        self,
        instance: str,
        rank: int,
        expected: Sequence[PublishedTensor],
        platform_name: str,
        part: str = "all",
        *,
        attachers: int = 1,
        beside_messager: bool = False,
    ) -> Published:
        """``rank``'s publication of ``part``, held by this attacher until it lets go (or withdraws, where its attach
        fails); ``expected`` is this process's layout (no handles), for a protocol whose records carry no shapes,
        ``platform_name`` the attaching platform, for one whose records are laid out per platform,
        ``attachers`` how many processes attach each rank in this deployment, and ``beside_messager`` whether its
        creator is P/D's cache messager."""

    @abstractmethod
    def manager_up(self, instance: str, rank: int, *, swap: bool) -> None:
        """The cache manager holds ``rank``'s caches (``swap``: with host swap space)."""

    @abstractmethod
    def manager_swap_freed(self, instance: str, rank: int) -> None:
        """The cache manager freed ``rank``'s host swap space."""

    @abstractmethod
    def hand_off_block_count(
        self, instance: str, num_blocks: int, *, block_count_suffix: str | None, platform: Platform, ranks: int
    ) -> str | None:
        """Give the engine the agreed block count (local rank 0 calls it; ``ranks`` local ranks on
        ``platform``; the word's own suffix, None: ``instance``'s); where it was written, or None
        where this protocol's engine waits for no such word."""

    @abstractmethod
    def create_signals(self, ranks: int, *, device_type: str, block_count_suffix: str | None) -> tuple[str, ExitStack]:
        """Create a run's signals for ``ranks`` local ranks of ``device_type``, as its engine (the block
        count's word under ``block_count_suffix``, None: the run's): the engine instance its processes are
        given, and what removes the signals again."""

    @abstractmethod
    def ready_signal(self, instance: str) -> str:
        """The shared-memory name of the cache-ready signal (for the run report)."""

    @abstractmethod
    def describe_signals(self, instance: str) -> str:
        """The signals of ``instance``, for the run's start-up line."""

    @abstractmethod
    def reclaim(self, instance: str) -> None:
        """Once every process of the run has ended: remove what processes killed mid-clear left published."""
