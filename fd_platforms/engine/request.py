"""One rank's cache request: what :func:`~.initialize.initialize_kv_cache` and :func:`~.initialize.manage_kv_cache`
need beside the platform, in one record validated when it is made.

:class:`CacheRequest` holds the rank's layout and blocks, the rule's inputs and pin, the engine instance and its
protocol, the wait (timeout, the creator's pid), the engine's tensor specs, and for a cache manager the MTP draft
part and a kept host cache. A bad field is a ConfigError naming it, when the record is made, before any call or
hook. What needs the platform (the specs against its shapes, whether it can share) is checked by the call.

:meth:`CacheRequest.from_keywords` builds one from the engine calls' keywords as they were before 0.2 (the old
names of the engine instance and the creator warn: :func:`creator_of`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..contract.errors import ConfigError
from ..contract.integers import check_int
from ..contract.renamed import renamed_warning
from ..contract.types import CacheRoleShape
from ..ipc.cache_signal import resolve_timeout
from ..ipc.process_watch import PID_MAX_LIMIT
from ..ipc.shared_words import check_tp
from ..rules.decision import DecisionInputs
from ..rules.layout import CacheLayout, check_layout, check_num_blocks
from .host_cache import HostCache
from .protocols import OURS, WireProtocol, protocol_named

#: What the engine calls' old keywords for the engine instance named, for the refusal of one its protocol never took.
_OLD_KEYWORDS = {
    "signal_name": "our cache-ready signal",
    "suffix": "FastDeploy's signal suffix, with protocol='fastdeploy'",
}


@dataclass(frozen=True, kw_only=True)
class CacheRequest:
    """One rank's KV cache as an engine asks for it; every field checked when the record is made (ConfigError).

    ``layout`` and ``num_blocks`` the rank's layout (with MTP: ``whole.main()``, or a proposer's ``whole.draft()``)
    and blocks; ``profile``, ``num_cpu_blocks``, ``storage_backend``, ``splitwise_role`` the rule's inputs and
    ``rule`` its pinned version (None: the protocol's :meth:`~.protocols.WireProtocol.rule_in_force`); ``instance``
    the engine instance (our cache-ready signal's name, or FastDeploy's signal suffix) under ``protocol`` (a
    registered name or the object; held as the object); ``tp`` the local ranks where known; ``creator_pid`` the
    process that creates the cache (its death ends a wait) and ``timeout`` the wait's bound (None:
    ``FD_CACHE_READY_TIMEOUT``); ``tensor_specs`` one layer's tensors as the engine's attention backend states them
    (None: the platform's shapes). A cache manager's only: ``draft`` (the MTP draft part, with ``layout`` the main
    part) and ``host_cache`` (the one a cleared :class:`~.initialize.ManagedCache` kept).
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
    tp: int | None = None
    creator_pid: int | None = None
    timeout: float | None = None
    tensor_specs: tuple[CacheRoleShape, ...] | None = None
    draft: CacheLayout | None = None
    host_cache: HostCache | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_layout(self.layout)
        check_num_blocks(self.num_blocks)
        try:
            inputs = self.inputs()  # the rule's inputs (a ConfigError naming the field)
        except ConfigError as error:  # the rule names the backend as FastDeploy's config does; here it is ours
            if error.field != "kvcache_storage_backend":
                raise
            raise ConfigError("storage_backend", error.value, error.allowed, error.fix) from None
        wire = protocol_named(self.protocol)
        object.__setattr__(self, "protocol", wire)
        object.__setattr__(self, "instance", _instance(wire, self.instance, self.tp, self.layout.rank))
        wire.rule_in_force(self.rule, inputs)  # the pin, or a ConfigError where the protocol needs one
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

    def inputs(self) -> DecisionInputs:
        """The rule's inputs (its version aside: :meth:`rule_in_force`)."""
        return DecisionInputs(self.profile, self.num_cpu_blocks, self.storage_backend, self.splitwise_role)

    def rule_in_force(self) -> DecisionInputs:
        """The rule's inputs with the version the processes follow (the pin, or the protocol's default)."""
        inputs = self.inputs()
        return replace(inputs, rule=protocol_named(self.protocol).rule_in_force(self.rule, inputs))

    @classmethod
    def from_keywords(
        cls,
        call: str,
        layout: object,
        num_blocks: object,
        keywords: Mapping[str, Any],
        *,
        required: Sequence[str] = (),
        defaults: Mapping[str, Any] | None = None,
        stacklevel: int = 3,
    ) -> CacheRequest:
        """The record from an engine call's keywords as they were before 0.2 (``call`` names the call in a
        TypeError, as Python's would: an unknown keyword, a ``required`` one missing); ``signal_name=``, ``suffix=``
        and ``setter_pid=`` taken with a DeprecationWarning ``stacklevel`` frames up (the engine call's caller)."""
        given = dict(keywords)
        unknown = sorted(set(given) - set(KEYWORDS))
        if unknown:
            raise TypeError(f"{call}() got an unexpected keyword argument {unknown[0]!r}")
        missing = [name for name in required if name not in given]
        if missing:
            raise TypeError(
                f"{call}() missing required keyword-only argument{'s' * (len(missing) > 1)}: "
                + ", ".join(repr(name) for name in missing)
            )
        given = {**(defaults or {}), **given}
        layout, num_blocks = check_layout(layout), check_num_blocks(num_blocks)
        # the engine instance: instance=, or one of the keywords that named it before 0.2 (signal_name=, suffix=: a
        # DeprecationWarning where the protocol took it, else a ConfigError)
        wire = protocol_named(given.pop("protocol", OURS))
        names = [(key, given.pop(key, None)) for key in ("instance", "signal_name", "suffix")]
        named = {key: value for key, value in names if value is not None}
        instance, old = named.get("instance"), [key for key in named if key != "instance"]
        if len(named) > 1:
            extra = list(named)[1]
            raise ConfigError(
                extra,
                named[extra],
                "one name for the engine instance: instance= alone",
                f"drop {extra}= (instance= is its name now)",
            )
        if old:
            if old[0] not in wire.old_keywords:
                raise ConfigError(
                    old[0],
                    named[old[0]],
                    f"only as {_OLD_KEYWORDS[old[0]]} (deprecated), not under protocol={wire.name!r}",
                    "pass the engine instance as instance=",
                )
            renamed_warning(old[0], "instance", stacklevel=stacklevel, note=" (the engine instance's name)")
            instance = named[old[0]]
        instance = _instance(wire, instance, given.get("tp"), layout.rank)
        creator_pid = creator_of(given.pop("creator_pid", None), given.pop("setter_pid", None), stacklevel + 1)
        return cls(
            layout=layout, num_blocks=num_blocks, instance=instance, protocol=wire, creator_pid=creator_pid, **given
        )


#: The engine calls' keywords before 0.2: the record's fields and the old names of two of them.
KEYWORDS = {*CacheRequest.__dataclass_fields__, *_OLD_KEYWORDS, "setter_pid"} - {"layout", "num_blocks"}


def check_not_draft(layout: CacheLayout) -> None:
    """A cache manager's ``layout`` is the rank's whole layout or its main part; its draft part goes in ``draft=``."""
    if layout.part == "draft":
        raise ConfigError(
            "layout",
            layout.describe(),
            "the rank's whole layout, or with MTP its main part (whole.main())",
            "pass whole.main() as layout and whole.draft() as draft=, both of the rank's build_layout",
        )


def _instance(wire: WireProtocol, instance: object, tp: object, rank: int) -> str:
    """The engine instance's name under ``wire``, checked, with ``tp`` (None: unknown), which must hold ``rank``."""
    tp = check_tp(tp)
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


def creator_of(creator_pid: int | None, setter_pid: int | None, stacklevel: int = 3) -> int | None:
    """The engine call's ``creator_pid=``, or its old name ``setter_pid=`` with a DeprecationWarning ``stacklevel``
    frames up (at the engine call's caller); both: a ConfigError."""
    if setter_pid is None:
        return creator_pid
    if creator_pid is not None:
        raise ConfigError("setter_pid", setter_pid, "not with creator_pid= (its name since 0.2)", "drop setter_pid=")
    renamed_warning(
        "setter_pid", "creator_pid", stacklevel=stacklevel, note=" (the pid of the process that creates the cache)"
    )
    return setter_pid
