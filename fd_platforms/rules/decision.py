"""The one rule that decides whether a worker creates its KV cache or attaches to a cache manager's.

``create = profile or not (num_cpu_blocks > 0 or storage_backend or splitwise_role != "mixed")``

It lives here only; every platform answers ``should_create_cache_tensor`` through it, and a
plugin that implements the hook itself is held to :data:`TRUTH_TABLE` (:mod:`fd_platforms.rules.drift`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..contract.errors import ConfigError
from ..contract.types import CacheDecision

STORAGE_BACKENDS = ("mooncake", "attention_store", "file")
SPLITWISE_ROLES = ("mixed", "prefill", "decode")
RULE = 'profile or not (num_cpu_blocks > 0 or storage_backend or splitwise_role != "mixed")'


MAX_CPU_BLOCKS = 2**63 - 1  # an int64 count; anything larger is no real host's swap space


def check_decision_inputs(profile: object, num_cpu_blocks: object, storage_backend: object, role: object) -> None:
    """The rule's inputs as the caller gave them; a ConfigError naming the first bad one."""
    if not isinstance(profile, bool):
        raise ConfigError("profile", profile, "True or False", "pass a bool")
    if isinstance(num_cpu_blocks, bool) or not isinstance(num_cpu_blocks, int) or not 0 <= num_cpu_blocks <= MAX_CPU_BLOCKS:
        raise ConfigError(
            "num_cpu_blocks", num_cpu_blocks, f"an int from 0 to {MAX_CPU_BLOCKS}", "pass 0 to turn host swap space off"
        )
    if storage_backend is not None and storage_backend not in STORAGE_BACKENDS:
        raise ConfigError(
            "kvcache_storage_backend",
            storage_backend,
            f"None or one of {', '.join(STORAGE_BACKENDS)}",
            "pick a listed backend or leave it unset",
        )
    if role not in SPLITWISE_ROLES:
        raise ConfigError(
            "splitwise_role", role, f"one of {', '.join(SPLITWISE_ROLES)}", "use 'mixed' for a single instance"
        )


@dataclass(frozen=True)
class DecisionInputs:
    """The four inputs of the rule, validated on construction (a ConfigError naming the field)."""

    profile: bool
    num_cpu_blocks: int
    storage_backend: str | None
    splitwise_role: str

    def __post_init__(self) -> None:
        check_decision_inputs(self.profile, self.num_cpu_blocks, self.storage_backend, self.splitwise_role)

    def kwargs(self) -> dict[str, Any]:
        """The inputs as the keyword arguments of the rule and of the hook."""
        return asdict(self)

    def __str__(self) -> str:
        return ", ".join(f"{key}={value!r}" for key, value in self.kwargs().items())


TRUTH_TABLE = tuple(
    DecisionInputs(profile, num_cpu_blocks, backend, role)
    for profile in (False, True)
    for num_cpu_blocks in (0, 64)
    for backend in (None, *STORAGE_BACKENDS)
    for role in SPLITWISE_ROLES
)
"""Every profile, role and storage backend, with and without swap space: the cases a plugin's
decision hook is checked on when it is loaded (on every call it is checked on the call's own inputs)."""


def decide_cache_creation(
    *, profile: bool, num_cpu_blocks: int, storage_backend: str | None, splitwise_role: str
) -> CacheDecision:
    """Apply the rule; the record names the term that decided and why, in words."""
    check_decision_inputs(profile, num_cpu_blocks, storage_backend, splitwise_role)
    create = profile or not (num_cpu_blocks > 0 or bool(storage_backend) or splitwise_role != "mixed")
    if profile:
        return CacheDecision(create, "profile", "profiling run: it always creates its own temporary cache")
    if num_cpu_blocks > 0:
        return CacheDecision(
            create,
            "num_cpu_blocks",
            f"host swap space is on ({num_cpu_blocks} CPU blocks): the cache-transfer process owns the cache",
        )
    if storage_backend:
        return CacheDecision(
            create,
            "storage_backend",
            f"storage backend {storage_backend!r} is on: the cache-manager process owns the cache",
        )
    if splitwise_role != "mixed":
        return CacheDecision(
            create,
            "splitwise_role",
            f"disaggregated role {splitwise_role!r}: the cache-manager process owns the cache",
        )
    return CacheDecision(
        create, "none", "mixed role without swap space or storage backend: the worker creates the cache"
    )


def decided_by(decision: CacheDecision) -> str:
    """What decided, in words for a table: ``profile``, ``num_cpu_blocks``, ... or, where no term
    holds, ``rule: no cache manager needed`` (the worker creates its cache)."""
    return "rule: no cache manager needed" if decision.deciding_term == "none" else decision.deciding_term
