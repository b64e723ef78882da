"""The one rule that decides whether a worker creates its KV cache or attaches to a cache manager's,
in every version an engine may pin.

``create = profile or not (num_cpu_blocks > 0 or storage_backend or splitwise_role != "mixed")``

is the default version, ``2026-01``. FastDeploy changed its rule on 2026-04-29 (PR #7471) to
``profile or not (storage_backend or splitwise_role != "mixed")`` (``2026-04``) and on 2026-06-15 (PR #8046,
cherry-picked to release/2.6 as #8045) to ``profile or not (splitwise_role != "mixed")`` (``2026-06``). A version
is data, one :class:`RuleVersion`: the terms that make a worker attach, in order, and the terms that start the
cache transfer manager beside it (:mod:`.roles` derives from both who creates a rank's cache and who attaches to
it). The built-in versions are :data:`BUILTIN_VERSIONS`; an engine adds its own with :func:`register_rule_version`
(validated, refused on a name clash, then held to the drift guard like the others). :data:`RULE_VERSIONS` holds
every version this process knows. The engine pins the version (``rule`` in the deployment, ``--rule``); platforms
never choose it. Left unpinned (None) it is :data:`DEFAULT_RULE`, except where the engine's protocol cannot tell
which version its peers follow (beside FastDeploy, in the cases where the versions disagree:
:func:`decisions_by_version`), which refuses instead. Every platform answers ``should_create_cache_tensor``
through :func:`decide_cache_creation`, and a plugin that implements the hook itself is held to :data:`TRUTH_TABLE`
under every version (:mod:`fd_platforms.rules.drift`).
"""

from __future__ import annotations

import re
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


#: Every term a version may name as one that makes a worker attach.
TERMS: tuple[AttachTerm, ...] = ("num_cpu_blocks", "storage_backend", "splitwise_role")
TRANSFER_TERMS: tuple[AttachTerm, ...] = ("num_cpu_blocks", "storage_backend")
"""What starts FastDeploy's cache transfer manager, one per rank, under every version so far: host swap space or a
storage backend (``cache_manager/prefix_cache_manager.py`` ``launch_cache_manager``, develop c1b7c083 ~L297-304:
``num_cpu_blocks > 0 or kvcache_storage_backend``)."""


@dataclass(frozen=True)
class RuleVersion:
    """One version of the rule: a profiling run creates; else the first of ``attach_terms`` that
    holds makes the worker attach; else it creates. Where one of ``transfer_terms`` holds, a cache transfer
    manager runs beside each worker: it creates the rank's cache where the worker attaches in a mixed instance,
    and attaches to the creator's otherwise (:func:`~.roles.cache_roles`)."""

    name: str
    attach_terms: tuple[AttachTerm, ...]
    origin: str
    fastdeploy: str
    """Which FastDeploy's processes follow it, in words."""
    transfer_terms: tuple[AttachTerm, ...] = TRANSFER_TERMS
    """The terms that start a cache transfer manager beside each worker."""

    @property
    def text(self) -> str:
        """The rule as a formula."""
        return f"profile or not ({' or '.join(_TERM_TEXT[term] for term in self.attach_terms)})"


#: The versions fd-platforms ships: ``2026-01`` (the default), ``2026-04`` and ``2026-06``.
BUILTIN_VERSIONS: tuple[RuleVersion, ...] = (
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
        "FastDeploy from PR #7471 (2026-04-29) to PR #8046",
    ),
    RuleVersion(
        "2026-06",
        ("splitwise_role",),
        "FastDeploy's since 2026-06-15 (PR #8046, release/2.6 #8045): a mixed instance's worker always creates; "
        "with swap space or a storage backend the cache transfer manager attaches",
        "FastDeploy from PR #8046 (2026-06-15) on",
    ),
)
RULE_VERSIONS: dict[str, RuleVersion] = {version.name: version for version in BUILTIN_VERSIONS}
"""Every version this process knows: the built-in ones, then those an engine registered."""
DEFAULT_RULE = "2026-01"  #: the version in force where the engine pins none (and its protocol can tell)
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


_VERSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")


def register_rule_version(
    name: object,
    attach_terms: object,
    *,
    origin: object,
    transfer_terms: object = TRANSFER_TERMS,
    fastdeploy: str = "none of FastDeploy's releases: the engine registered it",
) -> RuleVersion:
    """Add the engine's own rule version to this process's :data:`~fd_platforms.rules.decision.RULE_VERSIONS` and return
    it: ``name`` (letters, digits, ``.``, ``_``, ``-``; no version's name yet), ``attach_terms`` (distinct terms of
    :data:`~fd_platforms.rules.decision.TERMS`, in the order they decide, ``splitwise_role`` among them),
    ``transfer_terms`` (distinct terms of :data:`~fd_platforms.rules.decision.TRANSFER_TERMS`) and ``origin`` (where
    it comes from, in words). A ConfigError names the argument otherwise. A platform's own decision hook is held to it
    as to the built-in ones (:mod:`.drift`), at the first decision pinned to it."""
    if not isinstance(name, str) or not _VERSION_NAME.fullmatch(name):
        raise ConfigError(
            "name",
            name,
            "1-40 letters, digits, '.', '_' or '-', starting with a letter or digit",
            "name it e.g. 2026-09",
        )
    if name in RULE_VERSIONS:
        raise ConfigError(
            "name",
            name,
            f"a name no version has ({', '.join(RULE_VERSIONS)} are taken)",
            "name the engine's version otherwise; a built-in version is pinned by its name, never registered again",
        )
    terms = _terms("attach_terms", attach_terms, TERMS, empty=False)
    if "splitwise_role" not in terms:
        raise ConfigError(
            "attach_terms",
            attach_terms,
            "terms that include splitwise_role: in P/D the cache messager creates the rank's cache under every "
            "version, so a worker that created there too would allocate it twice",
            f"add it: {(*terms, 'splitwise_role')!r}",
        )
    version = RuleVersion(
        name,
        terms,
        _text("origin", origin),
        fastdeploy,
        _terms("transfer_terms", transfer_terms, TRANSFER_TERMS, empty=True),
    )
    RULE_VERSIONS[name] = version
    return version


def _terms(field: str, given: object, allowed: tuple[AttachTerm, ...], *, empty: bool) -> tuple[AttachTerm, ...]:
    """``given`` as distinct terms of ``allowed`` (a tuple or list; ``empty``: none allowed); a ConfigError naming
    ``field``."""
    terms = tuple(given) if isinstance(given, (tuple, list)) and all(isinstance(t, str) for t in given) else None
    if terms is None or len(set(terms)) != len(terms) or not set(terms) <= set(allowed) or (not terms and not empty):
        raise ConfigError(
            field,
            given,
            f"a tuple of distinct terms of {', '.join(allowed)}{'' if empty else ', at least one'}",
            f"pass e.g. {allowed[-1:]!r}",
        )
    return terms


def _text(field: str, given: object) -> str:
    if not isinstance(given, str) or not given.strip():
        raise ConfigError(field, given, "a sentence saying where the version comes from", "pass origin='...'")
    return given


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

    def holds(self, *terms: AttachTerm) -> bool:
        """Whether any of the rule's ``terms`` holds on these inputs (:func:`term_holds`)."""
        return any(term_holds(term, self.num_cpu_blocks, self.storage_backend, self.splitwise_role) for term in terms)

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
        "num_cpu_blocks": f"host swap space is on ({num_cpu_blocks} CPU blocks): the cache-transfer process owns the "
        "cache",
        "storage_backend": f"storage backend {storage_backend!r} is on: the cache-manager process owns the cache",
        "splitwise_role": f"disaggregated role {splitwise_role!r}: the cache-manager process owns the cache",
    }
    on = [term for term in TERMS if term_holds(term, num_cpu_blocks, storage_backend, splitwise_role)]
    for term in version.attach_terms:
        if term in on:
            return CacheDecision(False, term, reasons[term])
    unused = [term for term in _UNUSED_TEXT if term in on and term not in version.attach_terms]
    note = (
        f" (rule {version.name}: {' and '.join(_UNUSED_TEXT[term] for term in unused)} "
        f"{'do' if len(unused) > 1 else 'does'} not decide; the cache transfer manager attaches to it)"
        if unused
        else ""
    )
    return CacheDecision(
        True,
        "none",
        f"{', '.join(_NONE_TEXT[term] for term in version.attach_terms)}: the worker creates the cache{note}",
    )


_NONE_TEXT = {
    "num_cpu_blocks": "no swap space",
    "storage_backend": "no storage backend",
    "splitwise_role": "mixed role",
}
_UNUSED_TEXT = {"num_cpu_blocks": "host swap space", "storage_backend": "the storage backend"}


def term_holds(term: AttachTerm, num_cpu_blocks: int, storage_backend: str | None, splitwise_role: str) -> bool:
    """Whether the rule's ``term`` holds: host swap space, a storage backend, or a split (P/D) role."""
    if term == "num_cpu_blocks":
        return num_cpu_blocks > 0
    if term == "storage_backend":
        return bool(storage_backend)
    return splitwise_role != "mixed"


def decided_by(decision: CacheDecision) -> str:
    """What decided, in words for a table: ``profile``, ``num_cpu_blocks``, ... or, where no term
    holds, ``rule: no cache manager needed`` (the worker creates its cache)."""
    return "rule: no cache manager needed" if decision.deciding_term == "none" else decision.deciding_term
