"""The drift guard: a plugin that answers a rule hook itself must answer as the core's rule.

The core's rules (:mod:`fd_platforms.rules.decision`, :mod:`fd_platforms.rules.planner`) answer for every
platform. A plugin that implements ``should_create_cache_tensor`` anyway is checked twice:

- when it is loaded, against all of :data:`~fd_platforms.rules.decision.TRUTH_TABLE` under every
  rule version (the engine pins one; the hook is told which), and refused with
  every differing case listed (an early, complete report);
- on every call, against the rule on the very inputs of the call (sampling cannot prove a rule:
  a plugin may special-case inputs the table does not hold).

A ``max_num_blocks`` answer is checked on every call against the planner's invariants
(:func:`fd_platforms.rules.planner.plan_violations`). A ``kv_cache_shapes`` answer is checked on
every call and, at load, over :func:`fd_platforms.rules.shapes.shape_cases`: the bytes of every
role stay the core's (:func:`fd_platforms.rules.shapes.shape_violations`). Any drift is a
:class:`~fd_platforms.contract.errors.PlatformDriftError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from ..contract.errors import FdPlatformsError, PlatformDriftError
from ..contract.types import CacheDecision, CacheShapeRequest
from .decision import DEFAULT_RULE, RULE_VERSIONS, TRUTH_TABLE, DecisionInputs, decide_cache_creation


class Platform(Protocol):
    """What the guard needs of a loaded platform (:class:`fd_platforms.loading.platform.Platform`)."""

    @property
    def name(self) -> str: ...

    @property
    def distribution(self) -> str: ...

    def implemented_hooks(self) -> set[str]: ...

    def plugin_decision(self, inputs: DecisionInputs) -> CacheDecision: ...

    def plugin_shapes(self, request: CacheShapeRequest) -> object: ...


DECISION_HOOK = "should_create_cache_tensor"
PLAN_HOOK = "max_num_blocks"
SHAPES_HOOK = "kv_cache_shapes"


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


def decision_drift(platform: Platform, rule: str = DEFAULT_RULE) -> list[DecisionDrift]:
    """Every truth-table case where ``platform``'s hook answers other than rule version ``rule``
    (create and deciding term)."""
    drifts = []
    for table_case in TRUTH_TABLE:
        inputs = replace(table_case, rule=rule)
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
    where = "on the inputs of this call" if at_call else f"in {len(drifts)} of {len(TRUTH_TABLE)} cases"
    version = RULE_VERSIONS[drifts[0].inputs.rule]
    return _refusal(
        platform,
        f"its {DECISION_HOOK} hook disagrees with the core rule `{version.text}` (version {version.name}) {where}",
        drifts,
        f"delete the plugin's {DECISION_HOOK} hook (the core's rule answers for every platform, in the "
        "version the engine pins)",
    )


def plan_drift_error(platform: Platform, violations: list[str]) -> PlatformDriftError:
    """The refusal of a ``max_num_blocks`` answer that breaks the planner's invariants."""
    return _refusal(
        platform,
        f"its {PLAN_HOOK} answer breaks the planner's invariants",
        violations,
        f"delete the plugin's {PLAN_HOOK} hook (the core's planner answers for every platform; "
        "declare a kernel limit with declared_limits instead)",
    )


def shape_drift_error(platform: Platform, violations: list[str], *, at_call: bool = False) -> PlatformDriftError:
    """The refusal of ``kv_cache_shapes`` answers whose roles or bytes are not the core's."""
    from .shapes import shape_cases

    where = (
        "for this call" if at_call else f"in the load-time cases ({len(shape_cases())} layer kinds and quantizations)"
    )
    return _refusal(
        platform,
        f"its {SHAPES_HOOK} answer changes what the core counts {where}",
        violations,
        "answer the roles of request.default, in order, each with the block axis first and the same bytes "
        "(reorder the other axes or pick a dtype of the same size; never change the count)",
    )


def _refusal(platform: Platform, what: str, found: Sequence[object], fix: str) -> PlatformDriftError:
    """The refusal saying ``what`` the hook did, each of ``found`` on a line of its own, then the fix."""
    listing = "".join(f"\n  - {item}" for item in found)
    return PlatformDriftError(platform.name, platform.distribution, f"{what}:{listing}\nFix: {fix}", tuple(found))


def shapes_drift(platform: Platform) -> list[str]:
    """Every violation of ``platform``'s shapes over the load-time cases."""
    from .shapes import shape_cases, shape_violations  # lazily: only plugins that shape load the layout rules

    found: list[str] = []
    for request in shape_cases():
        try:
            answer = platform.plugin_shapes(request)
        except FdPlatformsError as exc:
            found.append(f"{request.attention} layer, quant {request.quant_type}: {type(exc).__name__}: {exc}")
            continue
        found.extend(shape_violations(request, answer))
    return found


def refuse_drift(platform: Platform, *, rules: Sequence[str] | None = None) -> None:
    """Raise :class:`~fd_platforms.contract.errors.PlatformDriftError` if the platform implements a rule hook checked at
    load (the decision, the shapes) and drifts. ``rules``: only the decision, under these versions (one an engine
    registered after the platform was loaded)."""
    implemented = platform.implemented_hooks()
    if DECISION_HOOK in implemented:
        for rule in RULE_VERSIONS if rules is None else rules:  # the default first; the engine may pin any of them
            drifts = decision_drift(platform, rule)
            if drifts:
                raise drift_error(platform, drifts)
    if SHAPES_HOOK in implemented and rules is None:
        violations = shapes_drift(platform)
        if violations:
            raise shape_drift_error(platform, violations)
