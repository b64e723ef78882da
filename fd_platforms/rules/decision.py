"""The one rule that decides whether a worker creates its KV cache or attaches to a cache manager's,
in every version an engine may pin.

``create = profile or not (num_cpu_blocks > 0 or storage_backend or splitwise_role != "mixed")``

is the default version, ``2026-01``. FastDeploy changed its rule on 2026-04-29 (PR #7471) to
``profile or not (storage_backend or splitwise_role != "mixed")``: version ``2026-04``. A version is
one :class:`RuleVersion` entry in :data:`RULE_VERSIONS` (the terms that make a worker attach, in
order); a third is one more entry. The engine pins the version (``rule`` in the deployment,
``--rule``); platforms never choose it. Left unpinned (None) it is :data:`DEFAULT_RULE`, except where
the engine's protocol cannot tell which version its peers follow (beside FastDeploy, in the cases
where the versions disagree: :func:`decisions_by_version`), which refuses instead. Every platform answers
``should_create_cache_tensor`` through :func:`decide_cache_creation`, and a plugin that implements the hook itself is
held to :data:`TRUTH_TABLE` under every version (:mod:`fd_platforms.rules.drift`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from ..contract.errors import ConfigError
from ..contract.integers import check_int
from ..contract.types import CacheDecision

STORAGE_BACKENDS = ("mooncake", "attention_store", "file")
SPLITWISE_ROLES = ("mixed", "prefill", "decode")

AttachTerm = Literal["num_cpu_blocks", "storage_backend", "splitwise_role"]
_TERM_TEXT: dict[str, str] = {
    "num_cpu_blocks": "num_cpu_blocks > 0",
    "storage_backend": "storage_backend",
    "splitwise_role": 'splitwise_role != "mixed"',
}


@dataclass(frozen=True)
class RuleVersion:
    """One version of the rule: a profiling run creates; else the first of ``attach_terms`` that
    holds makes the worker attach; else it creates."""

    name: str
    attach_terms: tuple[AttachTerm, ...]
    origin: str
    fastdeploy: str
    """Which FastDeploy's processes follow it, in words."""

    @property
    def text(self) -> str:
        """The rule as a formula."""
        return f"profile or not ({' or '.join(_TERM_TEXT[term] for term in self.attach_terms)})"


RULE_VERSIONS: dict[str, RuleVersion] = {
    version.name: version
    for version in (
        RuleVersion(
            "2026-01",
            ("num_cpu_blocks", "storage_backend", "splitwise_role"),
            "the design's rule: FastDeploy's from January 2026, when host swap space made the cache manager own it",
            "FastDeploy before 2026-04-29",
        ),
        RuleVersion(
            "2026-04",
            ("storage_backend", "splitwise_role"),
            "FastDeploy's since 2026-04-29 (PR #7471): swap space no longer decides; with it on, the worker "
            "creates and the cache transfer manager attaches",
            "FastDeploy from PR #7471 (2026-04-29) on",
        ),
    )
}
DEFAULT_RULE = "2026-01"
RULE = RULE_VERSIONS[DEFAULT_RULE].text
"""The default version's formula."""


def check_rule(rule: object, field: str = "rule") -> RuleVersion:
    """The version named ``rule``; a ConfigError naming ``field`` and the versions otherwise."""
    if not isinstance(rule, str) or rule not in RULE_VERSIONS:
        raise ConfigError(
            field,
            rule,
            f"one of {', '.join(RULE_VERSIONS)} (fd-platforms rules shows each and where they differ)",
            f"pin a listed rule version, or leave it unset for {DEFAULT_RULE} (beside FastDeploy only where the "
            "versions agree)",
        )
    return RULE_VERSIONS[rule]


def check_pin(rule: object, field: str = "rule") -> None:
    """``rule`` as a caller may give it: None (not pinned) or a listed version."""
    if rule is not None:
        check_rule(rule, field)


def check_decision_inputs(profile: object, num_cpu_blocks: object, storage_backend: object, role: object) -> None:
    """The rule's inputs as the caller gave them; a ConfigError naming the first bad one."""
    if not isinstance(profile, bool):
        raise ConfigError("profile", profile, "True or False", "pass a bool")
    check_int("num_cpu_blocks", num_cpu_blocks, 0, fix="pass 0 to turn host swap space off")
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
    """The four inputs of the rule and the pinned version, validated on construction (a ConfigError
    naming the field)."""

    profile: bool
    num_cpu_blocks: int
    storage_backend: str | None
    splitwise_role: str
    rule: str = DEFAULT_RULE

    def __post_init__(self) -> None:
        check_decision_inputs(self.profile, self.num_cpu_blocks, self.storage_backend, self.splitwise_role)
        check_rule(self.rule)

    def kwargs(self) -> dict[str, Any]:
        """The inputs as the keyword arguments of the rule and of the hook."""
        return asdict(self)

    def __str__(self) -> str:
        """The four inputs (reports name the rule version once, above the cases)."""
        return ", ".join(f"{key}={value!r}" for key, value in self.kwargs().items() if key != "rule")


TRUTH_TABLE = tuple(
    DecisionInputs(profile, num_cpu_blocks, backend, role)
    for profile in (False, True)
    for num_cpu_blocks in (0, 64)
    for backend in (None, *STORAGE_BACKENDS)
    for role in SPLITWISE_ROLES
)
"""Every profile, role and storage backend, with and without swap space: the cases a plugin's
decision hook is checked on when it is loaded, under every rule version (on every call it is
checked on the call's own inputs)."""


def decisions_by_version(inputs: DecisionInputs, *rules: str) -> dict[str, CacheDecision] | None:
    """Where the rule versions ``rules`` (default: every one) do not all decide alike (create or not)
    on ``inputs`` (their own ``rule`` aside): every version's decision; None where they agree."""
    answers = {rule: decide_cache_creation(**{**inputs.kwargs(), "rule": rule}) for rule in rules or RULE_VERSIONS}
    return answers if len({answer.create for answer in answers.values()}) > 1 else None


def differing_cases(*rules: str) -> list[tuple[DecisionInputs, dict[str, CacheDecision]]]:
    """The truth-table cases where the rule versions ``rules`` (default: every one) do not all decide
    alike (create or not), each with every version's decision."""
    return [(inputs, answers) for inputs in TRUTH_TABLE if (answers := decisions_by_version(inputs, *rules))]


def decide_cache_creation(
    *, profile: bool, num_cpu_blocks: int, storage_backend: str | None, splitwise_role: str, rule: str = DEFAULT_RULE
) -> CacheDecision:
    """Apply rule version ``rule``; the record names the term that decided and why, in words."""
    check_decision_inputs(profile, num_cpu_blocks, storage_backend, splitwise_role)
    version = check_rule(rule)
    if profile:
        return CacheDecision(True, "profile", "profiling run: it always creates its own temporary cache")
    reasons = {
        "num_cpu_blocks": (
            num_cpu_blocks > 0,
            f"host swap space is on ({num_cpu_blocks} CPU blocks): the cache-transfer process owns the cache",
        ),
        "storage_backend": (
            bool(storage_backend),
            f"storage backend {storage_backend!r} is on: the cache-manager process owns the cache",
        ),
        "splitwise_role": (
            splitwise_role != "mixed",
            f"disaggregated role {splitwise_role!r}: the cache-manager process owns the cache",
        ),
    }
    for term in version.attach_terms:
        holds, reason = reasons[term]
        if holds:
            return CacheDecision(False, term, reason)
    unused = (
        ""
        if "num_cpu_blocks" in version.attach_terms or not num_cpu_blocks
        else (f" (rule {version.name}: host swap space does not decide; the cache manager attaches to it)")
    )
    return CacheDecision(
        True,
        "none",
        f"mixed role without {' or '.join(_NONE_TEXT[t] for t in version.attach_terms[:-1])}: "
        f"the worker creates the cache{unused}",
    )


_NONE_TEXT = {"num_cpu_blocks": "swap space", "storage_backend": "storage backend", "splitwise_role": "role"}


def decided_by(decision: CacheDecision) -> str:
    """What decided, in words for a table: ``profile``, ``num_cpu_blocks``, ... or, where no term
    holds, ``rule: no cache manager needed`` (the worker creates its cache)."""
    return "rule: no cache manager needed" if decision.deciding_term == "none" else decision.deciding_term
