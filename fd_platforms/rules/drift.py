"""The drift guard: a plugin that answers a rule hook itself must answer as the core's rule.

The core's rules (:mod:`fd_platforms.rules.decision`, :mod:`fd_platforms.rules.planner`) answer for every
platform. A plugin that implements ``should_create_cache_tensor`` anyway is checked twice:

- when it is loaded, against all of :data:`~fd_platforms.rules.decision.TRUTH_TABLE`, and refused with
  every differing case listed (an early, complete report);
- on every call, against the rule on the very inputs of the call (sampling cannot prove a rule:
  a plugin may special-case inputs the table does not hold).

A ``max_num_blocks`` answer is checked on every call against the planner's invariants
(:func:`fd_platforms.rules.planner.plan_violations`). Either drift is a :class:`PlatformDriftError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..contract.errors import FdPlatformsError, PlatformDriftError
from ..contract.types import CacheDecision
from .decision import RULE, TRUTH_TABLE, DecisionInputs, decide_cache_creation


class Platform(Protocol):
    """What the guard needs of a loaded platform (:class:`fd_platforms.loading.platform.Platform`)."""

    @property
    def name(self) -> str: ...

    @property
    def distribution(self) -> str: ...

    def implemented_hooks(self) -> set[str]: ...

    def plugin_decision(self, inputs: DecisionInputs) -> CacheDecision: ...


DECISION_HOOK = "should_create_cache_tensor"
PLAN_HOOK = "max_num_blocks"


@dataclass(frozen=True)
class DecisionDrift:
    """One case where the platform's answer differs from the rule's: inputs, expected, got."""

    inputs: DecisionInputs
    expected: CacheDecision
    got: CacheDecision | FdPlatformsError

    def __str__(self) -> str:
        return f"{self.inputs}: expected {_describe(self.expected)}, got {_describe(self.got)}"


def _describe(answer: CacheDecision | FdPlatformsError) -> str:
    if isinstance(answer, CacheDecision):
        return f"create={answer.create} (term {answer.deciding_term!r})"
    return f"{type(answer).__name__}: {answer}"


def decision_drift(platform: Platform) -> list[DecisionDrift]:
    """Every truth-table case where ``platform``'s hook answers other than the rule (create and deciding term)."""
    drifts = []
    for inputs in TRUTH_TABLE:
        expected = decide_cache_creation(**inputs.kwargs())
        try:
            got: CacheDecision | FdPlatformsError = platform.plugin_decision(inputs)
        except FdPlatformsError as exc:
            got = exc
        if not isinstance(got, CacheDecision) or (got.create, got.deciding_term) != (
            expected.create,
            expected.deciding_term,
        ):
            drifts.append(DecisionDrift(inputs, expected, got))
    return drifts


def drift_error(platform: Platform, drifts: list[DecisionDrift], *, at_call: bool = False) -> PlatformDriftError:
    """The refusal, listing each differing case (of the truth table at load, or the one call's)."""
    listing = "".join(f"\n  - {drift}" for drift in drifts)
    where = "on the inputs of this call" if at_call else f"in {len(drifts)} of {len(TRUTH_TABLE)} cases"
    return PlatformDriftError(
        platform.name,
        platform.distribution,
        f"its {DECISION_HOOK} hook disagrees with the core rule `{RULE}` {where}:{listing}\n"
        f"Fix: delete the plugin's {DECISION_HOOK} hook (the core's rule answers for every platform)",
        tuple(drifts),
    )


def plan_drift_error(platform: Platform, violations: list[str]) -> PlatformDriftError:
    """The refusal of a ``max_num_blocks`` answer that breaks the planner's invariants."""
    listing = "".join(f"\n  - {violation}" for violation in violations)
    return PlatformDriftError(
        platform.name,
        platform.distribution,
        f"its {PLAN_HOOK} answer breaks the planner's invariants:{listing}\n"
        f"Fix: delete the plugin's {PLAN_HOOK} hook (the core's planner answers for every platform; "
        "declare a kernel limit with declared_limits instead)",
        tuple(violations),
    )


def refuse_drift(platform: Platform) -> None:
    """Raise :class:`PlatformDriftError` if the platform implements the decision hook and drifts."""
    if DECISION_HOOK not in platform.implemented_hooks():
        return
    drifts = decision_drift(platform)
    if drifts:
        raise drift_error(platform, drifts)
