"""The drift guard: a plugin that answers ``should_create_cache_tensor`` itself must agree with the rule.

The core's rule (:mod:`fd_platforms.decision`) answers for every platform; a plugin that implements
the hook anyway is compared with it on all of :data:`~fd_platforms.decision.TRUTH_TABLE` when it is
loaded, and refused with every differing case listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .decision import RULE, TRUTH_TABLE, DecisionInputs, decide_cache_creation
from .errors import FdPlatformsError, PlatformDriftError
from .types import CacheDecision

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .platform import Platform

DECISION_HOOK = "should_create_cache_tensor"


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
    """Every truth-table case where ``platform`` answers other than the rule (create and deciding term)."""
    drifts = []
    for inputs in TRUTH_TABLE:
        expected = decide_cache_creation(**inputs.kwargs())
        try:
            got: CacheDecision | FdPlatformsError = platform.should_create_cache_tensor(**inputs.kwargs())
        except FdPlatformsError as exc:
            got = exc
        if not isinstance(got, CacheDecision) or (got.create, got.deciding_term) != (
            expected.create,
            expected.deciding_term,
        ):
            drifts.append(DecisionDrift(inputs, expected, got))
    return drifts


def drift_error(platform: Platform, drifts: list[DecisionDrift]) -> PlatformDriftError:
    """The refusal, listing each differing case."""
    listing = "".join(f"\n  - {drift}" for drift in drifts)
    return PlatformDriftError(
        platform.name,
        platform.distribution,
        f"its {DECISION_HOOK} hook disagrees with the core rule `{RULE}` in {len(drifts)} of "
        f"{len(TRUTH_TABLE)} cases:{listing}\n"
        f"Fix: delete the plugin's {DECISION_HOOK} hook (the core's rule answers for every platform)",
        tuple(drifts),
    )


def refuse_drift(platform: Platform) -> None:
    """Raise :class:`PlatformDriftError` if the platform implements the decision hook and drifts."""
    if DECISION_HOOK not in platform.implemented_hooks():
        return
    drifts = decision_drift(platform)
    if drifts:
        raise drift_error(platform, drifts)
