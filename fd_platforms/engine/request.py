"""One rank's cache request: what :func:`~.initialize.initialize_kv_cache` and :func:`~.initialize.manage_kv_cache`
take beside the platform, in one record checked once, when it is made.

:class:`CacheRequest` holds the rank's layout and blocks, the rule's inputs and pin, the engine instance and its
protocol, the wait (timeout, the creator's pid), the engine's tensor specs, and for a cache manager the MTP draft
part and a kept host cache. A bad field is a ConfigError naming it, when the record is made, before any call or
hook. Once made, the record holds what the calls read as they are: the protocol as its object (a name is found
through the ``fd_platforms.protocols`` entry points: :func:`~fd_platforms.engine.protocols.registry.protocol_named`),
the engine instance as that protocol names it, and the rule's inputs with the version in force
(:attr:`CacheRequest.inputs`). What needs the platform (the specs against its shapes, whether it can share) is checked
by the call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from ..contract.errors import ConfigError
from ..contract.integers import check_int
from ..contract.types import CacheRoleShape
from ..ipc.cache_signal import resolve_timeout
from ..ipc.process_watch import PID_MAX_LIMIT
from ..ipc.shared_words import check_tp
from ..rules.decision import DecisionInputs
from ..rules.layout import CacheLayout, check_layout, check_num_blocks
from .host_cache import HostCache
from .protocols import OURS, WireProtocol, protocol_named


@dataclass(frozen=True, kw_only=True)
class CacheRequest:
    """One rank's KV cache as an engine asks for it; every field checked when the record is made (ConfigError).

    ``layout`` and ``num_blocks`` the rank's layout (with MTP: ``whole.main()``, or a proposer's ``whole.draft()``)
    and blocks; ``profile``, ``num_cpu_blocks``, ``storage_backend``, ``splitwise_role`` the rule's inputs and
    ``rule`` its pinned version (None: the protocol's
    :meth:`~fd_platforms.engine.protocols.interface.WireProtocol.rule_in_force`); ``instance`` the engine instance (our
    cache-ready signal's name, or FastDeploy's signal suffix) under ``protocol`` (an installed protocol's name,
    ``"fd-platforms"`` or ``"fastdeploy"``, or the object; held as the object: :attr:`wire`); ``tp`` the local ranks
    where known (or the tp a ``FastDeploySuffix`` instance carries; the two must agree); ``creator_pid`` the process
    that creates the cache (its death ends a wait) and ``timeout`` the wait's bound (None: ``FD_CACHE_READY_TIMEOUT``
    when the wait starts); ``tensor_specs`` one layer's tensors as the engine's attention backend states them (None: the
    platform's shapes). A cache manager's only: ``draft`` (the MTP draft part, with ``layout`` the main part) and
    ``host_cache`` (the one a cleared :class:`~.initialize.ManagedCache` kept).
    """

    layout: CacheLayout
    num_blocks: int
    instance: str
    num_cpu_blocks: int
    splitwise_role: str
    profile: bool = False
    storage_backend: str | None = None
    rule: str | None = None
    protocol: WireProtocol | str = field(default=OURS)
    """The protocol the engine's processes speak, given by name or as the object; held as the object (:attr:`wire`)."""
    tp: int | None = None
    creator_pid: int | None = None
    timeout: float | None = None
    tensor_specs: tuple[CacheRoleShape, ...] | None = None
    draft: CacheLayout | None = None
    host_cache: HostCache | None = field(default=None, repr=False)
    inputs: DecisionInputs = field(init=False, repr=False, compare=False)
    """The rule's inputs with the version the engine's processes follow (the pin, or the protocol's default)."""

    def __post_init__(self) -> None:
        for name in PLAIN_FIELDS:  # taken at their value: no subclass's comparisons or hashing run later
            object.__setattr__(self, name, plain_value(getattr(self, name)))
        check_layout(self.layout)
        check_num_blocks(self.num_blocks)
        try:
            inputs = DecisionInputs(self.profile, self.num_cpu_blocks, self.storage_backend, self.splitwise_role)
        except ConfigError as error:  # the rule names the backend as FastDeploy's config does; here it is ours
            if error.field != "kvcache_storage_backend":
                raise
            raise ConfigError("storage_backend", error.value, error.allowed, error.fix) from None
        wire = protocol_named(self.protocol)
        object.__setattr__(self, "protocol", wire)
        object.__setattr__(self, "tp", _tp(self.instance, self.tp))
        object.__setattr__(self, "instance", _instance(wire, self.instance, self.tp, self.layout.rank))
        object.__setattr__(self, "inputs", replace(inputs, rule=wire.rule_in_force(self.rule, inputs)))
        if self.creator_pid is not None:
            check_int(
                "creator_pid",
                self.creator_pid,
                1,
                PID_MAX_LIMIT,
                what="None or a process id",
                fix="pass the pid of the process that creates the cache, or None",
            )
        if self.timeout is not None:
            resolve_timeout(self.timeout)
        object.__setattr__(self, "tensor_specs", _specs(self.tensor_specs))
        if self.draft is not None:
            check_not_draft(self.layout)
            self.layout.joined(self.draft)  # the draft part of the same rank's layout, with layout its main part
        if self.host_cache is not None and not isinstance(self.host_cache, HostCache):
            raise ConfigError(
                "host_cache",
                self.host_cache,
                "None or the HostCache a cleared ManagedCache kept",
                "pass the cleared ManagedCache's .host_cache, or None",
            )

    @property
    def wire(self) -> WireProtocol:
        """:attr:`protocol` as the object it is once the record is made (a name was resolved then)."""
        return cast(WireProtocol, self.protocol)


#: The fields whose int or str values the record holds as plain ``int``/``str`` (:func:`plain_value`).
PLAIN_FIELDS = (
    "num_blocks",
    "num_cpu_blocks",
    "splitwise_role",
    "storage_backend",
    "rule",
    "tp",
    "creator_pid",
    "timeout",
)


def plain_value(value: object) -> object:
    """An ``int`` or ``str`` subclass's value as a plain ``int``/``str`` (``int.__int__``/``str.__str__``, which read
    the value itself: the subclass's own methods do not run); anything else as it is (bool too: checks refuse it)."""
    if isinstance(value, int) and not isinstance(value, bool) and type(value) is not int:
        return int.__int__(value)
    if isinstance(value, str) and type(value) is not str:
        return str.__str__(value)
    return value


def check_not_draft(layout: CacheLayout) -> None:
    """A cache manager's ``layout`` is the rank's whole layout or its main part; its draft part goes in ``draft=`` (what
    is no layout at all is the platform's ``cache_layout``'s to refuse)."""
    if isinstance(layout, CacheLayout) and layout.part == "draft":
        raise ConfigError(
            "layout",
            layout.describe(),
            "the rank's whole layout, or with MTP its main part (whole.main())",
            "pass whole.main() as layout and whole.draft() as draft=, both of the rank's build_layout",
        )


def _tp(instance: object, tp: object) -> int | None:
    """The engine's tp: ``tp``, or the one the instance carries (a ``FastDeploySuffix``'s); both given must agree."""
    tp, carried = check_tp(tp), check_tp(getattr(instance, "tp", None))
    if tp is not None and carried is not None and tp != carried:
        raise ConfigError(
            "tp",
            tp,
            f"None or {carried}, the tp the instance carries",
            "give the tp once, on the instance or as tp=, or make the two agree",
        )
    return carried if tp is None else tp


def _instance(wire: WireProtocol, instance: object, tp: int | None, rank: int) -> str:
    """The engine instance's name under ``wire``, checked, with ``tp`` (None: unknown), which must hold ``rank``."""
    if tp is not None:
        check_int(
            "layout.rank",
            rank,
            0,
            tp - 1,
            what=f"a local rank of tp {tp}",
            fix="build the layout for one of the engine's local ranks",
        )
    return wire.instance_name(instance, tp=tp)


def _specs(specs: object) -> tuple[CacheRoleShape, ...] | None:
    """``tensor_specs`` as a tuple of :class:`CacheRoleShape` (checked against the platform's shapes by the call)."""
    if specs is None:
        return None
    if not isinstance(specs, Sequence) or not specs or not all(isinstance(spec, CacheRoleShape) for spec in specs):
        raise ConfigError(
            "tensor_specs",
            specs,
            "None or a non-empty sequence of CacheRoleShape (one layer's tensors)",
            "state each tensor as CacheRoleShape(role, shape, dtype), blocks first, or pass None",
        )
    return tuple(specs)
